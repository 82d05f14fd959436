"""``parallelize(model, dims, cfg)``: the one place where a model becomes this rank's part of a mesh-parallel one,
with its recompute applied. It composes the techniques of ``core.parallel`` and ``core.memory``; the model's code
never changes, only its ``op`` and ``sdpa`` seams and its weights (``core.model.layers``).

A pipeline (``pp > 1``) first cuts the model into stages and keeps this rank's (``core.parallel.pipeline``); each
stage is a GPT-shaped cell and gets what follows, with its own recompute mode. In this order (torchtitan's):
tensor and sequence parallelism split weights and wrap their ops; context parallelism replaces attention; MoE
blocks go on the mesh; selective recompute wraps its ops; FSDP shards whatever weights are left (TP blocks
included) and wraps every op once more, knowing which blocks recompute (under ZeRO-1 the weights stay whole and
``Parallelized.masters`` shards the optimizer's side instead). The blocks are *marked* for full
recompute last, once every weight has its final Parameter: MindSpore's PyNative recompute captures a block's
parameters when it is marked (marked before FSDP, it differentiated the replaced full weights and lost the
shards' gradients). The trainer asks for a ``Parallelized`` and never branches on a degree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mindspore import nn

from core.config import TrainConfig
from core.memory.plan import RecomputePlan, recompute_plan
from core.memory.recompute import apply_selective, mark_full
from core.model.gpt import transformer_blocks
from core.model.layers import CausalAttention
from core.model.loss import LinearCrossEntropyLoss
from core.model.moe import moe_layers
from core.model.mtp import MTPLoss, mtp_objective, mtp_targets
from core.model.precision import set_precision
from core.parallel import comm
from core.parallel.context_parallel import apply_context_parallel, chunk_positions
from core.parallel.dims import ParallelDims
from core.parallel.expert_parallel import apply_moe_parallel
from core.parallel.fsdp import apply_fsdp
from core.parallel.pipeline.stages import preprocess, reads_table_last, split_stages
from core.parallel.placement import Placement, replicated
from core.parallel.tensor_parallel import apply_tensor_parallel
from core.parallel.zero1 import MasterWeights


@dataclass(kw_only=True)
class Parallelized:
    """A model ready for this rank, and what the trainer needs around it."""

    model: nn.Cell
    loss: nn.Cell  # (hidden, head weight, labels) -> mean loss, for training
    eval_loss: nn.Cell  # the same without gradients
    placements: dict  # parameter name -> Placement (checkpoints, optimizer, clipping, estimate)
    dims: ParallelDims
    groups: dict  # axis or view -> comm.Group
    positions: np.ndarray  # (S / cp,) int32: the sequence positions of this rank's tokens
    recompute: RecomputePlan  # how each stage recomputes (applied here; the step factory reads it)
    stages: dict | None = None  # with a pipeline: {global stage: Stage} held by this rank (``model`` holds them)
    preprocess: nn.Cell | None = None  # mpipe with T >= 1: the preprocess block (``model`` holds it on rank 0 only)
    frozen: tuple[str, ...] = ()  # weights kept as they start (model.freeze_*): placed and saved, not trained
    tied: tuple[str, ...] = ()  # parameters whose gradient is summed with a copy on another stage
    mirrors: tuple[str, ...] = ()  # those copies held here (another rank saves them)

    mtp_depth: int = 0  # multi-token prediction modules (core.model.mtp): training windows are this much longer
    mtp_loss: nn.Cell | None = None
    zero1: bool = False  # the optimizer's side sharded over the fsdp ranks, the weights whole (core.parallel.zero1)

    def masters(self, weights: list) -> MasterWeights:
        """What the optimizer, clipping and checkpoints hold for the differentiated ``weights``: their ZeRO-1
        masters (``parallel.dp_shard_strategy=optim``), else the weights themselves."""
        return MasterWeights(weights, self.placements, self.groups["fsdp"] if self.zero1 else None)

    def local_tokens(self, rows: np.ndarray, *, training: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """This rank's (inputs, targets), each (b, S / cp), from its batch rows (b, S + 1); for training with MTP
        from rows (b, S + 1 + D), its targets (b, S / cp, 1 + D) (``core.model.mtp.mtp_targets``)."""
        if training and self.mtp_depth:
            S = rows.shape[1] - 1 - self.mtp_depth
            return rows[:, :S][:, self.positions], mtp_targets(rows, self.mtp_depth)[:, self.positions]
        return rows[:, :-1][:, self.positions], rows[:, 1:][:, self.positions]

    def train_loss(self, inputs, targets, positions):
        """The training loss of a micro-batch (what the step differentiates): the model, then the fused loss; with
        MTP, the main loss whose backward adds the modules' (``core.model.mtp``)."""
        hidden = self.model(inputs, positions)  # (B, S, D)
        if not self.mtp_depth:
            return self.loss(hidden, self.model.head_weight(), targets)
        return mtp_objective(self.model, self.loss, self.mtp_loss, hidden, targets, positions)

    def validation_loss(self, inputs, targets, positions):
        hidden = self.model(inputs, positions)
        return self.eval_loss(hidden, self.model.head_weight(), targets)


def parallelize(model: nn.Cell, dims: ParallelDims, cfg: TrainConfig) -> Parallelized:
    """A pipeline first cuts the model into this rank's stages; each stage (or the whole model) is then made
    parallel the same way."""
    groups = comm.mesh_groups(dims)
    placements: dict[str, Placement] = {}
    plan = recompute_plan(cfg)
    p = cfg.parallel
    frozen = freeze(model, cfg.model.freeze_embedding, cfg.model.freeze_layers)
    transposed = p.pp_transpose_layers  # mpipe's T (0 for every other schedule)
    parts = (
        {0: model}
        if dims.pp == 1
        else split_stages(
            model,
            pp=dims.pp,
            virtual=p.pp_virtual,
            index=dims.index("pp"),
            split=p.stage_split(len(model.layers)),
            transposed=transposed,
        )
    )
    pre = preprocess(model, transposed) if transposed else None
    loss = eval_loss = None
    for s, part in parts.items():
        losses = _parallelize_part(
            part, dims=dims, groups=groups, placements=placements, cfg=cfg, plan=plan, stage=s, frozen=frozen
        )
        if s == max(parts) and part.head_weight() is not None:
            loss, eval_loss = losses
    if pre is not None:  # rank 0's trains (placed, optimized, saved); another rank's copy takes rank 0's weights
        mine = placements if 0 in parts else {}
        _parallelize_part(pre, dims=dims, groups=groups, placements=mine, cfg=cfg, plan=plan, stage=0, frozen=frozen)
    if cfg.training.max_attention_logit is not None:  # before anything compiles: graph mode reads it as a constant
        # mpipe's block on every rank: rank 0's is read; the copies' buffers keep the block's parameters alike (W)
        for part in [*parts.values(), *([pre] if pre is not None else [])]:
            for block in transformer_blocks(part):
                label = block.attn_norm.weight.name.rsplit(".attn_norm.", 1)[0]  # the 1-process name: layers.3
                for _, cell in block.attn.cells_and_names():
                    if isinstance(cell, CausalAttention):
                        cell.track(label)
    # after every wrapper (context parallelism builds attention cells of its own): graph mode reads it as a constant
    set_precision(
        [model, *parts.values(), *(c for c in (pre, loss, eval_loss) if c is not None)], cfg.compute_precision
    )
    S = cfg.training.seq_len
    positions = chunk_positions(S, dims.cp, dims.index("cp")) if dims.cp > 1 else np.arange(S, dtype=np.int32)
    common = dict(
        loss=loss,
        eval_loss=eval_loss,
        placements=placements,
        dims=dims,
        groups=groups,
        positions=positions,
        recompute=plan,
        frozen=frozen,
        zero1=dims.size("fsdp") > 1 and not p.shards_weights,
    )
    depth = cfg.model.mtp_layers  # (with a pipeline the last stage runs the modules: core.parallel.pipeline.stages)
    common |= dict(mtp_depth=depth, mtp_loss=MTPLoss(cfg.model.mtp_loss_weight, depth) if depth else None)
    if dims.pp == 1:
        return Parallelized(model=model, **common)
    mirrors = tuple(name for part in parts.values() for name in part.mirrors)
    # the last stage's copy of the table (the tied head, or what MTP embeds with) sums its gradient with stage 0's
    tied = mirrors + (("embed.weight",) if 0 in parts and reads_table_last(model) else ())
    held = nn.CellList(([pre] if pre is not None and 0 in parts else []) + list(parts.values()), auto_prefix=False)
    return Parallelized(model=held, stages=parts, preprocess=pre, tied=tied, mirrors=mirrors, **common)


def freeze(model: nn.Cell, embedding: bool, blocks: int) -> tuple[str, ...]:
    """Keep the embedding (``embedding``) and the first ``blocks`` blocks as they start: their weights stop
    requiring gradients, so no step differentiates them and no optimizer holds them. Returns their names."""
    cells = ([model.embed] if embedding else []) + [model.layers[i] for i in range(blocks)]
    frozen = []
    for cell in cells:
        for weight in cell.trainable_params():
            weight.requires_grad = False
            frozen.append(weight.name)
    return tuple(frozen)


def _parallelize_part(
    model: nn.Cell,
    *,
    dims: ParallelDims,
    groups: dict,
    placements: dict,
    cfg: TrainConfig,
    plan: RecomputePlan,
    stage: int,
    frozen: tuple[str, ...],
):
    """TP -> CP -> MoE (EP) -> selective recompute -> FSDP -> full recompute on a GPT or a pipeline stage;
    returns its (train, eval) loss ops."""
    weights = [p for p in model.get_parameters() if p.requires_grad or p.name in frozen]
    placements.update({p.name: replicated(p.shape) for p in weights})
    placements.update({m.score_bias.name: replicated(m.score_bias.shape) for m in moe_layers(model) if m.has_bias})
    loss, eval_loss = LinearCrossEntropyLoss(train=True), LinearCrossEntropyLoss(train=False)
    if dims.tp > 1:
        loss, eval_loss = apply_tensor_parallel(model, groups["tp"], dims.sp, placements)
    if dims.cp > 1:
        apply_context_parallel(model, groups["cp"], cfg.training.seq_len)
    apply_moe_parallel(model, dims, groups, placements, cfg.training.seq_len)
    mode, blocks = plan.mode(stage), plan.blocks(len(model.layers), stage)
    if mode == "selective":
        apply_selective(model, blocks)
    full = blocks if mode == "full" else range(0)
    if dims.size("fsdp") > 1 and cfg.parallel.shards_weights:  # (else ZeRO-1: the trainer's MasterWeights)
        loss, eval_loss = apply_fsdp(model, groups["fsdp"], placements, loss, eval_loss, recomputed=full)
    if not plan.segmented:  # (segmented: the step runs full recompute as compiled segments, core.training.step)
        mark_full(model, full)
    return loss, eval_loss
