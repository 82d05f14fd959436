"""Environment variables that MindSpore's native libraries read once, when they load (at ``import mindspore``), so
they must be set before that import in every process that trains: ``core.train`` (its workers and scheduler get
its environment) and the warm server (``core.warm``; its forked trials inherit the loaded libraries).

    apply()      set each default in os.environ unless it is set already; call before importing mindspore

This module imports nothing heavy, so that calling it cannot load MindSpore first.
"""

from __future__ import annotations

import os

# OMP_WAIT_POLICY=passive. MindSpore links GNU OpenMP (libgomp), in whose parallel regions the kernels that
# graph-kernel fusion generates (AKG, execution.graph_kernel_fusion) run. By default libgomp's worker threads spin
# after each region, waiting for the next; on a CPU they then take a core from MindSpore's own kernel threads, which
# do not run under OpenMP. Measured on model=small, 2 cores, jit_level O1 + fusion: forward+backward 170-200 ms with
# the spin, 54 ms passive (benchmarks/RESULTS.md, "OpenMP's spinning workers"). Nothing else in a trial runs OpenMP
# regions (MindSpore's kernels, its oneDNN matmuls and core.kernels use their own thread pools), and on an
# accelerator only host-side waits change, so the default holds for every device. A value set by the user wins.
DEFAULTS = {"OMP_WAIT_POLICY": "passive"}


def apply() -> None:
    """Set ``DEFAULTS`` in this process's environment where unset (before ``import mindspore``)."""
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
