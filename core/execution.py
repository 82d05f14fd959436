"""How this process executes graphs: MindSpore's compile and runtime settings (``execution.*``, the space of
``search_spaces/compile.yaml``), applied once per process before anything is compiled.

    configure(cfg, local_ranks)   # threads, fusion, host pipeline, fused CPU kernels: process-wide, so set
                                   # before the first op
    cpu_kernels()                  # whether the optimizer and gradient sync run core.kernels here
    jit(fn, owners)                # mindspore.jit with this trial's jit_level and capture_mode, compiled as a
                                   # cell that owns the cells whose Parameters fn reads (the compile cache needs it)
    compiled_if(jit_mode)(fn)      # jit(fn) under training.mode=jit, fn itself in PyNative
    each(fn, xs, ys, ...)          # (fn(x0, y0, ...), fn(x1, y1, ...), ...) inside a graph, compiled fast
    pick(xs, indices)              # (xs[i] for i in indices) inside a graph, likewise

Every graph a trial compiles goes through ``jit``, so that one config key changes them all.
"""

from __future__ import annotations

import functools
import os

import mindspore as ms
from mindspore import nn

from core import kernels

_JIT_OPTIONS: dict = {}
_CPU_KERNELS = [False]  # whether this process runs core.kernels (set by configure)
# MindSpore reads it at the first op it queues, once per process: "1" runs the host pipeline's work in the
# calling thread (see _host_pipeline).
HOST_BLOCKING_ENV = "MS_DEV_HOST_BLOCKING_RUN"
_MAP = ms.ops.Map()


def jit(fn, source: bool = False, owners: tuple = ()):
    """``mindspore.jit(fn)`` with the options ``configure`` set (MindSpore's defaults before it is called).

    ``source``: capture ``fn`` by parsing its source whatever ``capture_mode`` says: for the graphs spelled with
    ``each``, which bytecode capture traced wrong (a tiny trial's second loss off). ``owners``: the cells whose
    Parameters ``fn`` reads or updates (``fn`` itself if it is a cell). The graph is then compiled as the
    ``construct`` of a cell holding them, so that the Parameters are its own: a graph loaded from MindSpore's
    compile cache binds only those, and reads uninitialised memory for Parameters it merely closes over
    (benchmarks/compile_cache.py: loss ``inf`` or zero gradients)."""
    options = dict(_JIT_OPTIONS, capture_mode="ast") if source else dict(_JIT_OPTIONS)
    if isinstance(fn, nn.Cell):
        owners = (fn, *owners)
    if not owners:
        return ms.jit(fn, **options)
    return _owner_cell(tuple(sorted(options.items())))(fn, owners)


@functools.cache
def _owner_cell(options: tuple) -> type:
    """A Cell class whose ``construct`` runs ``fn`` compiled with ``options``: one class per option set, because
    ``mindspore.jit`` binds its options to the method it decorates."""

    class Compiled(nn.Cell):
        def __init__(self, fn, owners):
            super().__init__(auto_prefix=False)  # children keep their Parameters' names (a CellList would not)
            self.fn = fn
            for i, cell in enumerate(c for c in owners if c is not fn):
                setattr(self, f"owner_{i}", cell)

        @ms.jit(**dict(options))
        def construct(self, *args):
            return self.fn(*args)

    return Compiled


def each(fn, *tuples) -> tuple:
    """``tuple(fn(*xs) for xs in zip(*tuples))``, spelled as MindSpore's ``Map`` so that a graph over one tensor
    per parameter compiles in a fraction of the time. Per-element constants go in as tuples of their own (a branch
    on one folds away), a tensor shared by all through ``ops.partial(fn, t)``.

    MindSpore 2.10's graph compiler is slow on Python loops over tuples and very slow on comprehensions
    (benchmarks/compile_time.py, 60 (64, 64) tensors, 2 CPU cores): scaling each tensor compiled in 3.75 s as
    ``tuple(g * 2 for g in grads)``, 0.92 s as a loop over indices, 0.29 s by ``Map``; an update per parameter
    in 0.57 s as a loop, 0.14 s by ``Map``. A trial's gradient-sync and update graphs compiled ~4x faster."""
    return _MAP(fn, *tuples)


def pick(xs: tuple, indices: tuple) -> tuple:
    """``tuple(xs[i] for i in indices)`` inside a graph, through ``each``."""
    return each(ms.ops.partial(_item, xs), indices)


def _item(xs, i):
    return xs[i]


def compiled_if(enabled: bool, source: bool = False, owners: tuple = ()):
    """``jit`` (with ``source`` and ``owners``) when ``enabled`` (training.mode=jit), else a function returned as
    it is (PyNative)."""
    return (lambda fn: jit(fn, source, owners)) if enabled else _as_is


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
    _CPU_KERNELS[0] = kernels.use_cpu_kernels(cfg.device, e.cpu_kernels)
    if _CPU_KERNELS[0]:  # as many threads as MindSpore's own kernels: the rank's share of the cores
        kernels.set_threads(threads or _cores())
    if e.dispatch_threads:
        ms.runtime.dispatch_threads_num(e.dispatch_threads)
    set_host_pipeline(cfg.device, e.host_pipeline)


def cpu_kernels() -> bool:
    """Whether the optimizer and gradient sync use ``core.kernels`` in this process (``execution.cpu_kernels``)."""
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
    kernels: on 2 cores the main thread burned 0.7 of one while model=small stepped in 393-416 ms; with the work
    run in the calling thread instead (``MS_DEV_HOST_BLOCKING_RUN=1``) the kernels had both cores and the step took
    204 ms, same losses to the last bit (benchmarks/RESULTS.md, "The host pipeline"). On an accelerator the queues
    overlap Python with launches to the device, which is what they are for: kept there."""
    return device != "CPU"


def _cpu_share(device: str, local_ranks: int) -> int | None:
    """CPU workaround: MindSpore sizes each process's kernel thread pool for the whole machine, so ranks that
    share a host oversubscribe it (measured: 2 ranks on 2 cores ran each step ~4x slower than one rank), and so
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
