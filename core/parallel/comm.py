"""Collectives on named process groups, each paired with its backward (Megatron-LM's ``mappings.py``).

Two layers:

- **Raw collectives** (``all_reduce``, ``all_reduce_max``, ``all_gather``, ``reduce_scatter``, ``broadcast``,
  ``all_to_all``): Cells with no gradient of their own, usable in PyNative, inside ``mindspore.jit`` graphs and
  inside the ``bprop`` of other Cells. A factory returns an identity Cell for a group of one rank, so callers
  never branch on a degree.
- **Differentiable collectives**: bprop-Cells (the form whose gradients survive ``mindspore.jit``,
  MINDSPORE_CPU.md), named for what their forward does:

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
  ``ReduceFrom``) counts once. ``ScatterTo`` and ``GatherRepeated`` may take a permutation (``order``) between
  the group-order concatenation and the whole (context parallelism's chunks are not in sequence order).

Devices: on Ascend (and GPU) the native kernels run. MindSpore 2.10's CPU collective library has AllReduce(sum)
on any group, AllGather and Broadcast only on the world group, and no ReduceScatter or AlltoAll (its
ReduceScatter returns success without writing its output). So on CPU every collective is composed from
AllReduce(sum): all-gather places the local block in a zero buffer and sums (n x the traffic of a native
all-gather); reduce-scatter sums and keeps the local block (2x); all-to-all all-gathers and selects. The choice is
made in one place, ``_compose_from_all_reduce``.

Every rank must issue its collectives in the same order. Under ``mindspore.jit`` the order of independent
collectives is the graph scheduler's, so the compositions build the same graph on every rank, only constants
differing (the local block is placed by multiplying copies with 0/1 masks, not by rank-dependent concatenation):
with per-rank graph shapes, recompute reordered FSDP's gathers and paired mismatched AllReduces (measured).

Point-to-point ``send``/``recv`` (pipeline stages) run outside graphs, through ``mindspore.mint.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import mint, nn, ops

_GROUPS: dict[tuple[int, ...], "Group"] = {}


def _compose_from_all_reduce() -> bool:
    """CPU workaround: compose every collective from AllReduce(sum) (module docstring says why)."""
    return ms.get_context("device_target") == "CPU"


@dataclass(frozen=True)
class Group:
    """A process group: its MindSpore name, its global ranks in group order, and this rank's index in it."""

    name: str
    ranks: tuple[int, ...]
    index: int

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def src_rank(self) -> int:
        return self.ranks[0]


def new_group(ranks: tuple[int, ...], rank: int, world_size: int, label: str = "g") -> Group:
    """The group over ``ranks`` (global ranks, in group order) for this ``rank``, created once per process.

    Every member rank must call this for the group (MindSpore's ``create_group`` rendezvous), in the same order
    relative to other groups it belongs to: ``ParallelDims``-driven callers iterate one fixed list of axes.
    """
    ranks = tuple(int(r) for r in ranks)
    if rank not in ranks:
        raise ValueError(f"rank {rank} is not in group {ranks}")
    if ranks in _GROUPS:
        return _GROUPS[ranks]
    if len(ranks) == 1:
        name = f"self_{rank}"
    elif ranks == tuple(range(world_size)):
        from mindspore.communication import GlobalComm

        name = GlobalComm.WORLD_COMM_GROUP
    else:
        from mindspore.communication import create_group

        name = f"{label}_" + "_".join(map(str, ranks))
        create_group(name, list(ranks))
    group = Group(name, ranks, ranks.index(rank))
    _GROUPS[ranks] = group
    return group


# ---- raw collectives -----------------------------------------------------------------------------------------


class _Identity(nn.Cell):
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
        self.composed = _compose_from_all_reduce()
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
        self.composed = _compose_from_all_reduce()
        if self.composed:
            self.op = ops.AllReduce(group=group.name)
            self.mask = ms.Tensor(np.eye(group.size, dtype=np.float32)[group.index])  # (n,): 1 at this rank
        else:
            self.op = ops.AllGather(group=group.name)

    def construct(self, x):
        d = self.dim
        if self.composed:  # the local block at its offset among zeros, summed over ranks
            # One broadcast multiply, (..., 1, s_d, ...) x (n, 1, ..., 1) -> (..., n, s_d, ...), then the n blocks
            # merged into dim d. Not a concat of n masked copies from a list comprehension, which compiles slowly
            # (30 gathers over 4 ranks in one graph: 9-11 s against 3.2-3.4 s; a dp_shard=4 trial: ~10% less CPU).
            mask = self.mask.astype(x.dtype).reshape((self.n,) + (1,) * (x.ndim - d))
            blocks = x.expand_dims(d) * mask
            return self.op(blocks.reshape(x.shape[:d] + (self.n * x.shape[d],) + x.shape[d + 1:]))
        return _along_dim(self.op, x, d)


class _ReduceScatter(nn.Cell):
    """Sum over ranks, then keep this rank's block of ``dim`` (which must divide by the group size)."""

    def __init__(self, group: Group, dim: int):
        super().__init__()
        self.dim, self.n, self.index = dim, group.size, group.index
        self.composed = _compose_from_all_reduce()
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
        self.composed = _compose_from_all_reduce()
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
        self.composed = _compose_from_all_reduce()
        if self.composed:
            self.gather = _AllGather(group, 0)
        else:
            self.op = ops.AlltoAll(split_count=group.size, split_dim=split_dim, concat_dim=concat_dim,
                                   group=group.name)

    def construct(self, x):
        if not self.composed:
            return self.op(x)
        every = self.gather(x.expand_dims(0))                       # (n, *x.shape): every rank's x
        size = x.shape[self.split_dim] // self.n
        mine = mint.narrow(every, self.split_dim + 1, self.index * size, size)  # (n, *block): my block from each
        c = self.concat_dim  # the n blocks concatenated along c: move the rank axis before c, merge the two
        moved = ops.transpose(mine, tuple(range(1, c + 1)) + (0,) + tuple(range(c + 1, mine.ndim)))
        block = mine.shape[1:]
        return moved.reshape(block[:c] + (self.n * block[c],) + block[c + 1:])


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
        self.take = _Identity() if order is None else _Take(order, dim)

    def construct(self, x):
        return self.take(self.gather(x))


def _own(group: Group, dim: int, order=None) -> nn.Cell:
    """This rank's block of a whole made by ``_GatherOrdered(group, dim, order)``."""
    if order is None:
        return chunk(group, dim)
    n = len(order) // group.size
    return _Take(np.argsort(order)[group.index * n:(group.index + 1) * n], dim)


def all_reduce(group: Group) -> nn.Cell:
    """Sum over the group."""
    return _Identity() if group.size == 1 else _AllReduce(group)


def all_reduce_max(group: Group) -> nn.Cell:
    """Element-wise max over the group."""
    return _Identity() if group.size == 1 else _AllReduceMax(group)


def all_gather(group: Group, dim: int = 0) -> nn.Cell:
    return _Identity() if group.size == 1 else _AllGather(group, dim)


def reduce_scatter(group: Group, dim: int = 0) -> nn.Cell:
    return _Identity() if group.size == 1 else _ReduceScatter(group, dim)


def broadcast(group: Group, src: int = 0) -> nn.Cell:
    return _Identity() if group.size == 1 else _Broadcast(group, src)


def all_to_all(group: Group, split_dim: int, concat_dim: int) -> nn.Cell:
    return _Identity() if group.size == 1 else _AllToAll(group, split_dim, concat_dim)


def chunk(group: Group, dim: int) -> nn.Cell:
    return _Identity() if group.size == 1 else _Chunk(group, dim)


# ---- differentiable collectives ---------------------------------------------------------------------------------
# Forward and backward get separate raw Cells: under jit, a helper called from both a bprop-Cell's construct and
# its bprop can fail to compile (core/loss.py).


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


class ReduceScatterTo(_Paired):
    """Forward: reduce-scatter along ``dim``. Backward: all-gather along ``dim``."""

    def __init__(self, group: Group, dim: int):
        super().__init__(reduce_scatter(group, dim), all_gather(group, dim))


class ScatterTo(_Paired):
    """Forward: keep this rank's block of ``dim``. Backward: all-gather along ``dim`` (a whole of length L
    permuted by ``order`` (L,), if given, as in ``GatherRepeated``)."""

    def __init__(self, group: Group, dim: int, order=None):
        super().__init__(_own(group, dim, order), _GatherOrdered(group, dim, order))


class GatherRepeated(_Paired):
    """Forward: all-gather along ``dim`` (then permuted by ``order``: entry i of the whole is entry ``order[i]``
    of the group-order concatenation). Backward: this rank's block of the gradient, which every rank holds whole
    because the whole feeds a computation every rank repeats (Megatron's gather without reduce-scatter)."""

    def __init__(self, group: Group, dim: int, order=None):
        super().__init__(_GatherOrdered(group, dim, order), _own(group, dim, order))


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


# ---- point to point (outside graphs: pipeline stages) -------------------------------------------------------------

_P2P_READY = False


def enable_p2p() -> None:
    """CPU workaround: ``mint.distributed.send``/``recv`` look up a group named "hccl_world_group", which the CPU
    backend never creates (MINDSPORE_CPU.md); creating it over every rank makes them work. Ascend has it.
    Every rank must call this at the same point (group creation is a rendezvous): pipelines call it at set-up."""
    global _P2P_READY
    if _P2P_READY:
        return
    if _compose_from_all_reduce():
        from mindspore.communication import create_group, get_group_size

        create_group("hccl_world_group", list(range(get_group_size())))
    _P2P_READY = True


def send(x: ms.Tensor, dst: int) -> None:
    """Send ``x`` to global rank ``dst``. On CPU the send is buffered (it returns before the receiver posts its
    ``recv``: measured up to 16 MB); messages between two ranks arrive in the order they were sent."""
    enable_p2p()
    mint.distributed.send(x, dst)


def recv(shape: tuple[int, ...], dtype, src: int) -> ms.Tensor:
    """Receive a tensor of ``shape``/``dtype`` from global rank ``src`` (blocking)."""
    enable_p2p()
    out = ops.zeros(shape, dtype)
    mint.distributed.recv(out, src)
    return out


def mesh_groups(dims, names=("tp", "cp", "dp_shard", "dp_replicate", "pp", "batch", "fsdp", "loss", "shard",
                              "model")) -> dict:
    """{axis or view: Group} for this rank, created in one fixed order on every rank (so rendezvous match); with
    a pipeline, "embed" joins the first and the last stage (the two copies of a tied embedding), on those ranks."""
    import mindspore.communication as comm

    world = dims.world_size
    if world > 1 and comm.get_group_size() != world:
        raise RuntimeError(f"cluster of {comm.get_group_size()} ranks for a mesh of {world}")
    groups = {n: new_group(dims.group_ranks(n), dims.rank, world, label=n) for n in names}
    stages = dims.group_ranks("pp")
    if dims.pp > 1 and dims.rank in (stages[0], stages[-1]):
        groups["embed"] = new_group((stages[0], stages[-1]), dims.rank, world, label="embed")
    return groups
