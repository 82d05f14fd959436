"""Muon on sharded matrices: each matrix's Newton–Schulz computed once, by an owner rank, on the whole matrix.

Newton–Schulz orthogonalises a whole matrix; it does not act shard by shard (the singular vectors of a block are
not those of the matrix), so a sharded Muon must see each matrix whole to match the 1-process update. The design
of distributed Muon in MindFormers and torchtitan (after Liu et al. 2025, "Muon is Scalable for LLM Training"):

1. every rank forms its shards' Nesterov look-ahead N = g + mu * buf (element-wise: the momentum is sharded like
   the weight, so it costs no communication);
2. one all-gather over the ranks that hold one copy of the model (``shard`` = dp_shard * cp * tp) gives every
   rank every shard of every matrix;
3. each matrix has one owner (greedy by Newton–Schulz cost, largest first, onto the least loaded rank), which
   assembles the matrix, orthogonalises it and cuts the result back into every rank's shard;
4. one reduce-scatter (non-owners contribute zeros) hands every rank its shards of every result.

So the Newton–Schulz FLOPs are split over the group instead of repeated on every rank, for two collectives of
the size of the hidden matrices per step. On CPU, where each is composed from AllReduce
(``core.parallel.comm.collectives``), that trade is near even for 2 ranks at this project's sizes; on an
accelerator, with native collectives and Newton–Schulz the dominant optimizer cost, it wins, and it is what keeps
the update exact. Replicas over ``dp_replicate`` compute the same thing independently.
"""

from __future__ import annotations

from mindspore import mint, nn, ops

from core.optim.muon import newton_schulz
from core.parallel import comm
from core.parallel.placement import Placement
from core.runtime.graphs import each


def assign_owners(shapes: list[tuple[int, ...]], ranks: int) -> list[int]:
    """Owner rank of each matrix: largest Newton–Schulz cost first, each to the least loaded rank so far."""
    cost = [a * b * min(a, b) for a, b in shapes]  # ~ the Gram-matrix products of each iteration
    load, owner = [0] * ranks, [0] * len(shapes)
    for i in sorted(range(len(shapes)), key=lambda i: -cost[i]):
        r = min(range(ranks), key=lambda r: load[r])
        owner[i], load[r] = r, load[r] + cost[i]
    return owner


class ShardedNewtonSchulz(nn.Cell):
    """(this rank's shards of each matrix's look-ahead) -> (this rank's shards of each orthogonalised matrix)."""

    def __init__(self, placements: list[Placement], group: comm.Group, ns_steps: int):
        super().__init__()
        self.placements = tuple(placements)
        self.sizes = tuple(p.shard_len for p in placements)  # the block itself without FSDP
        self.length = sum(self.sizes)
        self.n, self.index, self.ns_steps = group.size, group.index, ns_steps
        self.tp = placements[0].tp_size if placements else 1
        self.fsdp = placements[0].fsdp_size if placements else 1
        if self.tp * self.fsdp != group.size or any(
            p.tp_size != self.tp or p.fsdp_size != self.fsdp for p in placements
        ):
            raise ValueError(f"the group of {group.size} ranks must be fsdp x tp of every matrix's placement")
        self.owned = tuple(owner == self.index for owner in assign_owners([p.full_shape for p in placements], self.n))
        self.stored_shapes = tuple(p.stored_shape for p in placements)
        self.gather = comm.all_gather(group, 0)
        self.scatter = comm.reduce_scatter(group, 0)

    # Spelled for MindSpore's graph compiler: per-matrix work as ``each`` (Map), splits as ``mint.split``.
    # ``ops.split`` into one section per matrix and a list comprehension over the matrices each compiled slowly
    # alone; spelled this way the whole graph compiles several times faster than as loops over matrices and
    # ranks, and runs faster on tp x fsdp, with the same values to the bit (benchmarks/sharded_muon_compile.py;
    # benchmarks/RESULTS.md, "Sharded Muon's update graph").
    def construct(self, looks):
        flat = mint.cat(each(_flatten, looks))  # (L,)
        every = self.gather(flat).reshape(self.n, self.length)  # (n, L)
        pieces = mint.split(every, self.sizes, dim=1)  # (n, size_i) each
        sends = each(
            ops.partial(_orthogonalise, self.tp, self.fsdp, self.ns_steps), pieces, self.owned, self.placements
        )  # (n, size_i) each
        # row g of the (n, L) concatenation is what group index g receives: the reduce-scatter's input order
        mine = self.scatter(mint.cat(sends, dim=1).reshape(-1))  # (L,)
        return each(_reshape, mint.split(mine, self.sizes), self.stored_shapes)


def _flatten(x):
    return x.reshape(-1)


def _reshape(x, shape):
    return x.reshape(shape)


def _orthogonalise(tp, fsdp, ns_steps, pieces, owned, p):
    """Every rank's shard of the orthogonalised matrix if this rank owns it, else zeros (the reduce-scatter sums)."""
    if owned:
        return cut(newton_schulz(assemble(pieces, p, tp, fsdp), ns_steps), p, tp, fsdp)
    return ops.zeros_like(pieces)


# Whole matrix <-> the (n, size) stack of every group index's flat shard, row g = fsdp_index * tp + tp_index: a few
# reshapes and transposes per matrix, whatever n.
def assemble(pieces, p: Placement, tp: int, fsdp: int):
    """pieces (tp * fsdp, size) -> the whole (2-D) matrix ``p.full_shape``; the inverse of ``cut``."""
    size = pieces.shape[1]
    x = pieces.reshape(fsdp, tp, size)
    if not p.tp_split:  # the tp ranks hold copies
        return x[:, 0].reshape(-1)[: p.local_numel].reshape(p.full_shape)
    rows, cols = p.local_shape
    blocks = ops.transpose(x, (1, 0, 2)).reshape(tp, fsdp * size)[:, : p.local_numel]  # (tp, rows * cols)
    if p.tp_dim == 0:
        return blocks.reshape(tp * rows, cols)
    return ops.transpose(blocks.reshape(tp, rows, cols), (1, 0, 2)).reshape(rows, tp * cols)


def cut(full, p: Placement, tp: int, fsdp: int):
    """The whole (2-D) matrix -> (tp * fsdp, shard_len): row g, the flat shard group index g holds (FSDP padding
    zero)."""
    numel, size = p.local_numel, p.shard_len
    if p.tp_split:
        rows, cols = p.local_shape
        blocks = (
            full.reshape(tp, numel)
            if p.tp_dim == 0
            else ops.transpose(full.reshape(rows, tp, cols), (1, 0, 2)).reshape(tp, numel)
        )  # (tp, numel)
    else:
        blocks = full.reshape(1, numel)
    pad = fsdp * size - numel
    if pad:
        blocks = ops.concat((blocks, ops.zeros((blocks.shape[0], pad), blocks.dtype)), axis=1)
    x = ops.transpose(blocks.reshape(-1, fsdp, size), (1, 0, 2))  # (fsdp, tp or 1, size)
    if not p.tp_split:
        x = ops.broadcast_to(x, (fsdp, tp, size))
    return x.reshape(fsdp * tp, size)
