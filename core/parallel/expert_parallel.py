"""MoE blocks on the mesh: expert parallelism (GShard, Lepikhin et al. 2021; DeepSpeed-MoE), experts split by width
over tensor-parallel ranks (Megatron's expert tensor parallelism), and routing over a sequence that context or
sequence parallelism has split — each exact against one process.

Expert parallelism. Each of ``ep`` ranks holds ``n_experts / ep`` of every MoE block's experts. A rank routes its
micro-batch into the (X, C, D) slot buffer as in one process (core.model.moe); the ``dispatch`` all-to-all sends
expert block j's slots to rank j, which receives (X / ep, ep * C, D): its experts' slots from every rank; the
experts run; the ``combine`` all-to-all (the inverse) returns each rank its slots. Both are the differentiable
``comm.AllToAll`` (backward: the inverse exchange), composed from all-gather on CPU. The expert ranks are the
data-parallel ``dp_shard`` ranks (``ep == dp_shard``; core.config says so): each routes a micro-batch of the
1-process run, so capacity and the load-balance statistics are those of one process, and an expert's gradient,
made from the tokens of every rank that sent it some, is complete on its owner. Experts are not FSDP-sharded:
their ep block is already the rank's share.

Tensor parallelism. Each expert's SwiGLU is split like a dense MLP: w_gate, w_up by output rows, w_down by input
columns (the width F, ``placement.TP_SPLIT_DIMS``); the slots enter the region with ``CopyTo`` and leave it with
``ReduceFrom``, after the dispatch and before the combine. The router and the routing are repeated on every
tensor-parallel rank, on the same tokens, so every rank routes alike.

A split sequence (context parallelism, or sequence parallelism with tp). Routing must see the micro-batch's whole
sequence in order: capacity is per micro-batch and drops go to later tokens first. So the block all-gathers the
sequence (``comm.GatherRepeated``, permuted from the context-parallel chunks' order into sequence order), routes
and runs the experts on it on every rank of the group, and keeps its own tokens (``comm.ScatterTo``). The router
runs on the rank's own tokens and its logits are gathered the same way, so its weight's gradient is a partial sum
over the rank's tokens like every other replicated weight's under SP or CP (summed after backward). The cost is
expert compute repeated cp (x tp with SP) times — on an accelerator one would split tokens instead and accept
per-rank capacity; this project's contract is exactness against one process.
"""

from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn

from core.model.moe import moe_layers
from core.parallel import comm
from core.parallel.context_parallel import key_positions
from core.parallel.dims import ParallelDims
from core.parallel.placement import layout_placement


def sequence_order(seq_len: int, cp: int) -> np.ndarray:
    """(S,): entry i is where sequence position i sits in the concatenation, in group order, of the parts of the
    ranks that split a sequence (cp-major: each context-parallel rank's two chunks, cut in tp parts with SP)."""
    return np.argsort(key_positions(seq_len, cp)).astype(np.int32)


def apply_moe_parallel(model: nn.Cell, dims: ParallelDims, groups: dict, placements: dict, seq_len: int) -> None:
    """Split every MoE block's experts over ``ep`` (the dp_shard ranks) and ``tp``, and route over the whole
    sequence when context or sequence parallelism splits it (see the module docstring)."""
    moes = moe_layers(model)
    axes = (("cp",) if dims.cp > 1 else ()) + (("tp",) if dims.sp and dims.tp > 1 else ())
    if not moes or (dims.ep == dims.tp == 1 and not axes):
        return
    split = order = None
    if axes:
        split = (
            groups[axes[0]]
            if len(axes) == 1
            else comm.new_group(dims.group_ranks(*axes), dims.rank, dims.world_size, label="sequence")
        )
        order = sequence_order(seq_len, dims.cp) if dims.cp > 1 else None
    ep, tp = groups["dp_shard"] if dims.ep > 1 else None, groups["tp"] if dims.tp > 1 else None
    for moe in moes:
        for attr in ("w_gate", "w_up", "w_down"):
            old = getattr(moe.experts, attr)
            p = layout_placement(
                old.name, old.shape, dims.tp, 1, ep=dims.ep, tp_index=dims.index("tp"), ep_index=dims.index("dp_shard")
            )
            setattr(
                moe.experts,
                attr,
                Parameter(Tensor(p.block(old.asnumpy())), name=old.name, requires_grad=old.requires_grad),
            )
            placements[old.name] = p
        if split is not None:  # (B, s, .) -> (B, S, .) -> (B, s, .)
            moe.gather_tokens = comm.GatherRepeated(split, 1, order)
            moe.gather_logits = comm.GatherRepeated(split, 1, order)
            moe.take_tokens = comm.ScatterTo(split, 1, order)
            # The cp ranks' losses average into the global loss, but their load-balance losses are one micro-batch's
            # computed cp times, and each rank's router receives only its tokens' share of the gradient: the shares
            # add up to one copy, which the average then divides by cp. (tp ranks share one loss: no factor.)
            moe.aux_loss.scale *= dims.cp
            moe.router.regather_after_grad = True  # (core.parallel.fsdp: ordered against the sequence gathers)
        dispatch, combine = [], []
        if ep is not None:
            dispatch.append(comm.AllToAll(ep, split_dim=0, concat_dim=1))  # (X, C, D) -> (X / ep, ep C, D)
            combine.append(comm.AllToAll(ep, split_dim=1, concat_dim=0))  # and back
        if tp is not None:
            dispatch.append(comm.CopyTo(tp))
            combine.insert(0, comm.ReduceFrom(tp))
        if dispatch:
            moe.dispatch, moe.combine = nn.SequentialCell(dispatch), nn.SequentialCell(combine)
