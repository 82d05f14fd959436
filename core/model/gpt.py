"""A Llama-style GPT: token embedding, pre-norm blocks (RMSNorm, RoPE, GQA attention, SwiGLU MLP), final RMSNorm.

`GPT(tokens)` returns the final normalised hidden states, not logits: the trainer applies a fused
linear + cross-entropy to `hidden` and `model.head_weight()`, so the (B, S, V) logits are never held whole.
The model knows nothing about parallelism; wrappers shard or recompute its cells from outside.

Parameter names (optimizer patterns and checkpoints rely on them; MindSpore derives them from attribute paths):
    embed.weight
    layers.{i}.attn_norm.weight  layers.{i}.attn.{wq,wk,wv,wo}.weight
                                 layers.{i}.attn.{wq,wk,wv}.bias.weight (with attn_bias: the bias vectors)
                                 layers.{i}.attn.{q,k}_norm.weight (with qk_norm: (E,) gains)
                                 with attention=mla instead: layers.{i}.attn.{wq_a,q_a_norm,wq_b}.weight (or
                                 attn.wq.weight without q_lora_rank), attn.{wkv_a,kv_a_norm,wkv_b,wo}.weight
    layers.{i}.mlp_norm.weight   layers.{i}.mlp.{w_gate,w_up,w_down}.weight
                                 or, in an MoE block: layers.{i}.mlp.router.weight (X, D),
                                 layers.{i}.mlp.experts.{w_gate,w_up,w_down} (X, F, D), (X, F, D), (X, D, F),
                                 layers.{i}.mlp.shared.{w_gate,w_up,w_down}.weight (with shared experts)
    norm.weight
    lm_head.weight               (only when cfg.tie_embeddings is false)
    mtp.{k}.{enorm,hnorm,norm}.weight, mtp.{k}.proj.weight, mtp.{k}.block.*   (with mtp_layers: module k, its block
                                 named as a layer's)
"""

import zlib

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from core.config import ModelConfig
from core.model.block import Block
from core.model.layers import Embedding, Linear, RMSNorm, linear, rope_at, rope_tables
from core.model.mtp import CarriesMTP, MTPLayer
from core.model.precision import Computes


class GPT(nn.Cell, CarriesMTP, Computes):
    """Decoder-only transformer over int32 tokens (B, S) with S <= cfg.max_seq_len.

    Init (GPT-2, Radford et al. 2019; Llama, Touvron et al. 2023): every matrix N(0, init_std), the residual
    output projections (attn.wo, mlp.w_down) N(0, init_std / sqrt(2 n_layers)), norm weights 1. Each layer's
    generator is seeded from (seed, its name), so the same seed gives bit-identical weights on every rank and
    machine, whatever order layers are built in.
    """

    def __init__(self, cfg: ModelConfig, dtype=ms.float32, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.tie_embeddings = cfg.tie_embeddings  # a plain bool: graph mode reads it as a constant
        self.embed = Embedding(cfg.vocab_size, cfg.d_model, init_std=cfg.init_std, dtype=dtype)
        self.layers = nn.CellList([Block(cfg, dtype, moe=cfg.is_moe_layer(i)) for i in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps, dtype)
        if not cfg.tie_embeddings:
            self.lm_head = Linear(cfg.d_model, cfg.vocab_size, init_std=cfg.init_std, dtype=dtype)
        self.mtp_depth = cfg.mtp_layers
        if cfg.mtp_layers:
            self.mtp = nn.CellList([MTPLayer(cfg, dtype) for _ in range(cfg.mtp_layers)])

        # Constants, not Parameters: built once for max_seq_len and read at the batch's token positions.
        cos, sin = rope_tables(cfg)
        self.rope_cos = Tensor(cos, dtype)  # (max_S, E/2)
        self.rope_sin = Tensor(sin, dtype)  # (max_S, E/2)
        self.arange = Tensor(np.arange(cfg.max_seq_len, dtype=np.int32))  # default positions 0..S-1

        self.init_weights(seed)

    def init_weights(self, seed: int) -> None:
        """(Re)initialise every parameter from `seed`; see the class docstring for the rule."""
        for name, cell in self.cells_and_names():
            if hasattr(cell, "reset_parameters"):
                cell.reset_parameters(np.random.default_rng([seed, zlib.crc32(name.encode())]))

    def head_weight(self):
        """The (V, D) output-head Parameter: the embedding table when tied, else lm_head.weight."""
        return self.embed.weight if self.tie_embeddings else self.lm_head.weight

    def construct(self, tokens, positions=None):
        """tokens (B, S) int32 at ``positions`` (S,) int32 in the sequence (default 0..S-1; context parallelism
        gives each rank its chunks' positions) -> hidden (B, S, D)."""
        if positions is None:
            positions = self.arange[: tokens.shape[1]]
        cos, sin = rope_at(self.rope_cos, self.rope_sin, positions, self.compute_precision)  # (S, E/2) each
        h = self.embed(tokens)  # (B, S, D)
        for block in self.layers:
            h = block(h, cos, sin, positions)
        return self.norm(h)  # (B, S, D)

    def logits(self, tokens):
        """hidden @ head_weight^T, (B, S, V). For tests and sampling; training uses the fused loss instead."""
        # self.construct, not self(...): graph mode cannot call a Cell on itself.
        return linear(self.construct(tokens), self.head_weight())  # (B, S, V)


def count_params(model: nn.Cell) -> int:
    """Number of distinct trainable scalars (a tied embedding counts once; an MoE block's dropped-pair counter is
    a metric, not a parameter)."""
    return sum(int(np.prod(p.shape)) for p in model.trainable_params())


def transformer_blocks(model: nn.Cell) -> list:
    """Every transformer block of a GPT or a pipeline stage: its layers, then its MTP modules' blocks (the cells
    that tensor and context parallelism treat alike)."""
    mtp = getattr(model, "mtp", None)
    return list(model.layers) + ([m.block for m in mtp] if mtp is not None else [])
