"""Data parallelism (``parallel.dp_replicate``): every rank holds the whole model and a slice of the global batch;
gradients are averaged over ranks by one all-reduce, so each rank applies the same update.

Why one flat buffer: on CPU a collective costs ~9 ms even for 1 MB (MINDSPORE_CPU.md), so a single all-reduce
of all gradients beats one per parameter by far.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import mint, ops


class GradientAllReduce:
    """Averages a tuple of gradients over the world group (sum all-reduce, divided by world size)."""

    def __init__(self, shapes: list[tuple[int, ...]], world_size: int):
        self.world_size = world_size
        self.shapes = shapes
        self.sizes = [int(_numel(s)) for s in shapes]
        self._all_reduce = ops.AllReduce()  # sum: the one reduction CPU supports in ops.AllReduce
        self._fn = ms.jit(self._reduce)

    def _reduce(self, *grads):
        flat = mint.cat([g.reshape(-1) for g in grads])  # (sum of sizes,)
        flat = self._all_reduce(flat) / self.world_size
        parts = mint.split(flat, self.sizes)
        return tuple(p.reshape(s) for p, s in zip(parts, self.shapes))

    def __call__(self, grads):
        return self._fn(*grads)


def all_reduce_mean_scalars(values: list[float], world_size: int) -> list[float]:
    """Average a few host scalars (loss, grad norm, eval sums) so that every rank decides the same."""
    import numpy as np

    if world_size == 1:
        return values
    t = ms.Tensor(np.asarray(values, np.float32))
    return [float(v) for v in (ops.AllReduce()(t) / world_size).asnumpy()]


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
