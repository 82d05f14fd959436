"""The single-file checkpoint format: ``<dir>/step_<step:08d>/model_optim.safetensors``, written atomically.

One file holds the model and optimizer tensors under free-form names (``model.layers.0.attn.wq.weight``,
``optim.adamw.m.embed.weight``) and, in the safetensors header, the run's metadata as JSON (step, data position,
seed / RNG state, resolved config). The format is plain safetensors, so ``safetensors.numpy.load_file`` and
``mindspore.load_checkpoint(path, format="safetensors")`` read it as they are.

Crash safety: a checkpoint is written into a hidden temporary directory beside its final place, flushed to disk,
then renamed into place. A crash at any moment leaves either the complete checkpoint or a temporary directory
that ``latest_checkpoint`` never looks at (and that a later save removes). Only then are old checkpoints pruned,
so there is always at least one complete checkpoint on disk.

A CRC32 over the tensors (header key ``msar.crc32``) lets ``load_checkpoint`` detect a damaged file. It is not
MindSpore's ``crc_num``: MindSpore hashes ``bytes(array)``, which for a 0-d integer array means "that many zero
bytes" (a 0-d step counter of 10**9 would allocate a gigabyte), so its ``crc_check=True`` is left unused here.

NumPy only: it deals in arrays; the checkpoint manager (``core.ckpt.manager``) converts. ``core.ckpt.reader.load``
reads this format and the sharded one alike.
"""

from __future__ import annotations

import binascii
import json
import os
import re
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from core.runtime.files import fsync_dir

FILENAME = "model_optim.safetensors"
SCHEMA = "msar-checkpoint/1"
_STEP_DIR = re.compile(r"^step_(\d{8,})$")
TMP_PREFIX = ".tmp-"
# Header keys. MindSpore's loader reads a header key equal to a tensor's name as that tensor's dtype, and uses
# "crc_num" and "remove_redundancy" itself: so our keys are namespaced and tensor names may not take any of them.
META_KEY, SCHEMA_KEY, CRC_KEY = "msar.meta", "msar.schema", "msar.crc32"
_RESERVED = {META_KEY, SCHEMA_KEY, CRC_KEY, "crc_num", "remove_redundancy", "format"}


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read back as written (damaged, truncated, or not ours)."""


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def json_default(obj: Any) -> Any:
    # NumPy scalars and arrays appear in RNG states and metrics; JSON has no type for them.
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"checkpoint meta must be JSON-serialisable; {type(obj).__name__} is not: {obj!r}")


def crc(tensors: dict[str, np.ndarray]) -> int:
    """CRC32 over (name, raw C-order bytes) in sorted-name order."""
    crc = 0
    for name in sorted(tensors):
        crc = binascii.crc32(name.encode("utf-8"), crc)
        crc = binascii.crc32(np.asarray(tensors[name], order="C"), crc)  # hashes the buffer, no copy
    return crc


def _tmp_tag() -> str:
    # Host and pid in the name let a later save remove only temporaries whose writer is certainly dead.
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def save_checkpoint(
    dir: str | Path, step: int, tensors: dict[str, np.ndarray], meta: dict, *, keep: int | None = None
) -> Path:
    """Write ``<dir>/step_<step:08d>/model_optim.safetensors`` atomically and return the step directory.

    ``meta`` must be JSON-serialisable (NumPy scalars/arrays become numbers/lists); ``meta["step"]`` is set to
    ``step``. ``keep``: how many of the newest checkpoints to keep after this one is in place (None: all).
    Saving a step that already exists replaces it.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0 (got {step})")
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be >= 1 or None (got {keep})")
    if meta.get("step", step) != step:
        raise ValueError(f"meta['step'] = {meta['step']} disagrees with step = {step}")
    arrays = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor names must be non-empty strings (got {name!r})")
        if name in _RESERVED:
            raise ValueError(f"tensor name {name!r} is reserved for the safetensors header; rename it")
        if not isinstance(value, np.ndarray):
            raise TypeError(
                f"tensor {name!r} must be a numpy.ndarray (got {type(value).__name__}); convert with .asnumpy()"
            )
        arrays[name] = np.asarray(value, order="C")  # raw C-order buffers (ascontiguousarray would make 0-d 1-d)
    header = {
        SCHEMA_KEY: SCHEMA,
        META_KEY: json.dumps({**meta, "step": step}, default=json_default, sort_keys=True),
        CRC_KEY: str(crc(arrays)),
    }

    root = Path(dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f"{TMP_PREFIX}{final.name}-{_tmp_tag()}"
    tmp.mkdir()
    try:
        save_file(arrays, str(tmp / FILENAME), metadata=header)
        with open(tmp / FILENAME, "rb") as f:  # flush data before the rename makes it visible
            os.fsync(f.fileno())
        fsync_dir(tmp)
        if final.exists():
            # Directories cannot be replaced in one rename; move the old one aside first. A crash between the
            # two renames loses only this step's old copy, never the new one or any other step.
            aside = root / f"{TMP_PREFIX}old-{final.name}-{_tmp_tag()}"
            os.rename(final, aside)
            os.rename(tmp, final)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _remove_dead_temporaries(root)
    if keep is not None:
        for old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _remove_dead_temporaries(root: Path) -> None:
    """Remove temporaries left by crashed writers on this host (pid no longer alive); leave any other alone."""
    host = socket.gethostname()
    for entry in root.iterdir():
        if not entry.name.startswith(TMP_PREFIX) or not entry.is_dir():
            continue
        # name: .tmp-[old-]step_XXXXXXXX-<host>-<pid>-<hex>; hostnames may contain '-', so parse from the right
        parts = entry.name.rsplit("-", 2)
        if len(parts) != 3 or not parts[1].isdigit() or not parts[0].endswith(f"-{host}"):
            continue
        pid = int(parts[1])
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except PermissionError:
            pass  # alive, owned by someone else


def list_checkpoints(dir: str | Path) -> list[Path]:
    """Complete checkpoint directories under ``dir``, oldest step first (temporaries are ignored)."""
    root = Path(dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = _STEP_DIR.match(entry.name)
        if m and ((entry / FILENAME).is_file() or (entry / "index.json").is_file()):  # full, or sharded
            found.append((int(m.group(1)), entry))
    return [path for _, path in sorted(found)]


def latest_checkpoint(dir: str | Path) -> Path | None:
    """The newest complete checkpoint directory under ``dir``, or None."""
    found = list_checkpoints(dir)
    return found[-1] if found else None


def _file_of(path: str | Path) -> Path:
    path = Path(path)
    file = path / FILENAME if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {path} (expected a step_XXXXXXXX directory holding {FILENAME}, or the file itself)"
        )
    return file


def read_file_meta(path: str | Path) -> dict:
    """Only the metadata of a single-file checkpoint (reads the header, not the tensors)."""
    file = _file_of(path)
    with safe_open(str(file), framework="np") as f:
        header = f.metadata() or {}
    if META_KEY not in header:
        raise CheckpointError(f"{file} has no {META_KEY!r} header: not written by core.ckpt")
    return json.loads(header[META_KEY])


def load_file(path: str | Path, verify: bool = True) -> tuple[dict[str, np.ndarray], dict]:
    """(tensors, meta) from a step directory or its safetensors file; ``verify`` checks the CRC."""
    file = _file_of(path)
    try:
        with safe_open(str(file), framework="np") as f:
            header = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except SafetensorError as exc:
        raise CheckpointError(f"{file} is not a readable safetensors file ({exc}); it may be truncated") from exc
    if META_KEY not in header:
        raise CheckpointError(f"{file} has no {META_KEY!r} header: not written by core.ckpt")
    if verify and CRC_KEY in header and str(crc(tensors)) != header[CRC_KEY]:
        raise CheckpointError(f"{file} fails its CRC check: the file is damaged; resume from an older checkpoint")
    return tensors, json.loads(header[META_KEY])
