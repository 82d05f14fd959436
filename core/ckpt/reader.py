"""Reading any checkpoint this project wrote, whatever its format: a single file (``core.ckpt.store``) or one shard
per rank (``core.ckpt.sharded``, read back as the full arrays of the 1-process layout). NumPy only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.ckpt import sharded, store


def load(path: str | Path, verify: bool = True) -> tuple[dict[str, np.ndarray], dict]:
    """(full tensors of the 1-process layout, meta) from a step directory (or its single file); ``verify``
    checks the CRCs."""
    if sharded.is_sharded(path):
        return sharded.consolidate(path, verify=verify)
    return store.load_file(path, verify=verify)


def read_meta(path: str | Path) -> dict:
    """Only the metadata (the header or the sharded index, not the tensors)."""
    if sharded.is_sharded(path):
        return sharded.read_index(path)["meta"]
    return store.read_file_meta(path)
