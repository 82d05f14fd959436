"""How this process executes graphs: MindSpore's compile and runtime settings (``execution.*``, the space of
``search_spaces/compile.yaml``), applied once per process before anything is compiled.

    configure(cfg, local_ranks)   # threads, graph-kernel fusion: process-wide, so set before the first graph
    jit(fn)                        # mindspore.jit with this trial's jit_level and capture_mode
    compiled_if(jit_mode)(fn)      # jit(fn) under training.mode=jit, fn itself in PyNative

Every graph a trial compiles goes through ``jit``, so that one config key changes them all.
"""

from __future__ import annotations

import os

import mindspore as ms

_JIT_OPTIONS: dict = {}


def jit(fn):
    """``mindspore.jit(fn)`` with the options ``configure`` set (MindSpore's defaults before it is called)."""
    return ms.jit(fn, **_JIT_OPTIONS)


def compiled_if(enabled: bool):
    """``jit`` when ``enabled`` (training.mode=jit), else a function returned as it is (PyNative)."""
    return jit if enabled else _as_is


def _as_is(fn):
    return fn


def configure(cfg, local_ranks: int) -> None:
    """Apply ``cfg.execution`` (a ``core.config.TrainConfig``) to this process; ``local_ranks``: ranks on this host."""
    e = cfg.execution
    _JIT_OPTIONS.clear()
    _JIT_OPTIONS.update(jit_level=e.jit_level, capture_mode=e.capture_mode)
    if e.graph_kernel_fusion:
        # MindSpore's graph-kernel fusion (AKG): element-wise ops, reductions and transposes fused into generated
        # kernels at compile time. A kernel AKG cannot build is a compile failure (exit 11).
        ms.set_context(enable_graph_kernel=True)
    threads = e.kernel_threads or _cpu_share(cfg.device, local_ranks)
    if threads:
        ms.device_context.cpu.op_tuning.threads_num(threads)
    if e.dispatch_threads:
        ms.runtime.dispatch_threads_num(e.dispatch_threads)


def _cpu_share(device: str, local_ranks: int) -> int | None:
    """CPU workaround: MindSpore sizes each process's kernel thread pool for the whole machine, so ranks that
    share a host oversubscribe it (measured: 2 ranks on 2 cores ran each step ~4x slower than one rank), and so
    does a trial pinned to a few cores (the agent's ``--workers`` runs trials under taskset). Give every rank its
    share of the cores this process may use; None: MindSpore's default is right (one rank on the whole machine,
    or an accelerator, whose kernels run on the device)."""
    if device != "CPU":
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if local_ranks > 1 or cores < (os.cpu_count() or cores):
        return max(1, cores // local_ranks)
    return None
