"""DeepSeek-V3's auxiliary-loss-free load balancing (DeepSeek-V3 technical report, 2024, section 2.1.2; Wang et
al. 2024, "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts"): after each step, every MoE block's
choice bias (``MoE.score_bias``) moves by ``model.moe_bias_update_rate`` toward balance, up for an expert that got
fewer (token, choice) pairs than the block's mean over the step's global batch, down for one that got more.

The loads are counted in the forward (``MoE.load``) and summed here over every rank: ranks that route the same
tokens (tensor- and context-parallel peers gather the whole sequence before routing) count them equally often,
so the sum divided by tp * cp is the global batch's; pipeline ranks contribute zeros for the blocks they do not
hold. A block that recomputes its forward counted every micro-batch twice, and the sign of (mean - load) does not
change with a common factor. Every rank then applies the same update, so the biases stay identical across ranks
(they are replicated, saved in checkpoints with the weights).
"""

from __future__ import annotations

import numpy as np
from mindspore import Tensor, ops

from core.config import TrainConfig
from core.model.flops import buffer_shapes
from core.model.moe import moe_layers
from core.training.ranks import Ranks


class ExpertBalance:
    def __init__(self, cfg: TrainConfig, model, ranks: Ranks):
        self.rate = cfg.model.moe_bias_update_rate
        self.duplicates = cfg.parallel.tp * cfg.parallel.cp
        self.ranks, self.n_experts = ranks, cfg.model.n_experts
        self.blocks = {layer.score_bias.name: layer for layer in moe_layers(model) if layer.has_bias}
        # every rank reduces the same (blocks, experts) table, a pipeline stage's rows for the blocks it holds
        self.names = sorted(buffer_shapes(cfg.model))

    @property
    def active(self) -> bool:
        return self.rate > 0 and bool(self.names)

    @property
    def biases(self) -> list:
        """This rank's bias Parameters: checkpointed and loaded with the weights."""
        return [layer.score_bias for layer in self.blocks.values()]

    def after_step(self) -> None:
        """Read and reset the loads, sum them over the ranks, move the biases (every rank joins)."""
        table = np.zeros((len(self.names), self.n_experts), np.float32)
        for row, name in enumerate(self.names):
            layer = self.blocks.get(name)
            if layer is not None:
                table[row] = layer.load.asnumpy()
                ops.assign(layer.load, Tensor(np.zeros(self.n_experts, np.float32)))
        total = np.asarray(self.ranks.sum(table.reshape(-1).tolist()), np.float32).reshape(table.shape)
        load = total / self.duplicates
        step = self.rate * np.sign(load.mean(axis=1, keepdims=True) - load)  # (blocks, X)
        for row, name in enumerate(self.names):
            layer = self.blocks.get(name)
            if layer is not None:
                ops.assign(layer.score_bias, layer.score_bias + Tensor(step[row], layer.score_bias.dtype))
