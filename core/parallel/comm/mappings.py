"""Differentiable collectives: each collective paired with its backward (Megatron-LM's ``mappings.py``), as
bprop-Cells (the form whose gradients survive ``mindspore.jit``, docs/mindspore-cpu.md), named for what their
forward does:

    CopyTo          identity          | all-reduce         (Megatron's f: enter a tensor-parallel region)
    ReduceFrom      all-reduce        | identity           (Megatron's g: leave it)
    GatherFrom      all-gather        | reduce-scatter     (SP/CP/FSDP: a shard becomes the whole)
    ReduceScatterTo reduce-scatter    | all-gather         (SP: leave a row-parallel linear)
    ScatterTo       keep own chunk    | all-gather
    GatherRepeated  all-gather        | keep own chunk     (the whole feeds a computation every rank repeats)
    AllToAll        all-to-all        | the inverse all-to-all
    BroadcastFrom   broadcast         | all-reduce, kept on the source

The gradient convention is Megatron's: the objective is the sum of what every rank computes from values that
differ between ranks, and a computation that every rank of the group repeats on identical values (after
``ReduceFrom``) counts once. ``ScatterTo`` and ``GatherRepeated`` may take a permutation (``order``) between the
group-order concatenation and the whole (context parallelism's chunks are not in sequence order).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from core.parallel.comm.collectives import (
    Identity,
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    chunk,
    reduce_scatter,
)
from core.parallel.comm.groups import Group


class _Take(nn.Cell):
    """The entries ``index`` of x along ``dim``: a constant index, no communication."""

    def __init__(self, index, dim: int):
        super().__init__()
        self.index, self.dim = ms.Tensor(np.asarray(index, np.int32)), dim

    def construct(self, x):
        return ops.gather(x, self.index, self.dim)


class _GatherOrdered(nn.Cell):
    """All-gather along ``dim``, then permuted: entry i of the result is entry ``order[i]`` of the group-order
    concatenation (``order`` None: the concatenation)."""

    def __init__(self, group: Group, dim: int, order=None):
        super().__init__()
        self.gather = all_gather(group, dim)
        self.take = Identity() if order is None else _Take(order, dim)

    def construct(self, x):
        return self.take(self.gather(x))


def own_part(group: Group, dim: int, order=None) -> nn.Cell:
    """This rank's block of a whole made by ``_GatherOrdered(group, dim, order)``."""
    if order is None:
        return chunk(group, dim)
    n = len(order) // group.size
    return _Take(np.argsort(order)[group.index * n : (group.index + 1) * n], dim)


# Forward and backward get separate raw Cells: under jit, a helper called from both a bprop-Cell's construct and
# its bprop can fail to compile (core/model/loss.py).


class _Copy(nn.Cell):
    def construct(self, x):
        return x * 1.0  # a new tensor, so that the bprop-Cell's output is not its input


class _Paired(nn.Cell):
    """A collective and the one that is its backward."""

    def __init__(self, forward: nn.Cell, backward: nn.Cell):
        super().__init__()
        self.fwd, self.bwd = forward, backward

    def construct(self, x):
        return self.fwd(x)

    def bprop(self, x, out, dout):
        return (self.bwd(dout),)


class CopyTo(_Paired):
    """Forward: identity. Backward: all-reduce (Megatron's f)."""

    def __init__(self, group: Group):
        super().__init__(_Copy(), all_reduce(group))


class ReduceFrom(_Paired):
    """Forward: all-reduce. Backward: identity (Megatron's g)."""

    def __init__(self, group: Group):
        super().__init__(all_reduce(group), _Copy())


class GatherFrom(_Paired):
    """Forward: all-gather along ``dim``. Backward: reduce-scatter along ``dim``."""

    def __init__(self, group: Group, dim: int):
        super().__init__(all_gather(group, dim), reduce_scatter(group, dim))


def enter_region(group: Group, sequence_parallel: bool) -> nn.Cell:
    """Where activations enter a tensor-parallel region: ``CopyTo``, or with sequence parallelism ``GatherFrom``
    the sequence (dim 1); the backward of either sums the partial input gradients over the group."""
    return GatherFrom(group, 1) if sequence_parallel else CopyTo(group)


class ReduceScatterTo(_Paired):
    """Forward: reduce-scatter along ``dim``. Backward: all-gather along ``dim``."""

    def __init__(self, group: Group, dim: int):
        super().__init__(reduce_scatter(group, dim), all_gather(group, dim))


class ScatterTo(_Paired):
    """Forward: keep this rank's block of ``dim``. Backward: all-gather along ``dim`` (a whole of length L
    permuted by ``order`` (L,), if given, as in ``GatherRepeated``)."""

    def __init__(self, group: Group, dim: int, order=None):
        super().__init__(own_part(group, dim, order), _GatherOrdered(group, dim, order))


class GatherRepeated(_Paired):
    """Forward: all-gather along ``dim`` (then permuted by ``order``: entry i of the whole is entry ``order[i]``
    of the group-order concatenation). Backward: this rank's block of the gradient, which every rank holds whole
    because the whole feeds a computation every rank repeats (Megatron's gather without reduce-scatter)."""

    def __init__(self, group: Group, dim: int, order=None):
        super().__init__(_GatherOrdered(group, dim, order), own_part(group, dim, order))


class AllToAll(_Paired):
    """Forward: all-to-all (split ``split_dim``, concatenate ``concat_dim``). Backward: the inverse all-to-all."""

    def __init__(self, group: Group, split_dim: int, concat_dim: int):
        super().__init__(all_to_all(group, split_dim, concat_dim), all_to_all(group, concat_dim, split_dim))


class _Scaled(nn.Cell):
    def __init__(self, op: nn.Cell, scale: float):
        super().__init__()
        self.op, self.scale = op, scale

    def construct(self, x):
        return self.op(x) * self.scale


class BroadcastFrom(_Paired):
    """Forward: every rank gets group index ``src``'s x. Backward: the sum of every rank's gradient, on ``src``;
    zero elsewhere (their x did not reach the output)."""

    def __init__(self, group: Group, src: int = 0):
        super().__init__(broadcast(group, src), _Scaled(all_reduce(group), 1.0 if group.index == src else 0.0))
