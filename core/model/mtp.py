"""Multi-token prediction (DeepSeek-V3, 2024, section 2.2; Gloeckle et al. 2024): D modules in sequence after the
main model, module k predicting the token k + 1 places beyond the next, sharing the embedding and the output head
with the main model.

Module k (k = 1..D) at position i combines the previous depth's hidden state with the embedding of token i + k,
runs one transformer block, and normalises:

    h^k_i = norm_k(block_k(proj_k([enorm_k(Emb(t_{i+k})); hnorm_k(h^{k-1}_i)])))     h^0: the main model's output
    L_k   = CE(head(h^k_i), t_{i+k+1})
    loss  = L_main + mtp_loss_weight / D * sum_k L_k

(the concatenation's order and h^0 being the main model's normalised output as transformers' ``MtpLayer`` and
Megatron-LM have them). The objective's extra term enters through ``MTPLoss``, an identity on the main loss whose
backward also hands the weight to the modules' losses, so the loss a run reports stays the main model's (what
DeepSeek-V3 reports, and what compares with a run without MTP); validation is the main model's loss.

A training window with MTP holds S + 1 + D tokens, so that every position has all its targets (no ignored tail,
whose uneven share between context-parallel ranks would weigh the means differently from one process); its targets
are (b, S, 1 + D) int32, the next tokens and those k places further (``mtp_targets``), cut by every layout like the
targets (context parallelism takes its positions of each). The module's block is the model's block (MoE when the model has experts, as DeepSeek-V3's), parallelised
with the others.
"""

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from core.model.block import Block
from core.model.layers import Linear, RMSNorm, rope_at


class MTPLayer(nn.Cell):
    """(h^{k-1} (B, S, D), Emb(t_{i+k}) (B, S, D), RoPE tables, positions) -> h^k (B, S, D)."""

    def __init__(self, cfg, dtype=ms.float32):
        super().__init__()
        D = cfg.d_model
        self.enorm = RMSNorm(D, cfg.norm_eps, dtype)
        self.hnorm = RMSNorm(D, cfg.norm_eps, dtype)
        self.proj = Linear(2 * D, D, init_std=cfg.init_std, dtype=dtype)
        self.block = Block(cfg, dtype, moe=cfg.n_experts > 0)
        self.norm = RMSNorm(D, cfg.norm_eps, dtype)

    def construct(self, h, embedded, cos, sin, positions):
        x = self.proj(ops.concat((self.enorm(embedded), self.hnorm(h)), axis=-1))  # (B, S, 2D) -> (B, S, D)
        return self.norm(self.block(x, cos, sin, positions))


class CarriesMTP:
    """Mixed into the cells whose output feeds the MTP modules (a GPT; a pipeline's last stage): they hold ``mtp``
    (the modules), ``embed`` (the table the modules embed with), the RoPE tables and their compute precision
    (``core.model.precision.Computes``)."""

    def mtp_hidden(self, k: int, hidden, tokens, positions):
        """Module ``k``: the previous depth's hidden (B, S, D) and the tokens k + 1 places after each position
        (B, S) -> this depth's hidden (B, S, D)."""
        cos, sin = rope_at(self.rope_cos, self.rope_sin, positions, self.compute_precision)
        return self.mtp[k](hidden, self.embed(tokens), cos, sin, positions)


def mtp_objective(model, loss, mtp_loss, hidden, targets, positions):
    """The training loss of a model with MTP modules (``CarriesMTP``): ``loss`` (hidden, head, labels) on the main
    output and on each module's, joined by ``mtp_loss`` (an ``MTPLoss``); ``hidden`` (B, S, D) the main model's
    output, ``targets`` (B, S, 1 + D)."""
    head = model.head_weight()
    main, extra = loss(hidden, head, targets[:, :, 0]), 0.0
    for k in range(model.cfg.mtp_layers):
        hidden = model.mtp_hidden(k, hidden, targets[:, :, k], positions)
        extra = extra + loss(hidden, head, targets[:, :, k + 1])
    return mtp_loss(main, extra)


class MTPLoss(nn.Cell):
    """(main loss, the modules' summed losses) -> the main loss; backward: the main loss's gradient passes, and
    the modules' sum receives it times ``weight`` / D."""

    def __init__(self, weight: float, depth: int):
        super().__init__()
        self.scale = weight / depth

    def construct(self, main, extra):
        return main * 1.0  # a new tensor: a bprop-Cell that returns its input loses its bprop

    def bprop(self, main, extra, out, dout):
        return dout, dout * self.scale


def mtp_targets(rows: np.ndarray, depth: int) -> np.ndarray:
    """(b, S + 1 + depth) token windows -> (b, S, 1 + depth) int32 targets: column j holds the token j + 1 places
    after each input position (j = 0: the next token)."""
    S = rows.shape[1] - 1 - depth
    return np.stack([rows[:, 1 + j : 1 + j + S] for j in range(1 + depth)], axis=-1).astype(np.int32)
