"""Process groups: joining the cluster, and the named groups of this rank's mesh (``core.parallel.dims`` says
which ranks form each; this module makes them MindSpore groups).

Every member rank must create a group (MindSpore's ``create_group`` is a rendezvous), in the same order relative
to the other groups it belongs to: ``mesh_groups`` creates them in one fixed order on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from mindspore.communication import GlobalComm, create_group, get_group_size, get_rank, init

from core.runtime.cluster import is_worker_process, wait_for_slow_peers

_GROUPS: dict[tuple[int, ...], Group] = {}


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    world_size: int = 1


def init_distributed() -> RankInfo:
    """Join the cluster when this process is a worker; a single process needs no communication at all."""
    if not is_worker_process():
        return RankInfo()
    wait_for_slow_peers()
    init()
    return RankInfo(rank=get_rank(), world_size=get_group_size())


@dataclass(frozen=True)
class Group:
    """A process group: its MindSpore name, its global ranks in group order, and this rank's index in it."""

    name: str
    ranks: tuple[int, ...]
    index: int

    @property
    def size(self) -> int:
        return len(self.ranks)


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
        name = GlobalComm.WORLD_COMM_GROUP
    else:
        name = f"{label}_" + "_".join(map(str, ranks))
        create_group(name, list(ranks))
    group = Group(name, ranks, ranks.index(rank))
    _GROUPS[ranks] = group
    return group


def mesh_groups(
    dims, names=("tp", "cp", "dp_shard", "dp_replicate", "pp", "batch", "fsdp", "loss", "shard", "model")
) -> dict:
    """{axis or view: Group} for this rank, created in one fixed order on every rank (so rendezvous match); with
    a pipeline, "embed" joins the first and the last stage (the two copies of a tied embedding), on those ranks."""
    world = dims.world_size
    if world > 1 and get_group_size() != world:
        raise RuntimeError(f"cluster of {get_group_size()} ranks for a mesh of {world}")
    groups = {n: new_group(dims.group_ranks(n), dims.rank, world, label=n) for n in names}
    stages = dims.group_ranks("pp")
    if dims.pp > 1 and dims.rank in (stages[0], stages[-1]):
        groups["embed"] = new_group((stages[0], stages[-1]), dims.rank, world, label="embed")
    return groups
