"""Checkpoints: safetensors files written atomically, in one file from one process or one shard per rank from a
mesh, read back by any layout.

    store.py     the single-file format: ``<dir>/step_<step>/model_optim.safetensors`` (NumPy only)
    sharded.py   the sharded format: a shard per rank and an index; consolidated into the 1-process arrays
    reader.py    load(path) / read_meta(path), whatever the format
    manager.py   CheckpointManager: when a rank saves, what, how a trial resumes, which weights it starts from
    hf.py        Hugging Face checkpoints in and out (``checkpoint.load_weights=hf:<dir>``; export-hf)
    __main__.py  ``python -m core.ckpt consolidate SRC DST`` (also ``python -m core.sharded_checkpoint``) and
                 ``python -m core.ckpt export-hf SRC DST``

Names are imported on first use (``lazy_loader``): only the manager loads MindSpore.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "manager": ["CheckpointManager"],
        "reader": ["load", "read_meta"],
        "sharded": ["consolidate", "is_sharded", "publish", "write_shard"],
        "store": [
            "FILENAME",
            "CheckpointError",
            "latest_checkpoint",
            "list_checkpoints",
            "save_checkpoint",
            "step_dir_name",
        ],
    },
)
