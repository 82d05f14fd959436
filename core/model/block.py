"""The transformer block: pre-norm attention and MLP (or mixture of experts) with residual connections.

Its own module because it joins the layers (``core.model.layers``) and the mixture of experts built on them
(``core.model.moe``).
"""

import math

import mindspore as ms
from mindspore import nn

from core.model.layers import MLP, Attention, RMSNorm
from core.model.mla import MLAttention
from core.model.moe import MoE
from core.model.precision import Computes, to_compute


class Block(nn.Cell, Computes):
    """Pre-norm residual block (GPT-2 / Llama): x + attn(norm(x)), then + mlp(norm(.)); the attention is GQA or
    MLA (core.model.mla) as ``cfg.attention`` says, the MLP a mixture of experts (core.model.moe) with ``moe``.

    The unit of activation recompute: `block.recompute()` re-runs this cell's forward in backward.
    """

    def __init__(self, cfg, dtype=ms.float32, moe: bool = False):
        super().__init__()
        # GPT-2 (Radford et al. 2019): residual-stream writers scaled by 1/sqrt(2 L), two writers per block,
        # so the residual stream's variance at init does not grow with depth.
        out_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, dtype)
        self.attn = (MLAttention if cfg.mla else Attention)(cfg, out_std=out_std, dtype=dtype)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps, dtype)
        if moe:
            self.mlp = MoE(cfg, out_std, dtype)
        else:
            self.mlp = MLP(cfg.d_model, cfg.ffn_hidden, init_std=cfg.init_std, out_std=out_std, dtype=dtype)

    def construct(self, x, cos, sin, positions):
        p = self.compute_precision  # the residual stream's (an MoE's fp32 gates would promote it)
        x = to_compute(x + self.attn(self.attn_norm(x), cos, sin, positions), p)  # (B, S, D)
        return to_compute(x + self.mlp(self.mlp_norm(x)), p)
