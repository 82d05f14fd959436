"""Expert parallelism (GShard, Lepikhin et al. 2021; DeepSpeed-MoE): each of ``ep`` ranks holds ``n_experts / ep``
of every MoE block's experts, and tokens travel to their expert and back by all-to-all.

A rank routes its own tokens into the (X, C, D) slot buffer as in one process (core.model.moe); the ``dispatch``
all-to-all sends expert block j's slots to rank j, which receives (X / ep, ep * C, D): its experts' slots from
every rank; the experts run; the ``combine`` all-to-all (the inverse) returns each rank its slots. Both are the
differentiable ``comm.AllToAll`` (backward: the inverse exchange), composed from all-gather on CPU.

The expert ranks are data-parallel ranks (``ep == dp_shard``; core.config says so): each routes a micro-batch
of the 1-process run, so capacity and the load-balance statistics are those of one process, and an expert's
gradient, made from the tokens of every rank that sent it some, is complete on its owner. The stacked expert
weights are split along dim 0 (a ``Placement`` block over the ep group, like a tensor-parallel block, so that
checkpoints consolidate them) and are not FSDP-sharded further; every other weight is, as usual.
"""

from __future__ import annotations

from mindspore import Parameter, Tensor, nn

from core.model.moe import moe_layers
from core.parallel import comm
from core.parallel.placement import Placement


def apply_expert_parallel(model: nn.Cell, group: comm.Group, placements: dict) -> None:
    for moe in moe_layers(model):
        for attr in ("w_gate", "w_up", "w_down"):
            old = getattr(moe.experts, attr)
            placement = Placement(tuple(old.shape), 0, group.size, group.index)
            setattr(moe.experts, attr, Parameter(Tensor(placement.tp_block(old.asnumpy())), name=old.name,
                                                 requires_grad=old.requires_grad))
            placements[old.name] = placement
        moe.dispatch = comm.AllToAll(group, split_dim=0, concat_dim=1)   # (X, C, D) -> (X / ep, ep C, D)
        moe.combine = comm.AllToAll(group, split_dim=1, concat_dim=0)    # and back
