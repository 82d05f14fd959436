"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) and sequence parallelism (Korthikanti et al. 2022).

Each block's two matmul pairs are split so that only two all-reduces per block pass each way:

    attention:  wq, wk, wv column-parallel (heads split: rank t holds heads [t*H/tp, (t+1)*H/tp) and the KV heads
                they read), wo row-parallel (its input columns split the same way); MLA's up-projections wq_b
                (or wq) and wkv_b column-parallel, its down-projections and their norms replicated (per token,
                on this rank's tokens), the shared RoPE key entering the heads like a column-parallel input
    MLP:        w_gate, w_up column-parallel (FFN width split), w_down row-parallel
    embedding:  vocab-parallel rows; a token outside this rank's rows reads zeros, and the ranks' rows are summed
    head:       vocab-parallel rows, the loss computed without gathering logits (``vocab_parallel_loss``)

A region is entered with ``CopyTo`` (identity; all-reduce of the input gradient) and a row-parallel op leaves it
with ``ReduceFrom`` (all-reduce of the partial outputs). Attention's q/k/v and the MLP's gate/up read one input,
so the entry is their region's ``enter`` seam, once for all of them (as Megatron's fused QKV and gate/up matmuls):
the input gradients of the three (two) projections are summed on the rank, then reduced once, and under sequence
parallelism one gathered input is saved for their weight gradients, not one each. MLA's up-projections read
latents of their own, so each enters by its own ``ColumnParallel``. With sequence parallelism the norm/residual
regions hold 1/tp of the sequence: the entry all-gathers the sequence (``GatherFrom``, backward reduce-scatter)
and the exit reduce-scatters it (``ReduceScatterTo``, backward all-gather) — the same traffic as the all-reduce
they replace, with the norm and residual activations divided by tp. The norm gains then see a
slice of the tokens each, so their gradients are summed over the group after backward (``GradientSync``).

Only ops, seams and weights change here; the model code is untouched (its ``op`` and ``enter`` seams,
core.model.layers).
"""

from __future__ import annotations

from mindspore import Parameter, Tensor, nn, ops

from core.model.gpt import transformer_blocks
from core.model.layers import MLP, Attention, Linear
from core.model.mla import MLAttention
from core.parallel import comm
from core.parallel.placement import Placement, tp_split_dim
from core.parallel.vocab_parallel_loss import VocabParallelCrossEntropyLoss


class ColumnParallel(nn.Cell):
    """op(enter_region(x), W_t): this rank's output columns, for an op that enters its region alone (MLA's)."""

    def __init__(self, op: nn.Cell, group: comm.Group, sequence_parallel: bool):
        super().__init__()
        self.op = op
        self.enter = comm.enter_region(group, sequence_parallel)

    def construct(self, x, w):
        return self.op(self.enter(x), w)


class RowParallel(nn.Cell):
    """leave(op(x_t, W_t)): partial sums over the input columns, all-reduced (or reduce-scattered on the sequence
    with SP)."""

    def __init__(self, op: nn.Cell, group: comm.Group, sequence_parallel: bool):
        super().__init__()
        self.op = op
        self.leave = comm.ReduceScatterTo(group, 1) if sequence_parallel else comm.ReduceFrom(group)

    def construct(self, x, w):
        return self.leave(self.op(x, w))


# Primitives, not the functional ops.where / ops.zeros_like: the FSDP wrapper calls an op from its bprop too, and
# MindSpore's graph compiler refuses a function with a Python branch called from both a construct and a bprop.
_select, _zeros_like, _logical_and = ops.Select(), ops.ZerosLike(), ops.LogicalAnd()


class VocabParallelLookup(nn.Cell):
    """(tokens (B, S), rows [start, start + V/tp) of the table) -> (B, S, D) summed over the group (each token's
    row lives on one rank; the others contribute zeros); with SP, reduce-scattered to (B, S/tp, D)."""

    def __init__(self, op: nn.Cell, group: comm.Group, *, start: int, rows: int, sequence_parallel: bool):
        super().__init__()
        self.op, self.start, self.rows = op, start, rows
        self.leave = comm.ReduceScatterTo(group, 1) if sequence_parallel else comm.ReduceFrom(group)

    def construct(self, tokens, table):
        local = tokens - self.start
        here = _logical_and(local >= 0, local < self.rows)  # (B, S)
        rows = self.op(_select(here, local, _zeros_like(local)), table)  # (B, S, D)
        mask = ops.BroadcastTo(rows.shape)(here.astype(rows.dtype).expand_dims(-1))
        return self.leave(rows * mask)


def _split(cell: nn.Cell, group: comm.Group, placements: dict) -> Placement:
    """Replace ``cell.weight`` by this rank's block along its ``tp_split_dim`` (same Parameter name), record it."""
    old = cell.weight
    placement = Placement(tuple(old.shape), tp_split_dim(old.name), group.size, group.index)
    cell.weight = Parameter(Tensor(placement.block(old.asnumpy())), name=old.name, requires_grad=old.requires_grad)
    placements[old.name] = placement
    return placement


def apply_tensor_parallel(
    model: nn.Cell, group: comm.Group, sequence_parallel: bool, placements: dict
) -> tuple[nn.Cell, nn.Cell]:
    """Split ``model``'s weights and wrap their ops for tensor (and sequence) parallelism over ``group``, recording
    each split weight's placement; returns the vocab-parallel (train, eval) loss ops."""
    sp = sequence_parallel
    for block in transformer_blocks(model):
        # an MoE block's experts split in core.parallel.expert_parallel; its shared experts are an MLP like this
        mlp = block.mlp if isinstance(block.mlp, MLP) else block.mlp.shared
        for region in (block.attn, mlp):
            if region is None:
                continue
            entered = isinstance(region, (Attention, MLP))  # their column-parallel ops share one ``enter``
            if entered:
                region.enter = comm.enter_region(group, sp)
            for linear in (c for _, c in region.cells_and_names() if isinstance(c, Linear)):
                if tp_split_dim(linear.weight.name) is None:  # MLA's down-projections: per token, replicated
                    continue
                if _split(linear, group, placements).tp_dim == 1:
                    linear.op = RowParallel(linear.op, group, sp)
                elif not entered:
                    linear.op = ColumnParallel(linear.op, group, sp)
                if linear.bias is not None:  # a column-parallel linear's: added to this rank's outputs, no traffic
                    _split(linear.bias, group, placements)
        if isinstance(block.attn, MLAttention):  # the RoPE key part every head shares enters the heads' region
            block.attn.share_key = comm.enter_region(group, sp)
    # A pipeline stage may lack the embedding or the head (core.parallel.pipeline); the rows follow from V either way.
    start = group.index * model.cfg.vocab_size // group.size
    if model.embed is not None:
        vocab = _split(model.embed, group, placements)
        model.embed.op = VocabParallelLookup(
            model.embed.op, group, start=start, rows=vocab.local_shape[0], sequence_parallel=sp
        )
    if getattr(model, "lm_head", None) is not None:
        _split(model.lm_head, group, placements)
    return (
        VocabParallelCrossEntropyLoss(group, vocab_start=start, sequence_parallel=sp, train=True),
        VocabParallelCrossEntropyLoss(group, vocab_start=start, sequence_parallel=sp, train=False),
    )
