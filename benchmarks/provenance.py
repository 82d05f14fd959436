"""Where a benchmark figure comes from: the commit it was measured at, and the CPU. Standard library only (and
core.reference_rate, which is too), so that every script here (and ``agent_efficiency.py``'s per-trial replay
command) can import it for free."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from core.runtime.reference_rate import cpu_model_and_flags

ROOT = Path(__file__).resolve().parents[1]


def git_commit() -> str:
    """The short HEAD commit, plus "+uncommitted changes" when tracked files differ from it; "unknown" outside a
    git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    if head.returncode != 0 or not head.stdout.strip():
        return "unknown"
    return head.stdout.strip() + ("+uncommitted changes" if dirty.stdout.strip() else "")


def cpu_info(flags: tuple[str, ...] = ("avx2", "avx512f", "fma")) -> str:
    """CPU model, core count and whether it has each of ``flags`` (the SIMD kinds that set fp32 matmul rates:
    machines of one kind differ, so a figure names them)."""
    model, have = cpu_model_and_flags()
    return f"{model}, {os.cpu_count()} cores, " + ", ".join(f"{f} {'yes' if f in have else 'no'}" for f in flags)
