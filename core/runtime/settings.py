"""How this process executes graphs: MindSpore's compile and runtime settings (``execution.*``, the space of
``search_spaces/compile.yaml``), applied once per process before anything is compiled.

    configure(cfg, local_ranks)   threads, fusion, host pipeline, fused CPU kernels, jit options: process-wide,
                                  so set before the first op
    cpu_kernels()                 whether the optimizer and gradient sync run core.runtime.kernels here
    set_host_pipeline(device)     MindSpore's host queues on or off (before the first op)
"""

from __future__ import annotations

import os

import mindspore as ms

from core.runtime import graphs, kernels

# MindSpore reads it at the first op it queues, once per process: "1" runs the host pipeline's work in the
# calling thread (see _host_pipeline).
HOST_BLOCKING_ENV = "MS_DEV_HOST_BLOCKING_RUN"
_CPU_KERNELS = [False]  # whether this process runs core.runtime.kernels (set by configure)


def configure(cfg, local_ranks: int) -> None:
    """Apply ``cfg.execution`` (a ``core.config.TrainConfig``) to this process; ``local_ranks``: ranks on this host."""
    e = cfg.execution
    graphs.set_options(jit_level=e.jit_level, capture_mode=e.capture_mode)
    if e.graph_kernel_fusion:
        # MindSpore's graph-kernel fusion (AKG): element-wise ops, reductions and transposes fused into generated
        # kernels at compile time. A kernel AKG cannot build is a compile failure (exit 11).
        ms.set_context(enable_graph_kernel=True)
    threads = e.kernel_threads or _cpu_share(cfg.device, local_ranks)
    if threads:
        ms.device_context.cpu.op_tuning.threads_num(threads)
    _CPU_KERNELS[0] = kernels.use_cpu_kernels(cfg.device, e.cpu_kernels)
    if _CPU_KERNELS[0]:  # as many threads as MindSpore's own kernels: the rank's share of the cores
        kernels.set_threads(threads or _cores())
    if e.dispatch_threads:
        ms.runtime.dispatch_threads_num(e.dispatch_threads)
    set_host_pipeline(cfg.device, e.host_pipeline)


def cpu_kernels() -> bool:
    """Whether the optimizer and gradient sync use ``core.runtime.kernels`` in this process
    (``execution.cpu_kernels``)."""
    return _CPU_KERNELS[0]


def set_host_pipeline(device: str, enabled: bool | None = None) -> None:
    """Turn MindSpore's host queues on or off for this process (None: ``_host_pipeline``'s default for
    ``device``); only before its first op (HOST_BLOCKING_ENV)."""
    enabled = _host_pipeline(device) if enabled is None else enabled
    os.environ[HOST_BLOCKING_ENV] = "0" if enabled else "1"


def _host_pipeline(device: str) -> bool:
    """CPU workaround: MindSpore's host pipeline hands each graph launch, op inference and memory work to queue
    threads, and a thread that waits for them (reading a loss back, launching the next graph) spins in an empty
    loop until they are done (``AsyncRQueue::Wait`` in MindSpore 2.10). On a CPU that spin takes a core from the
    kernels, and running the work in the calling thread instead (``MS_DEV_HOST_BLOCKING_RUN=1``) gave the same
    losses to the last bit in about half the step time (benchmarks/RESULTS.md, "The host pipeline"). On an
    accelerator the queues overlap Python with launches to the device, which is what they are for: kept there."""
    return device != "CPU"


def _cpu_share(device: str, local_ranks: int) -> int | None:
    """CPU workaround: MindSpore sizes each process's kernel thread pool for the whole machine, so ranks that
    share a host oversubscribe it (2 ranks on 2 cores ran each step several times slower than one rank), and so
    does a trial pinned to a few cores (the agent's ``--workers`` runs trials under taskset). Give every rank its
    share of the cores this process may use; None: MindSpore's default is right (one rank on the whole machine,
    or an accelerator, whose kernels run on the device)."""
    if device != "CPU":
        return None
    cores = _cores()
    if local_ranks > 1 or cores < (os.cpu_count() or cores):
        return max(1, cores // local_ranks)
    return None


def _cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
