"""Every graph a trial compiles goes through this module, so that one config key changes them all.

    jit(fn, owners)              mindspore.jit with this trial's jit_level and capture_mode, compiled as a cell that
                                 owns the cells whose Parameters fn reads (the compile cache needs it)
    compiled_if(enabled)(fn)     jit(fn) under training.mode=jit, fn itself in PyNative
    each(fn, xs, ys, ...)        (fn(x0, y0, ...), fn(x1, y1, ...), ...) inside a graph, compiled fast
    pick(xs, indices)            (xs[i] for i in indices) inside a graph, likewise

The options are set once per process by ``core.runtime.settings.configure`` (MindSpore's defaults before that).
"""

from __future__ import annotations

import functools

import mindspore as ms
from mindspore import nn

_OPTIONS: dict = {}
_MAP = ms.ops.Map()


def set_options(**options) -> None:
    """The ``mindspore.jit`` options of every graph compiled from now on (``jit_level``, ``capture_mode``)."""
    _OPTIONS.clear()
    _OPTIONS.update(options)


def jit(fn, source: bool = False, owners: tuple = ()):
    """``mindspore.jit(fn)`` with the options ``set_options`` set.

    ``source``: capture ``fn`` by parsing its source whatever ``capture_mode`` says: for the graphs spelled with
    ``each``, which bytecode capture traced wrong (a tiny trial's second loss off). ``owners``: the cells whose
    Parameters ``fn`` reads or updates (``fn`` itself if it is a cell). The graph is then compiled as the
    ``construct`` of a cell holding them, so that the Parameters are its own: a graph loaded from MindSpore's
    compile cache binds only those, and reads uninitialised memory for Parameters it merely closes over
    (benchmarks/RESULTS.md, "Compile cache")."""
    options = dict(_OPTIONS, capture_mode="ast") if source else dict(_OPTIONS)
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

    MindSpore 2.10's graph compiler is slow on Python loops over tuples and very slow on comprehensions, and
    compiles ``Map`` over a tuple in a fraction of their time (benchmarks/RESULTS.md, "Start-up: what a trial
    compiles and waits for")."""
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
