"""Saved activations: the bytes one block keeps for backward on one rank, by the part of the block that keeps them,
under each recompute policy: the textbook count ``core.memory.estimate`` turns into a peak (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", for a Llama block). No MindSpore here.
"""

from __future__ import annotations

import math

from core.config import ModelConfig, TrainConfig
from core.model.flops import moe_capacity


def activation_bytes_per_layer(m: ModelConfig, batch: int, seq: int, **options) -> int:
    """Saved-for-backward bytes of one Llama block on one rank: the sum of ``activation_parts`` (its keywords)."""
    return sum(activation_parts(m, batch, seq, **options).values())


def activation_parts(
    m: ModelConfig,
    batch: int,
    seq: int,
    *,
    tp: int = 1,
    cp: int = 1,
    sp: bool = False,
    etp: int | None = None,
    moe: bool = False,
    selective: bool = False,
    element_bytes: int = 4,
    accelerator: bool = False,
    saved: str = "autograd",
    fp8: bool = False,
    modules: list[str] | None = None,
) -> dict[str, int]:
    """Saved-for-backward bytes of one Llama block, hand-attention (no flash), on one rank, by the part of the block
    that saves them (core.memory.swap's ``memory.swap_ops``): a rough, documented count. ``seq`` is the whole sequence;
    this rank holds seq / cp of its tokens.

    Per token: the two norms' inputs 2D (split over tp only with sequence parallelism) and outputs 2D, the input
    attention's and the MLP's projections save (under sequence parallelism gathered whole where a region's
    column-parallel projections read it, once per region as ``core.parallel.tensor_parallel`` enters it; split where
    MLA's down-projections and an MoE's router read this rank's tokens): ``norm``; q and attention output 2D, k/v 2*kv
    (MLA: its heads' widths, and its latents unsplit by tp): ``attention``; MLP gate/up/silu/product 4F (split over tp):
    ``mlp``. Per head, ``attention``'s scores and probabilities, this rank's tokens times the whole sequence (the S x S
    matrices dominate at long sequences); context parallelism keeps the gathered keys and values of the whole sequence.
    ``selective`` recompute (``core.memory.recompute``) keeps neither the S x S matrices nor the SwiGLU's silu; on an
    ``accelerator`` flash attention never forms the S x S matrices and a grouped matmul runs the experts over the routed
    (token, choice) pairs only (times the capacity factor), where the core's static dispatch on CPU holds every expert's
    C slots. Under Megatron's MoE parallel folding (``etp`` < tp, ``parallel.etp``; estimated, not trained) each rank
    routes its own share of the tensor-parallel group's tokens, T etp / tp, to experts split over etp ranks only, and
    gathers no sequence for it (as ``core.perf.work`` counts its FLOPs). ``element_bytes``: 4 (fp32) or 2 (bf16
    activations). ``saved="megatron"`` (``cluster.saved_activations``) counts what Megatron-LM keeps instead: the
    norms' outputs as this rank's shard, the SwiGLU's input 2F and the down projection's input F, and with ``fp8``
    each projection's FP8 copy of its input (one byte; two for a norm's output gathered again under sequence
    parallelism) beside flash attention's bf16 output. Under ``selective``, ``modules`` (Megatron-LM's
    ``--recompute-modules``, ``memory.recompute_modules``) replace the core's policy: core_attn drops the S x S
    matrices, layernorm the norms' outputs (a projection reading one then saves the original, which is dropped with
    it: megatron/core/transformer/transformer_layer.py), moe_act the experts' activation output, the down
    projection's input (``experts.py``: an output-discarding checkpoint; under FP8 the projection keeps the original).
    ``saved="mindformers"`` counts autograd's, and under ``selective`` MindFormers' default select_recompute and
    select_comm_recompute instead of the core's policy: the MLP keeps its gate and up outputs 2F (silu and the
    product recomputed), the norms' outputs their shard under sequence parallelism (the all-gather re-run), the S x S
    matrices kept (its default patterns leave the softmax alone), the experts as autograd's.
    The per-token count is Korthikanti et al. 2022's for a Llama block (SwiGLU's three MLP tensors in place of
    GELU's). (The layout rules make tp divide D, kv and F, so the parts' divisions by tp are exact.)
    """
    b, fused = element_bytes, saved == "megatron"
    mindformers = saved == "mindformers" and selective  # MindFormers' select (comm) recompute, its default patterns
    redo = set(modules or ()) if selective else set()
    drop_scores = "core_attn" in redo or (selective and modules is None and not mindformers)
    cast = 1 if fused and fp8 else b  # a projection's own copy of its input: Transformer Engine's FP8 cast

    def swiglu(width: int, act: bool = True) -> int:  # bytes per token (or slot) of one SwiGLU MLP of ``width``
        # (Megatron's: the gate/up output, and the activation output unless ``act`` is False, recomputed)
        return (
            2 * width * b + (width * cast if act else 0)
            if fused
            else (2 if mindformers else 3 if selective else 4) * width * b
        )

    local = seq // cp
    mlp, routed = swiglu(m.ffn_hidden), 0
    if moe:  # the core routes whole sequences on every rank (core.parallel.expert_parallel): the experts' slots
        # (input, gate/up/silu/product split over tp, output), router scores, the gathered tokens of a split sequence
        etp = tp if etp is None else etp
        F, tokens, gathered = m.expert_width, batch * seq, m.d_model if cp > 1 or sp else 0
        if etp < tp:  # folded: this rank's own tokens, through experts whole over etp ranks
            tokens, gathered = batch * local * etp // tp, 0
        if accelerator:
            slots = math.ceil(tokens * m.moe_top_k * (m.moe_capacity_factor or 1.0))
        else:
            slots = m.n_experts * moe_capacity(tokens, m.moe_top_k, m.n_experts, m.moe_capacity_factor)
        expert = swiglu(F) if fused else 4 * F * b  # the core's selective recompute keeps the experts' silu
        # moe_act recomputes the routed experts' activation, not the shared experts'
        routed_expert = swiglu(F, act="moe_act" not in redo) if fused else expert
        routed = slots * (m.d_model * (cast + b) + routed_expert // etp) + tokens * (4 * m.n_experts + gathered) * b
        mlp = expert * m.moe_shared_experts
    scores = score_floats(m, seq, tp, cp) if not (drop_scores or accelerator) else 0
    gathered_kv = (m.kv_width // tp) * seq if cp > 1 else 0
    latent = m.latent_width // (tp if sp else 1)  # MLA's latents: per token, replicated over tp
    D, gqa, dense = m.d_model, not m.mla, not moe or m.moe_shared_experts > 0

    def norm_output(projected: bool, gathered: bool) -> int:
        """Bytes a token of a norm's output on this rank: gathered whole under SP where GQA's or a (shared) MLP's
        column-parallel projections read it; Megatron keeps its shard and gathers it again in backward, and under
        fp8 a projection's cast of it (row- and column-wise where gathered again); a router reads it in bf16.
        MindFormers' select_comm_recompute keeps the shard too."""
        width = D // (tp if sp and not (gathered and not (fused or mindformers)) else 1)
        return width * ((2 if gathered and sp else 1) if fused and fp8 and projected else b)

    attention = (m.q_width + m.attn_width + m.kv_width) // tp * b + (m.attn_width // tp if fused and fp8 else 0)
    norm = 2 * b * (D // (tp if sp else 1))  # inputs
    norm += 0 if "layernorm" in redo else norm_output(True, gqa) + norm_output(dense, dense)
    return {
        "norm": batch * local * norm,
        "attention": batch * (local * (attention + latent * b) + (scores + gathered_kv) * b),
        "mlp": batch * local * (mlp // tp) + routed,
    }


def element_bytes(cfg: TrainConfig) -> int:
    """Bytes of one saved activation: 2 where computed in bf16, else 4 (CPU emulates bf16 in fp32 storage)."""
    return 2 if cfg.compute_precision == "bf16" else 4


def block_activation_parts(cfg: TrainConfig, moe: bool, *, selective: bool = False) -> dict[str, int]:
    """``activation_parts`` of one of ``cfg``'s blocks (an MoE block or not) on one rank, as ``terms`` counts it: in
    the activations' precision, flash attention on accelerators."""
    m, t, par = cfg.model, cfg.training, cfg.parallel
    return activation_parts(
        m,
        t.micro_batch_size,
        t.seq_len,
        tp=par.tp,
        cp=par.cp,
        sp=par.sp,
        etp=par.expert_tp,
        moe=moe,
        selective=selective,
        element_bytes=element_bytes(cfg),
        accelerator=cfg.device != "CPU",
        saved=cfg.cluster.saved_activations,
        fp8=t.precision == "fp8",
        modules=cfg.memory.recompute_modules,
    )


def block_activation_bytes(cfg: TrainConfig, moe: bool, *, selective: bool = False) -> int:
    """The sum of ``block_activation_parts``."""
    return sum(block_activation_parts(cfg, moe, selective=selective).values())


def per_op_saved_bytes(cfg: TrainConfig) -> int:
    """Bytes one dense GQA block saves on one rank under torchtitan's per-op policy (``memory.recompute=
    selective_op``; torchtitan/distributed/activation_checkpoint.py: attention's output, the reduce-scatters and
    every second matmul's output are saved, the rest recomputed from the block's input). Per token: the block's
    input D (over tp with sequence parallelism), wq's output Q / tp, wv's kv / 2 / tp, attention's output A / tp
    (its log-sum-exp, a float per head, left out), the MLP gate's F / tp and w2's D (per rank the whole width, a
    partial sum under tp), and with sequence parallelism the two reduce-scatters' D / tp; wk, wo and the up
    projection's outputs are recomputed, as are the norms, RoPE and SwiGLU's product."""
    m, t, par = cfg.model, cfg.training, cfg.parallel
    tp, sp = par.tp, par.sp and par.tp > 1
    floats = (
        m.d_model // (tp if sp else 1)
        + (m.q_width + m.kv_width // 2 + m.attn_width + m.ffn_hidden) // tp
        + m.d_model
        + (2 * m.d_model // tp if sp else 0)
    )
    return element_bytes(cfg) * t.micro_batch_size * (t.seq_len // par.cp) * floats


def score_floats(m: ModelConfig, seq: int, tp: int = 1, cp: int = 1) -> int:
    """Floats of one sequence's attention scores and probabilities on one rank: per head of this rank, its tokens
    times the whole sequence, twice."""
    return 2 * (m.n_heads // tp) * (seq // cp) * seq
