"""The core's GPT (core/model/gpt.py, core/model/layers.py) in PyTorch, for benchmarks/peer_torch.py.

Same architecture and parameters: token embedding, pre-norm blocks (RMSNorm; half-split RoPE on q and k; causal
attention with n_kv_heads key/value heads, each serving n_heads / n_kv_heads query heads; SwiGLU MLP), final
RMSNorm, output head tied to the embedding or not as ``tie_embeddings`` says. Same init rule: every matrix
N(0, init_std), the residual writers (wo, w_down) N(0, init_std / sqrt(2 n_layers)), norm weights 1. PyTorch's
own fused kernels (SDPA, nn.RMSNorm) stand where the core spells ops out. Returns logits; the peer applies
F.cross_entropy to them. Imports torch: only the peer's process loads this module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _linear(n_in: int, n_out: int, std: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, bias=False)  # weight (out, in), as core.model.layers.Linear
    nn.init.normal_(layer.weight, std=std)
    return layer


def apply_rope(x, cos, sin):
    """Rotate pairs (x_i, x_{i+E/2}) of each head, as core.model.layers.apply_rope: x (B, N, S, E), cos/sin
    (S, E/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        D, F_, std = cfg.d_model, cfg.ffn_hidden, cfg.init_std
        self.H, self.K, self.E = cfg.n_heads, cfg.n_kv_heads, cfg.head_size
        out_std = std / (2 * cfg.n_layers) ** 0.5  # residual writers (GPT-2), as core.model.block.Block
        self.attn_norm, self.mlp_norm = nn.RMSNorm(D, eps=cfg.norm_eps), nn.RMSNorm(D, eps=cfg.norm_eps)
        self.wq, self.wo = _linear(D, self.H * self.E, std), _linear(self.H * self.E, D, out_std)
        self.wk, self.wv = _linear(D, self.K * self.E, std), _linear(D, self.K * self.E, std)
        self.w_gate, self.w_up, self.w_down = _linear(D, F_, std), _linear(D, F_, std), _linear(F_, D, out_std)

    def forward(self, x, cos, sin):
        (B, S, _), H, K, E = x.shape, self.H, self.K, self.E
        h = self.attn_norm(x)
        q = apply_rope(self.wq(h).view(B, S, H, E).transpose(1, 2), cos, sin)  # (B, H, S, E)
        k = apply_rope(self.wk(h).view(B, S, K, E).transpose(1, 2), cos, sin)  # (B, K, S, E)
        v = self.wv(h).view(B, S, K, E).transpose(1, 2)
        if H != K:  # GQA: KV head j serves query heads j * H/K ... (H/K)(j+1) - 1, as in the core's attention
            k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, S, E)
        x = x + self.wo(attn.transpose(1, 2).reshape(B, S, H * E))
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        nn.init.normal_(self.embed.weight, std=cfg.init_std)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else _linear(cfg.d_model, cfg.vocab_size, cfg.init_std)
        # RoPE angles in float64, then float32 tables (max_seq_len, E/2), as core.model.layers.rope_tables
        E = cfg.head_size
        inv_freq = cfg.rope_theta ** (-torch.arange(0, E, 2, dtype=torch.float64) / E)
        angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float64), inv_freq)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, tokens):
        """tokens (B, S) int64 -> logits (B, S, V)."""
        h, S = self.embed(tokens), tokens.shape[1]
        for block in self.layers:
            h = block(h, self.cos[:S], self.sin[:S])
        return F.linear(self.norm(h), self.embed.weight if self.lm_head is None else self.lm_head.weight)
