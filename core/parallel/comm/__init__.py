"""Communication in Megatron's tiers: process groups, raw collectives, differentiable collectives (each paired
with its backward), and point-to-point messages.

    groups.py       init_distributed, Group, new_group, mesh_groups: this rank's named groups
    collectives.py  all_reduce, all_gather, reduce_scatter, broadcast, all_to_all: no gradient of their own; the
                    CPU compositions from AllReduce(sum) behind one switch
    mappings.py     CopyTo / ReduceFrom, GatherFrom / ReduceScatterTo, ScatterTo, GatherRepeated, AllToAll,
                    BroadcastFrom: bprop-Cells whose backward is the paired collective; enter_region
    p2p.py          send / recv between global ranks (pipeline stages), outside graphs
"""

from core.parallel.comm.collectives import (
    Identity,
    all_gather,
    all_reduce,
    all_reduce_max,
    all_to_all,
    broadcast,
    chunk,
    compose_from_all_reduce,
    reduce_scatter,
)
from core.parallel.comm.groups import Group, RankInfo, init_distributed, mesh_groups, new_group
from core.parallel.comm.mappings import (
    AllToAll,
    BroadcastFrom,
    CopyTo,
    GatherFrom,
    GatherRepeated,
    ReduceFrom,
    ReduceScatterTo,
    ScatterTo,
    enter_region,
    own_part,
)
from core.parallel.comm.p2p import enable_p2p, recv, send

__all__ = [
    "AllToAll",
    "BroadcastFrom",
    "CopyTo",
    "GatherFrom",
    "GatherRepeated",
    "Group",
    "Identity",
    "RankInfo",
    "ReduceFrom",
    "ReduceScatterTo",
    "ScatterTo",
    "all_gather",
    "all_reduce",
    "all_reduce_max",
    "all_to_all",
    "broadcast",
    "chunk",
    "compose_from_all_reduce",
    "enable_p2p",
    "enter_region",
    "init_distributed",
    "mesh_groups",
    "new_group",
    "own_part",
    "recv",
    "reduce_scatter",
    "send",
]
