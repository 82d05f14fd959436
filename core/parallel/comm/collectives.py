"""Raw collectives on a process group: Cells with no gradient of their own, usable in PyNative, inside
``mindspore.jit`` graphs and inside the ``bprop`` of other Cells (``core.parallel.comm.mappings`` pairs them into
differentiable ones). A factory returns an identity Cell for a group of one rank, so callers never branch on a
degree.

    all_reduce, all_reduce_max, all_gather, reduce_scatter, broadcast, all_to_all, chunk (no communication)

Devices: on Ascend (and GPU) the native kernels run. MindSpore 2.10's CPU collective library has AllReduce(sum)
on any group, AllGather and Broadcast only on the world group, and no ReduceScatter or AlltoAll (its
ReduceScatter returns success without writing its output). So on CPU every collective is composed from
AllReduce(sum): all-gather places the local block in a zero buffer and sums (n x the traffic of a native
all-gather); reduce-scatter sums and keeps the local block (2x); all-to-all all-gathers and selects. The choice is
made in one place, ``compose_from_all_reduce``.

Every rank must issue its collectives in the same order. Under ``mindspore.jit`` the order of independent
collectives is the graph scheduler's, so the compositions build the same graph on every rank, only constants
differing (the local block is placed by multiplying copies with 0/1 masks, not by rank-dependent concatenation):
with per-rank graph shapes, recompute reordered FSDP's gathers and paired mismatched AllReduces.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import mint, nn, ops

from core.parallel.comm.groups import Group


def compose_from_all_reduce() -> bool:
    """CPU workaround: compose every collective from AllReduce(sum) (module docstring says why)."""
    return ms.get_context("device_target") == "CPU"


class Identity(nn.Cell):
    """The collective of a group of one rank."""

    def construct(self, x):
        return x


class _AllReduce(nn.Cell):
    def __init__(self, group: Group):
        super().__init__()
        self.op = ops.AllReduce(group=group.name)

    def construct(self, x):
        return self.op(x)


class _AllReduceMax(nn.Cell):
    def __init__(self, group: Group):
        super().__init__()
        self.composed = compose_from_all_reduce()
        if self.composed:
            self.gather = _AllGather(group, 0)
        else:
            self.op = ops.AllReduce(op=ops.ReduceOp.MAX, group=group.name)

    def construct(self, x):
        if self.composed:  # (n, ...) of every rank's x, then the element-wise max
            return ops.amax(self.gather(x.expand_dims(0)), 0)
        return self.op(x)


def _along_dim(op, x, d: int):
    """A native collective that works along dim 0, applied along ``d``."""
    return op(x) if d == 0 else mint.movedim(op(mint.movedim(x, d, 0)), 0, d)


class _AllGather(nn.Cell):
    """Concatenate every rank's x along ``dim`` in group order (same shape on every rank)."""

    def __init__(self, group: Group, dim: int):
        super().__init__()
        self.dim, self.n, self.index = dim, group.size, group.index
        self.composed = compose_from_all_reduce()
        if self.composed:
            self.op = ops.AllReduce(group=group.name)
            self.mask = ms.Tensor(np.eye(group.size, dtype=np.float32)[group.index])  # (n,): 1 at this rank
        else:
            self.op = ops.AllGather(group=group.name)

    def construct(self, x):
        d = self.dim
        if self.composed:  # the local block at its offset among zeros, summed over ranks
            # One broadcast multiply, (..., 1, s_d, ...) x (n, 1, ..., 1) -> (..., n, s_d, ...), then the n blocks
            # merged into dim d. Not a concat of n masked copies from a list comprehension, which compiles several
            # times slower, and a dp_shard=4 trial takes less CPU this way (benchmarks/RESULTS.md,
            # "FSDP's forward+backward graph").
            mask = self.mask.astype(x.dtype).reshape((self.n,) + (1,) * (x.ndim - d))
            blocks = x.expand_dims(d) * mask
            return self.op(blocks.reshape(x.shape[:d] + (self.n * x.shape[d],) + x.shape[d + 1 :]))
        return _along_dim(self.op, x, d)


class _ReduceScatter(nn.Cell):
    """Sum over ranks, then keep this rank's block of ``dim`` (which must divide by the group size)."""

    def __init__(self, group: Group, dim: int):
        super().__init__()
        self.dim, self.n, self.index = dim, group.size, group.index
        self.composed = compose_from_all_reduce()
        if self.composed:
            self.op = ops.AllReduce(group=group.name)
        else:
            self.op = ops.ReduceScatter(group=group.name)

    def construct(self, x):
        d = self.dim
        if self.composed:
            # A view, not a Slice kernel (ops.slice): MindSpore rewrites AllReduce + Slice into its ReduceScatter,
            # which fails on CPU (measured with dp_shard=4: "RunRingAllReduce Memcpy error")
            return mint.narrow(self.op(x), d, self.index * (x.shape[d] // self.n), x.shape[d] // self.n)
        return _along_dim(self.op, x, d)


class _Chunk(nn.Cell):
    """This rank's block of ``dim`` (no communication)."""

    def __init__(self, group: Group, dim: int):
        super().__init__()
        self.dim, self.n, self.index = dim, group.size, group.index

    def construct(self, x):
        n = x.shape[self.dim] // self.n
        return mint.narrow(x, self.dim, self.index * n, n)


class _Broadcast(nn.Cell):
    """Every rank gets the x of group index ``src``."""

    def __init__(self, group: Group, src: int = 0):
        super().__init__()
        self.scale = 1.0 if group.index == src else 0.0  # the same graph on every rank (module docstring)
        self.composed = compose_from_all_reduce()
        if self.composed:
            self.op = ops.AllReduce(group=group.name)
        else:
            self.op = ops.Broadcast(root_rank=group.ranks[src], group=group.name)

    def construct(self, x):
        if self.composed:
            return self.op(x * self.scale)
        return self.op((x,))[0]


class _AllToAll(nn.Cell):
    """Rank i splits x into n blocks along ``split_dim`` and sends block j to rank j; each rank concatenates the
    blocks it receives along ``concat_dim`` in group order."""

    def __init__(self, group: Group, split_dim: int, concat_dim: int):
        super().__init__()
        self.split_dim, self.concat_dim, self.n, self.index = split_dim, concat_dim, group.size, group.index
        self.composed = compose_from_all_reduce()
        if self.composed:
            self.gather = _AllGather(group, 0)
        else:
            self.op = ops.AlltoAll(split_count=group.size, split_dim=split_dim, concat_dim=concat_dim, group=group.name)

    def construct(self, x):
        if not self.composed:
            return self.op(x)
        every = self.gather(x.expand_dims(0))  # (n, *x.shape): every rank's x
        size = x.shape[self.split_dim] // self.n
        mine = mint.narrow(every, self.split_dim + 1, self.index * size, size)  # (n, *block): my block from each
        c = self.concat_dim  # the n blocks concatenated along c: move the rank axis before c, merge the two
        moved = ops.transpose(mine, tuple(range(1, c + 1)) + (0,) + tuple(range(c + 1, mine.ndim)))
        block = mine.shape[1:]
        return moved.reshape(block[:c] + (self.n * block[c],) + block[c + 1 :])


def all_reduce(group: Group) -> nn.Cell:
    """Sum over the group."""
    return Identity() if group.size == 1 else _AllReduce(group)


def all_reduce_max(group: Group) -> nn.Cell:
    """Element-wise max over the group."""
    return Identity() if group.size == 1 else _AllReduceMax(group)


def all_gather(group: Group, dim: int = 0) -> nn.Cell:
    return Identity() if group.size == 1 else _AllGather(group, dim)


def reduce_scatter(group: Group, dim: int = 0) -> nn.Cell:
    return Identity() if group.size == 1 else _ReduceScatter(group, dim)


def broadcast(group: Group, src: int = 0) -> nn.Cell:
    return Identity() if group.size == 1 else _Broadcast(group, src)


def all_to_all(group: Group, split_dim: int, concat_dim: int) -> nn.Cell:
    return Identity() if group.size == 1 else _AllToAll(group, split_dim, concat_dim)


def chunk(group: Group, dim: int) -> nn.Cell:
    return Identity() if group.size == 1 else _Chunk(group, dim)
