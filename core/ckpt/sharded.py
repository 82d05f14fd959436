"""Checkpoints of mesh-parallel runs: every rank writes its own shards, one index ties them together, and any
checkpoint can be read back as the 1-process ("full") layout, from which any other layout cuts its shards.

    <dir>/step_<step:08d>/index.json                  layout, files, metadata (step, data position, config)
    <dir>/step_<step:08d>/rank_<r:05d>.safetensors    rank r's tensors, their ``Placement`` in the header

Only one replica writes (the ranks whose ``dp_replicate`` coordinate is 0: replicas hold identical shards).
Atomicity: the ranks write into ``.tmp-step_<step:08d>-sharded`` (each file through a temporary name and a
rename), meet at a barrier, and rank 0 writes the index and renames the directory into place; until that rename
``latest_checkpoint`` does not see the step.

Moving a run between layouts: ``core.ckpt.load`` consolidates a sharded checkpoint into full arrays, and the
checkpoint manager cuts this rank's shards with ``Placement.shard``; ``python -m core.sharded_checkpoint
consolidate SRC DST`` writes the full checkpoint of the 1-process layout to disk. Consolidating reads every shard
into memory, which is fine at the sizes this project trains; a production reader would read only the slices a
rank needs (safetensors supports that).

NumPy only, like ``core.ckpt.store``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from core.ckpt import store as ck
from core.parallel.placement import Placement, replicated
from core.runtime.files import atomic_path, fsync_dir

INDEX = "index.json"
SCHEMA = "msar-sharded-checkpoint/1"
_PLACEMENTS_KEY = "msar.placements"


def shard_file(rank: int) -> str:
    return f"rank_{rank:05d}.safetensors"


def staging_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{ck.TMP_PREFIX}{ck.step_dir_name(step)}-sharded"


def write_shard(
    root: str | Path, step: int, rank: int, tensors: dict[str, np.ndarray], placements: dict[str, Placement]
) -> Path:
    """Write this rank's tensors into the step's staging directory (every writing rank calls this)."""
    stage = staging_dir(root, step)
    stage.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.asarray(v, order="C") for k, v in tensors.items()}
    header = {
        _PLACEMENTS_KEY: json.dumps({k: placements[k].to_json() for k in arrays}),
        ck.CRC_KEY: str(ck.crc(arrays)),
    }
    final = stage / shard_file(rank)
    with atomic_path(final) as tmp:
        save_file(arrays, str(tmp), metadata=header)
    return final


def publish(root: str | Path, step: int, writers: list[int], meta: dict, *, keep: int | None = None) -> Path:
    """Rank 0, after every writer's ``write_shard`` (a barrier): write the index and move the step into place."""
    root = Path(root)
    stage, final = staging_dir(root, step), root / ck.step_dir_name(step)
    missing = [r for r in writers if not (stage / shard_file(r)).is_file()]
    if missing:
        raise ck.CheckpointError(f"{stage}: shards of ranks {missing} were not written")
    index = {
        "schema": SCHEMA,
        "files": {str(r): shard_file(r) for r in writers},
        "meta": json.loads(json.dumps({**meta, "step": step}, default=ck.json_default)),
    }
    (stage / INDEX).write_text(json.dumps(index, indent=1, sort_keys=True))
    fsync_dir(stage)
    if final.exists():
        aside = root / f"{ck.TMP_PREFIX}old-{final.name}-sharded"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
        os.rename(stage, final)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(stage, final)
    fsync_dir(root)
    if keep is not None:
        for old in ck.list_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def is_sharded(path: str | Path) -> bool:
    return (Path(path) / INDEX).is_file()


def read_index(path: str | Path) -> dict:
    index = json.loads((Path(path) / INDEX).read_text())
    if index.get("schema") != SCHEMA:
        raise ck.CheckpointError(f"{path}/{INDEX}: not a sharded checkpoint of this project ({index.get('schema')})")
    return index


def consolidate(path: str | Path, verify: bool = True) -> tuple[dict[str, np.ndarray], dict]:
    """(full tensors of the 1-process layout, meta) from a sharded checkpoint directory."""
    path = Path(path)
    index = read_index(path)
    pieces: dict[str, dict[tuple[int, int, int], np.ndarray]] = {}
    placements: dict[str, Placement] = {}
    for _, name in sorted(index["files"].items(), key=lambda kv: int(kv[0])):
        file = path / name
        try:
            with safe_open(str(file), framework="np") as f:
                header = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except (SafetensorError, FileNotFoundError) as exc:
            raise ck.CheckpointError(f"{file}: unreadable shard ({exc}); the checkpoint is incomplete") from exc
        if verify and str(ck.crc(tensors)) != header.get(ck.CRC_KEY):
            raise ck.CheckpointError(f"{file} fails its CRC check: resume from an older checkpoint")
        for key, d in json.loads(header[_PLACEMENTS_KEY]).items():
            p = Placement.from_json(d)
            placements.setdefault(key, p)
            pieces.setdefault(key, {})[p.key] = tensors[key]
    full = {}
    for key, p in placements.items():
        need = set(p.piece_keys())
        if not need <= set(pieces[key]):
            raise ck.CheckpointError(f"{path}: {key} lacks shards {sorted(need - set(pieces[key]))}")
        full[key] = p.assemble(pieces[key])
    return full, index["meta"]


def placement_of(key: str, placements: dict[str, Placement], shape) -> Placement:
    """A checkpoint key's placement: ``model.<param>`` and ``optim.<state>.<param>`` follow their parameter."""
    for name, p in placements.items():
        if key == f"model.{name}" or (key.startswith("optim.") and key.endswith(f".{name}")):
            return p
    return replicated(shape)
