"""Environment variables that MindSpore's native libraries read once, when they load (at ``import mindspore``), so
they must be set before that import in every process that trains: ``core.train`` (its workers and scheduler get
its environment) and the warm server (``core.trial.fork_server``; its forked trials inherit the loaded
libraries).

    apply()      set each default in os.environ unless it is set already; call before importing mindspore

This module imports nothing heavy, so that calling it cannot load MindSpore first.
"""

from __future__ import annotations

import os

# OMP_NUM_THREADS=1, as MindSpore means it to be. MindSpore links GNU OpenMP (libgomp), in whose parallel regions
# the kernels of graph-kernel fusion (AKG, execution.graph_kernel_fusion) run; its own kernels run on its own thread
# pool. Its import calls setenv("OMP_NUM_THREADS", "1"), but after libgomp has read the environment: the process
# itself keeps libgomp's default, a thread per core, and only the processes it starts get 1 (so trials started
# by a process that had imported MindSpore, as benchmarks' were, ran differently from the agent's). libgomp's
# extra thread spins between regions and takes a core from MindSpore's kernel thread (benchmarks/RESULTS.md,
# "Fused optimizer kernels and warm starts", "OpenMP's spinning worker"). A value set by the user wins.
DEFAULTS = {"OMP_NUM_THREADS": "1"}


def apply() -> None:
    """Set ``DEFAULTS`` in this process's environment where unset (before ``import mindspore``)."""
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
