"""Multi-head latent attention (DeepSeek-V2, 2024, section 2.1; DeepSeek-V3, 2024, section 2.1.1).

Keys and values come from one low-rank latent per token: the hidden state is projected down to c_kv
(``kv_lora_rank`` wide) and, normalised, up to every head's key and value; a second, narrow projection gives a key
part k_pe (``qk_rope_head_dim``) that RoPE rotates and that every head shares (RoPE does not commute with the
up-projection, so it is decoupled from the latent). Queries likewise pass a latent c_q (``q_lora_rank``) when it is
set. Each head attends with q = [q_nope, q_pe] against k = [k_nope, k_pe] and reads a value of its own width:

    c_q  = norm(x Wq_a)                       (B, S, Q)          q = c_q Wq_b  (or x Wq)   (B, S, H (N + R))
    kv_a = x Wkv_a = [c_kv, k_pe]             (B, S, L + R)      kv = norm(c_kv) Wkv_b     (B, S, H (N + V))
    out  = softmax(q k^T * scale) v           (B, H, S, V)       y = out Wo                (B, S, D)

What an inference cache holds per token is c_kv and k_pe (L + R numbers, 576 in DeepSeek-V3, against 2 H E = 32,768
for its 128 heads as plain multi-head attention); in training the heads' keys and values are materialised, as here.

Seams for parallelism (as ``core.model.layers.Attention``'s): every weight through its ``op``; the heads are split
by tensor parallelism through wq_b (or wq), wkv_b (column-parallel) and wo (row-parallel), while the down-projections
and their norms are per token and replicated, run on this rank's tokens (a slice of the sequence under sequence
parallelism); ``share_key`` (an identity here) is where the shared k_pe enters the heads' region, which tensor
parallelism replaces with the same entry as a column-parallel op's (its gradient is summed over the heads' ranks);
``sdpa`` is replaced by context parallelism.

Shape letters: B batch, S sequence, D model width, H heads, Q q's latent, L kv's latent, N q/k width without RoPE,
R RoPE width, V value width.
"""

import mindspore as ms
from mindspore import nn, ops

from core.model.layers import SDPA, Identity, Linear, RMSNorm, _heads_first, apply_rope


class MLAttention(nn.Cell):
    """Causal multi-head latent attention, (B, S, D) -> (B, S, D) (module docstring)."""

    def __init__(self, cfg, *, out_std: float, dtype=ms.float32):
        super().__init__()
        D, H, std = cfg.d_model, cfg.n_heads, cfg.init_std
        self.nope, self.rope, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.latent = cfg.kv_lora_rank
        self.q_lora = cfg.q_lora_rank is not None  # a plain bool: graph mode reads it as a constant
        if self.q_lora:
            self.wq_a = Linear(D, cfg.q_lora_rank, init_std=std, dtype=dtype)
            self.q_a_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps, dtype)
            self.wq_b = Linear(cfg.q_lora_rank, cfg.q_width, init_std=std, dtype=dtype)
        else:
            self.wq = Linear(D, cfg.q_width, init_std=std, dtype=dtype)
        self.wkv_a = Linear(D, self.latent + self.rope, init_std=std, dtype=dtype)
        self.kv_a_norm = RMSNorm(self.latent, cfg.norm_eps, dtype)
        self.wkv_b = Linear(self.latent, H * (self.nope + self.v_dim), init_std=std, dtype=dtype)
        self.wo = Linear(cfg.attn_width, D, init_std=out_std, dtype=dtype)
        self.share_key = Identity()
        self.sdpa = SDPA(cfg.softmax_scale)

    def construct(self, x, cos, sin, positions):
        N, R, V, L = self.nope, self.rope, self.v_dim, self.latent
        q = self.wq_b(self.q_a_norm(self.wq_a(x))) if self.q_lora else self.wq(x)  # (B, S, H (N + R))
        c_kv, k_pe = ops.split(self.wkv_a(x), [L, R], axis=-1)  # (B, s, L), (B, s, R)
        kv = self.wkv_b(self.kv_a_norm(c_kv))  # (B, S, H (N + V))
        k_pe = self.share_key(k_pe)  # (B, S, R)
        B, S = q.shape[0], q.shape[1]
        q_nope, q_pe = ops.split(_heads_first(q.reshape(B, S, -1, N + R)), [N, R], axis=-1)  # (B, H, S, N), (.., R)
        k_nope, v = ops.split(_heads_first(kv.reshape(B, S, -1, N + V)), [N, V], axis=-1)  # (B, H, S, N), (.., V)
        q_pe = apply_rope(q_pe, cos, sin)
        k_pe = apply_rope(k_pe.reshape(B, 1, S, R), cos, sin)  # (B, 1, S, R): one for every head
        q = ops.concat((q_nope, q_pe), axis=-1)  # (B, H, S, N + R)
        k = ops.concat((k_nope, ops.broadcast_to(k_pe, k_nope.shape[:3] + (R,))), axis=-1)  # (B, H, S, N + R)
        out = self.sdpa(q, k, v, positions)  # (B, H, S, V)
        return self.wo(_heads_first(out).reshape(B, S, -1))  # (B, S, D)
