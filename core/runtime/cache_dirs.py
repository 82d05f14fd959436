"""Where the project keeps what it computes once and reuses across runs: the tokenised corpus (core.data), this
machine's reference matmul rate (core.runtime.reference_rate) and compiled graphs (core.runtime.compile_cache).

``$MSAR_CACHE_DIR``, else ``$XDG_CACHE_HOME/mindspore-autoresearch``, else ``~/.cache/mindspore-autoresearch``.
The compile cache alone can be moved on its own (``$MSAR_COMPILE_CACHE_DIR``, or ``execution.compile_cache_dir``):
a test session has a project cache of its own, and each test a compile cache of its own within it, while the
corpus and the reference rate (costly to remake, and not what a test measures) are shared by the session.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "MSAR_CACHE_DIR"
COMPILE_CACHE_ENV = "MSAR_COMPILE_CACHE_DIR"


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mindspore-autoresearch"


def compile_cache_root() -> Path:
    return Path(os.environ.get(COMPILE_CACHE_ENV) or cache_root() / "compile")
