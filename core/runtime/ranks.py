"""Run a Python script or module on N ranks of a MindSpore cluster on this host: a scheduler and N workers with
the environment ``msrun`` sets (``core.runtime.cluster`` reads it back in each worker). For what runs below the
trial level (the calibration's collective micro-benchmark, tests of the parallel building blocks);
``core.trial.supervisor`` does the same for trials, with their contract. No MindSpore here: only in the children.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(n: int, *args: str, log_dir: Path, timeout: float = 600) -> list[tuple[int, str]]:
    """(exit code, log) of each rank of ``python args...`` (a script and its arguments, or ``-m module ...``) on
    ``n`` ranks, run from the project's root; a rank still running after ``timeout`` seconds is killed."""
    env = dict(
        os.environ,
        MS_WORKER_NUM=str(n),
        MS_SCHED_HOST="127.0.0.1",
        MS_SCHED_PORT=str(free_port()),
        GLOG_v="3",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(ROOT),
        PYTHONFAULTHANDLER="1",
    )  # a rank that crashes leaves its Python stack in its log
    log_dir.mkdir(parents=True, exist_ok=True)
    sched = subprocess.Popen(
        [sys.executable, "-c", "from mindspore.communication import init; init()"],
        env={**env, "MS_ROLE": "MS_SCHED"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=log_dir,  # MindSpore writes rank_<n>/ directories where a process runs
    )
    procs = []
    for r in range(n):
        with open(log_dir / f"rank_{r}.log", "w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, *map(str, args)],
                    cwd=log_dir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**env, "MS_ROLE": "MS_WORKER", "MS_NODE_ID": str(r), "RANK_ID": str(r), "RANK_SIZE": str(n)},
                )
            )
    try:
        codes = [_wait(p, timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        sched.kill()
        sched.wait()
    return [(c, (log_dir / f"rank_{r}.log").read_text()) for r, c in enumerate(codes)]


def _wait(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
