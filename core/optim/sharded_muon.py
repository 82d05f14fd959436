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
the size of the hidden matrices per step. On CPU, where each is composed from AllReduce (comm.py), that trade is
near even for 2 ranks at this project's sizes; on an accelerator, with native collectives and Newton–Schulz the
dominant optimizer cost, it wins, and it is what keeps the update exact. Replicas over ``dp_replicate`` compute
the same thing independently.
"""

from __future__ import annotations

from mindspore import mint, nn, ops

from core.optim.muon import newton_schulz
from core.parallel import comm
from core.parallel.placement import Placement


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
        self.sizes = tuple(p.shard_len if p.fsdp_size > 1 else p.local_numel for p in placements)
        self.offsets = tuple(sum(self.sizes[:i]) for i in range(len(placements)))
        self.length = sum(self.sizes)
        self.n, self.index, self.ns_steps = group.size, group.index, ns_steps
        self.tp = placements[0].tp_size if placements else 1
        self.fsdp = placements[0].fsdp_size if placements else 1
        if self.tp * self.fsdp != group.size or any(p.tp_size != self.tp or p.fsdp_size != self.fsdp
                                                     for p in placements):
            raise ValueError(f"the group of {group.size} ranks must be fsdp x tp of every matrix's placement")
        self.owner = tuple(assign_owners([p.full_shape for p in placements], group.size))
        self.gather = comm.all_gather(group, 0)
        self.scatter = comm.reduce_scatter(group, 0)

    def _assemble(self, pieces, p: Placement):
        """pieces (n, size): row g = group index g's shard (g = fsdp_index * tp + tp_index) -> the full matrix."""
        blocks = []
        for t in range(self.tp if p.tp_split else 1):
            flat = mint.cat([pieces[f * self.tp + t] for f in range(self.fsdp)]) if self.fsdp > 1 else pieces[t]
            blocks.append(flat[:p.local_numel].reshape(p.local_shape))
        return mint.cat(blocks, dim=p.tp_dim) if len(blocks) > 1 else blocks[0]

    def _cut(self, full, p: Placement, g: int):
        """The shard of ``full`` that group index g holds, flat."""
        t, f = g % self.tp, g // self.tp
        block = mint.narrow(full, p.tp_dim, t * p.local_shape[p.tp_dim], p.local_shape[p.tp_dim]) \
            if p.tp_split else full
        flat = block.reshape(-1)
        if self.fsdp == 1:
            return flat
        pad = p.shard_len * self.fsdp - p.local_numel
        if pad:
            flat = ops.concat((flat, ops.zeros((pad,), flat.dtype)))
        return flat[f * p.shard_len:(f + 1) * p.shard_len]

    def construct(self, looks):
        flat = mint.cat([x.reshape(-1) for x in looks])                             # (L,)
        every = self.gather(flat).reshape(self.n, self.length)                      # (n, L)
        rows = [[] for _ in range(self.n)]                                          # per destination rank
        for i in range(len(self.placements)):
            p, off, size = self.placements[i], self.offsets[i], self.sizes[i]
            if self.owner[i] == self.index:
                orth = newton_schulz(self._assemble(every[:, off:off + size], p), self.ns_steps)
                for g in range(self.n):
                    rows[g].append(self._cut(orth, p, g))
            else:
                for g in range(self.n):
                    rows[g].append(ops.zeros((size,), flat.dtype))
        mine = self.scatter(mint.cat([mint.cat(r) for r in rows]))                 # (L,): sum of (n*L,)
        out = []
        for i in range(len(self.placements)):
            p = self.placements[i]
            out.append(mine[self.offsets[i]:self.offsets[i] + self.sizes[i]].reshape(p.stored_shape))
        return tuple(out)
