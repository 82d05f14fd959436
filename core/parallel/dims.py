"""ParallelDims: the device mesh of one trial, its coordinates and the rank lists of its process groups.

The mesh is laid out outermost first as ``MESH`` = (pp, dp_replicate, dp_shard, cp, tp), row-major, so ``tp`` is
innermost: tensor-parallel peers are neighbouring ranks, which a launcher places on one host (the heaviest,
most frequent traffic), as in Megatron and torchtitan. ``ep`` borrows ranks (today: the dp_shard ranks) and
adds no axis.

Flattened views (torchtitan's names):

    batch = dp_replicate * dp_shard       ranks that read different rows of the global batch
    fsdp  = dp_shard * cp                 ranks over which parameters, gradients and optimizer states are sharded
    loss  = dp_replicate * dp_shard * cp  ranks whose losses average into the global loss
    shard = dp_shard * cp * tp            ranks that together hold one copy of a pipeline stage
    model = pp * dp_shard * cp * tp       ranks that together hold one copy of the model

This module is pure Python: it knows which ranks form a group; ``core.parallel.comm`` turns a rank list into a
MindSpore process group. The rules that make a layout valid for a model (heads, vocabulary, sequence, batch)
are checked with the rest of the config, before any process starts (``core.config``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.config import ConfigError, ParallelConfig

MESH = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
VIEWS = {
    "batch": ("dp_replicate", "dp_shard"),
    "fsdp": ("dp_shard", "cp"),
    "loss": ("dp_replicate", "dp_shard", "cp"),
    "shard": ("dp_shard", "cp", "tp"),
    "model": ("pp", "dp_shard", "cp", "tp"),
}


@dataclass(frozen=True)
class ParallelDims:
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    sp: bool = False
    rank: int = 0
    ep: int = 1  # not a mesh axis: expert parallelism runs over the dp_shard ranks (core.parallel.expert_parallel)

    @classmethod
    def from_config(cls, p: ParallelConfig, rank: int = 0, world_size: int | None = None) -> ParallelDims:
        """The mesh of ``p`` seen from ``rank``; ``world_size`` (the cluster's) must equal the degrees' product."""
        dims = cls(
            pp=p.pp, dp_replicate=p.dp_replicate, dp_shard=p.dp_shard, cp=p.cp, tp=p.tp, sp=p.sp, rank=rank, ep=p.ep
        )
        if world_size is not None and world_size != dims.world_size:
            raise ConfigError(
                "parallel",
                f"the degrees multiply to {dims.world_size} ranks ("
                f"{' * '.join(f'{a}={dims.degree(a)}' for a in MESH)}) but the cluster "
                f"has {world_size}; set the degrees so that their product is the "
                "number of ranks, or start that many",
            )
        if not 0 <= rank < dims.world_size:
            raise ValueError(f"rank {rank} outside a world of {dims.world_size}")
        return dims

    @property
    def world_size(self) -> int:
        return math.prod(self.degree(a) for a in MESH)

    def degree(self, axis: str) -> int:
        return getattr(self, axis)

    def _axes(self, names: tuple[str, ...]) -> tuple[str, ...]:
        out: list[str] = []
        for n in names:
            out.extend(VIEWS.get(n, (n,)))
        for a in out:
            if a not in MESH:
                raise ValueError(f"unknown mesh axis {a!r}; axes: {MESH}, views: {tuple(VIEWS)}")
        return tuple(a for a in MESH if a in out)  # mesh order, so group order is rank order

    # ---- coordinates ---------------------------------------------------------------------------------------
    def coords(self, rank: int | None = None) -> dict[str, int]:
        """{axis: index} of ``rank`` (default: this rank)."""
        r = self.rank if rank is None else rank
        out = {}
        for a in reversed(MESH):
            out[a] = r % self.degree(a)
            r //= self.degree(a)
        return {a: out[a] for a in MESH}

    def rank_of(self, coords: dict[str, int]) -> int:
        r = 0
        for a in MESH:
            r = r * self.degree(a) + coords[a]
        return r

    def size(self, *names: str) -> int:
        """Ranks in the group spanned by these axes or views, e.g. ``size("fsdp")``."""
        return math.prod(self.degree(a) for a in self._axes(names))

    def index(self, *names: str) -> int:
        """This rank's position in the group spanned by ``names`` (row-major over the axes, in mesh order)."""
        c, idx = self.coords(), 0
        for a in self._axes(names):
            idx = idx * self.degree(a) + c[a]
        return idx

    def group_ranks(self, *names: str) -> tuple[int, ...]:
        """Global ranks of this rank's group over ``names``: those that differ from it only on those axes,
        ordered by their ``index`` in the group."""
        axes = self._axes(names)
        mine = self.coords()
        ranks = []
        for i in range(self.size(*names)):
            c, rest = dict(mine), i
            for a in reversed(axes):
                c[a] = rest % self.degree(a)
                rest //= self.degree(a)
            ranks.append(self.rank_of(c))
        return tuple(ranks)

    def describe(self) -> str:
        on = [f"{a}={self.degree(a)}" for a in MESH if self.degree(a) > 1] + (["sp"] if self.sp else [])
        return " ".join(on) or "single process"
