"""Where a benchmark figure comes from: the commit it was measured at. Standard library only, so that every
script here (and ``agent_efficiency.py``'s per-trial replay command) can import it for free."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git_commit() -> str:
    """The short HEAD commit, plus "+uncommitted changes" when tracked files differ from it; "unknown" outside a
    git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True)
    except OSError:
        return "unknown"
    if head.returncode != 0 or not head.stdout.strip():
        return "unknown"
    return head.stdout.strip() + ("+uncommitted changes" if dirty.stdout.strip() else "")
