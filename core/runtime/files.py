"""Files that appear whole or not at all: written to a temporary name beside their place, flushed to disk, then
renamed into place (``os.replace`` is atomic on POSIX). A reader never sees half a summary, index or cache entry,
and a crash leaves at most a temporary file behind.

    write_atomic(path, text_or_bytes)
    with atomic_path(path) as tmp:   # for writers that take a path (safetensors' save_file)
        save_file(arrays, str(tmp))
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (a rename into it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """A temporary path beside ``path`` for the block to write; on success it is flushed and renamed to ``path``,
    on failure removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a part."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
