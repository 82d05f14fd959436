"""What the model costs, counted from its config without building it (no MindSpore): the names and shapes of its
parameters (its attention's matrices apart, for the step-time model), the weights a token multiplies, training FLOPs per token, and an expert's capacity.

The memory estimate (``core.memory.estimate``) and MFU (``core.trial.recorder``) count from here, so that a count
has one definition.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from core.config import ModelConfig


def attention_matrices(m: ModelConfig) -> dict[str, tuple[int, int]]:
    """A block's attention weight matrices, (out, in) by name after ``attn.``: GQA's wq, wk, wv, wo, or MLA's
    (``core.model.mla``) down- and up-projections and wo."""
    D = m.d_model
    if not m.mla:
        kv = m.n_kv_heads * m.head_size
        return {"wq": (m.q_width, D), "wk": (kv, D), "wv": (kv, D), "wo": (D, m.attn_width)}
    q = (
        {"wq": (m.q_width, D)}
        if m.q_lora_rank is None
        else {"wq_a": (m.q_lora_rank, D), "wq_b": (m.q_width, m.q_lora_rank)}
    )
    L, R = m.kv_lora_rank, m.qk_rope_head_dim
    kv = {"wkv_a": (L + R, D), "wkv_b": (m.n_heads * (m.qk_nope_head_dim + m.v_head_dim), L)}
    return q | kv | {"wo": (D, m.attn_width)}


def param_shapes(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the model's parameters without building it (``core.model.gpt``'s names)."""
    shapes = {"embed.weight": (m.vocab_size, m.d_model)}
    for i in range(m.n_layers):
        shapes.update(block_shapes(m, f"layers.{i}.", moe=m.is_moe_layer(i)))
    shapes["norm.weight"] = (m.d_model,)
    if not m.tie_embeddings:
        shapes["lm_head.weight"] = (m.vocab_size, m.d_model)
    for k in range(m.mtp_layers):  # core.model.mtp: its block is MoE when the model has experts
        b = f"mtp.{k}."
        shapes.update({b + "enorm.weight": (m.d_model,), b + "hnorm.weight": (m.d_model,)})
        shapes[b + "proj.weight"] = (m.d_model, 2 * m.d_model)
        shapes.update(block_shapes(m, b + "block.", moe=m.n_experts > 0))
        shapes[b + "norm.weight"] = (m.d_model,)
    return shapes


def block_shapes(m: ModelConfig, b: str, *, moe: bool) -> dict[str, tuple[int, ...]]:
    """The parameters of one transformer block named from the prefix ``b`` (``layers.<i>.``)."""
    kv, D = m.n_kv_heads * m.head_size, m.d_model
    shapes = {b + "attn_norm.weight": (D,)}
    shapes.update({f"{b}attn.{w}.weight": shape for w, shape in attention_matrices(m).items()})
    if m.mla:
        if m.q_lora_rank is not None:
            shapes[b + "attn.q_a_norm.weight"] = (m.q_lora_rank,)
        shapes[b + "attn.kv_a_norm.weight"] = (m.kv_lora_rank,)
    shapes[b + "mlp_norm.weight"] = (D,)
    if m.attn_bias:
        shapes.update({b + "attn.wq.bias.weight": (m.attn_width,), b + "attn.wk.bias.weight": (kv,)})
        shapes[b + "attn.wv.bias.weight"] = (kv,)
    if m.qk_norm:
        shapes.update({b + "attn.q_norm.weight": (m.head_size,), b + "attn.k_norm.weight": (m.head_size,)})
    if not moe:
        F = m.ffn_hidden
        shapes.update({b + "mlp.w_gate.weight": (F, D), b + "mlp.w_up.weight": (F, D), b + "mlp.w_down.weight": (D, F)})
        return shapes
    X, F = m.n_experts, m.expert_width
    shapes[b + "mlp.router.weight"] = (X, D)
    shapes.update({b + "mlp.experts.w_gate": (X, F, D), b + "mlp.experts.w_up": (X, F, D)})
    shapes[b + "mlp.experts.w_down"] = (X, D, F)
    if m.moe_shared_experts:
        S = F * m.moe_shared_experts
        shapes.update({b + f"mlp.shared.{w}.weight": (S, D) for w in ("w_gate", "w_up")})
        shapes[b + "mlp.shared.w_down.weight"] = (D, S)
    return shapes


def buffer_shapes(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The model's state that is not trained by gradient but saved and loaded with the weights: DeepSeek-V3's
    choice biases (``moe_score_bias``), one (X,) per MoE block."""
    if not (m.moe_score_bias and m.n_experts):
        return {}
    blocks = [f"layers.{i}." for i in range(m.n_layers) if m.is_moe_layer(i)]
    return {f"{b}mlp.score_bias": (m.n_experts,) for b in blocks + [f"mtp.{k}.block." for k in range(m.mtp_layers)]}


def param_groups(m: ModelConfig) -> dict[str, dict[str, tuple[int, ...]]]:
    """``param_shapes`` by owner: ``"embed."``, ``"layers.<i>."``, ``"norm."``, ``"lm_head."``. A stage's or a
    block's weights are then looked up, not found by scanning every name: the plan asks for thousands of layouts
    of an 80-block model. Cached per model shape; do not modify the result."""
    return _groups(tuple((f.name, getattr(m, f.name)) for f in dataclasses.fields(m)))


@functools.lru_cache(maxsize=16)
def _groups(fields: tuple) -> dict[str, dict[str, tuple[int, ...]]]:
    groups: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, shape in param_shapes(ModelConfig(**dict(fields))).items():
        head, index, _ = name.split(".", 2) if name.startswith("layers.") else (name.split(".")[0], None, None)
        groups.setdefault(f"{head}.{index}." if index is not None else f"{head}.", {})[name] = shape
    return groups


def matmul_params(cfg: ModelConfig) -> int:
    """Weights that take part in a matmul per token: every block matrix plus the output head (used even when
    tied), and each multi-token-prediction module's (its projection, block and the head again). The input embedding is a gather, not a matmul, and norm weights are elementwise: both excluded."""
    attn = sum(o * i for o, i in attention_matrices(cfg).values())
    mlp = 3 * cfg.d_model * cfg.ffn_hidden
    # An MoE block: the router, and the k experts a token is routed to plus the shared ones (active weights;
    # dispatch to empty capacity slots is not model FLOPs)
    moe = cfg.n_experts * cfg.d_model + 3 * cfg.d_model * cfg.expert_width * (cfg.moe_top_k + cfg.moe_shared_experts)
    blocks = sum(attn + (moe if cfg.is_moe_layer(i) else mlp) for i in range(cfg.n_layers))
    # each MTP module: its projection, its block, and the shared head once more (core.model.mtp)
    mtp = cfg.mtp_layers * (2 * cfg.d_model**2 + attn + (moe if cfg.n_experts else mlp) + cfg.vocab_size * cfg.d_model)
    return blocks + cfg.vocab_size * cfg.d_model + mtp


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token, forward + backward: 6 N + 12 L S D (PaLM, Chowdhery et al. 2022, appendix B).

    6 N: each of the N matmul weights costs 2 FLOPs (multiply-add) per token forward and 4 backward (gradients
    for input and weight). 12 L S D: the attention scores q k^T and the weighted sum p v, each 2 S D per token
    per layer forward, times 3 for forward + backward. As in PaLM the attention term counts the full S x S
    matrix, not the causal half actually needed, and recompute is not counted (it is "model" FLOPs, for MFU). D is the
    attention's width H E (the model width unless ``model.head_dim`` says otherwise); with MLA q k^T is H E_qk wide
    and p v H E_v, so the term is 6 L S H (E_qk + E_v).
    """
    heads = cfg.n_heads * (cfg.qk_head_size + cfg.v_head_size)  # 2 H E without MLA
    return 6.0 * matmul_params(cfg) + 6.0 * (cfg.n_layers + cfg.mtp_layers) * seq_len * heads


def moe_capacity(tokens: int, top_k: int, n_experts: int, factor: float | None) -> int:
    """Slots per expert for ``tokens`` tokens: ceil(factor * tokens * k / n_experts), at most ``tokens``; all
    ``tokens`` when ``factor`` is None (dropless: a token picks an expert at most once). ``core.model.moe``
    dispatches into them; the memory estimate counts them."""
    if factor is None:
        return tokens
    return min(tokens, math.ceil(factor * tokens * top_k / n_experts))
