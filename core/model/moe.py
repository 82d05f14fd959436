"""Mixture of experts: a top-k router over SwiGLU experts in place of a block's MLP (Shazeer et al. 2017; GShard,
Lepikhin et al. 2021; Switch, Fedus et al. 2022; Mixtral, Jiang et al. 2024; DeepSeek-V3, 2024).

Routing. Router logits (T, X) for T tokens and X experts become scores by softmax (Mixtral) or sigmoid
(DeepSeek-V3); each token picks its k highest, and its gates are those k scores renormalised to sum to 1 (or the
scores themselves, ``moe_norm_topk: false``), times ``moe_routed_scale``. DeepSeek-V3's extras: a per-expert bias
(``score_bias``, not trained by gradient) is added to the scores to choose, not to the gates, and moved toward
balance after each step (``core.training.balance``: the expert loads are counted here, ``load``); with
``moe_groups`` > 1 a token chooses only among the experts of its ``moe_topk_groups`` best groups, a group ranked by
the sum of its two best (biased) scores.

Dispatch with static shapes (what ``mindspore.jit`` compiles). Every expert has C slots. The (token, choice)
pairs claim slots choice-major (all first choices before any second, GShard's priority), tokens in order; a pair
whose expert is full is dropped (it adds nothing; the token keeps its residual and its other choices). Dropless
(``moe_capacity_factor: null``) gives every expert C = T slots, which no expert can overflow since a token picks
an expert at most once; a capacity factor c gives C = ceil(c T k / X). The experts run as one batched matmul over
(X, C, D): empty slots hold zeros and cost compute, which is what a capacity factor bounds (dropless computes
X / k times the routed work; a grouped matmul would not, and CPU MindSpore has none).

Load balance (Switch, eq. 4): aux = X * sum_x f_x P_x, with f_x the share of (token, choice) pairs routed to
expert x and P_x its mean score; 1 at perfect balance. ``moe_aux_per_sequence`` (DeepSeek-V3, eqs. 17-20): the same
per sequence, each token's scores normalised to sum to 1, averaged over the sequences. Its gradient reaches the router through ``AuxLoss``, an
identity on the hidden states whose backward adds ``weight`` d aux (Megatron's MoEAuxLossAutoScaler), so the
loss path and the pipeline stay unchanged. The statistics, like capacity and drops, are a micro-batch's, as in one
process.

Seams for the mesh (identities here; core.parallel.expert_parallel): ``gather_tokens`` and ``gather_logits`` give
every rank that holds part of a micro-batch's sequence (context or sequence parallelism) the whole of it, in
sequence order, so that routing is the 1-process routing; ``take_tokens`` returns the rank its own part;
``dispatch`` and ``combine`` carry slots to the ranks that hold their experts and back.

Shape letters: T tokens (B * S), X experts, C slots per expert, k choices, D model width, F expert width; s this
rank's part of a sequence (S without context or sequence parallelism).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops

from core.model.flops import moe_capacity
from core.model.layers import MLP, Identity, Linear, normal, parameter
from core.model.precision import Computes, to_compute, written

_bmm_nt = ops.BatchMatMul(transpose_b=True)


class GroupedExperts(nn.Cell, Computes):
    """X SwiGLU experts as stacked weights: w_gate, w_up (X, F, D), w_down (X, D, F); (X, C, D) -> (X, C, D)."""

    def __init__(self, n_experts: int, d_model: int, hidden: int, *, init_std: float, out_std: float, dtype=ms.float32):
        super().__init__()
        self.stds = (init_std, init_std, out_std)
        self.w_gate = parameter((n_experts, hidden, d_model), dtype)
        self.w_up = parameter((n_experts, hidden, d_model), dtype)
        self.w_down = parameter((n_experts, d_model, hidden), dtype)

    def reset_parameters(self, rng: np.random.Generator):
        for w, std in zip((self.w_gate, self.w_up, self.w_down), self.stds, strict=True):
            w.set_data(normal(rng, w.shape, std, w.dtype))

    def construct(self, x):
        p = self.compute_precision
        x = to_compute(x, p)  # (X, C, D)
        gate = written(_bmm_nt(x, to_compute(self.w_gate, p)), p)  # (X, C, F)
        up = written(_bmm_nt(x, to_compute(self.w_up, p)), p)  # (X, C, F)
        h = written(mint.nn.functional.silu(gate) * up, p)  # (X, C, F)
        return written(_bmm_nt(h, to_compute(self.w_down, p)), p)  # (X, C, D)


class AuxLoss(nn.Cell):
    """(h, aux) -> h; backward: dh passes through and aux receives ``scale`` (the aux-loss weight), as if
    ``scale * aux`` were added to the loss."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def construct(self, h, aux):
        return h * 1.0  # a new tensor: a bprop-Cell that returns its input loses its bprop (core.parallel.comm)

    def bprop(self, h, aux, out, dout):
        return dout, ops.ones_like(aux) * self.scale


class MoE(nn.Cell):
    """(B, S, D) -> (B, S, D): routed experts (plus shared experts, which every token uses)."""

    def __init__(self, cfg, out_std: float, dtype=ms.float32):
        super().__init__()
        X, k = cfg.n_experts, cfg.moe_top_k
        self.n_experts, self.top_k, self.sigmoid = X, k, cfg.moe_router == "sigmoid"
        self.norm_topk = cfg.moe_norm_topk  # a plain bool: graph mode reads it as a constant
        self.routed_scale = cfg.moe_routed_scale
        self.groups, self.topk_groups = cfg.moe_groups, cfg.moe_topk_groups
        self.has_bias = cfg.moe_score_bias
        self.aux_per_sequence = cfg.moe_aux_per_sequence
        # Not trainable: DeepSeek-V3's choice bias (a checkpoint's ``e_score_correction_bias``), and each expert's
        # (token, choice) pairs since the balance update last read them (summed over micro-batches; a block that
        # recomputes its forward counts twice, which the update's sign ignores).
        self.score_bias = Parameter(Tensor(np.zeros(X, np.float32)), requires_grad=False) if self.has_bias else None
        self.load = Parameter(Tensor(np.zeros(X, np.float32)), requires_grad=False) if self.has_bias else None
        self.capacity_factor = cfg.moe_capacity_factor
        hidden = cfg.moe_ffn_hidden or cfg.ffn_hidden
        self.router = Linear(cfg.d_model, X, init_std=cfg.init_std, dtype=dtype)
        self.router.op.in_fp32 = True
        self.experts = GroupedExperts(X, cfg.d_model, hidden, init_std=cfg.init_std, out_std=out_std, dtype=dtype)
        self.shared = (
            MLP(cfg.d_model, hidden * cfg.moe_shared_experts, init_std=cfg.init_std, out_std=out_std, dtype=dtype)
            if cfg.moe_shared_experts
            else None
        )
        self.aux_loss = AuxLoss(cfg.moe_aux_loss_weight)
        # The mesh's seams (module docstring).
        self.gather_tokens, self.gather_logits, self.take_tokens = Identity(), Identity(), Identity()
        self.dispatch, self.combine = Identity(), Identity()
        # Not trainable: the (token, choice) pairs this layer dropped in its last forward (a metric).
        self.dropped = Parameter(Tensor(0.0, ms.float32), requires_grad=False)

    def capacity(self, tokens: int) -> int:
        return moe_capacity(tokens, self.top_k, self.n_experts, self.capacity_factor)

    def construct(self, x):
        # the router in fp32 whatever the precision (its matmul, scores and gates: core.model.precision)
        x32 = x if x.dtype == ms.float32 else x.astype(ms.float32)  # (no Cast kernel in fp32 op by op)
        logits = self.gather_logits(self.router(x32))  # (B, s, D) -> (B, S, X)
        # after the logits: two gathers over one group must come in the same order on every rank
        xs = self.gather_tokens(ops.depend(x, logits))  # (B, S, D)
        B, S, D = xs.shape
        T, X, k = B * S, self.n_experts, self.top_k
        C = self.capacity(T)
        xt, logits = xs.reshape(T, D), logits.reshape(T, X)  # (T, D), (T, X)
        scores = ops.sigmoid(logits) if self.sigmoid else ops.softmax(logits, -1)
        if self.has_bias or self.groups > 1:
            expert = self.choose(ops.stop_gradient(scores))  # (T, k) int32
            top = ops.gather_elements(scores, 1, expert)  # (T, k)
        else:
            top, expert = ops.topk(scores, k)  # (T, k), (T, k) int32
        gates = top / top.sum(-1, keepdims=True) if self.norm_topk else top  # (T, k)
        if self.routed_scale != 1.0:
            gates = gates * self.routed_scale

        # Slots, choice-major: pair (choice j, token t) is row j * T + t.
        pair_expert = expert.T.reshape(-1)  # (kT,)
        chosen = ops.one_hot(pair_expert, X, Tensor(1, ms.int32), Tensor(0, ms.int32))  # (kT, X)
        position = ((ops.cumsum(chosen, 0) - 1) * chosen).sum(-1)  # (kT,) place in its expert
        keep = position < C  # (kT,)
        slot = ops.select(keep, pair_expert * C + position, ops.full_like(position, X * C))  # X*C: a bin
        token = ops.tile(ops.cumsum(ops.ones((T,), ms.int32), 0) - 1, (k,))  # (kT,) 0..T-1 (no CPU Arange)
        # each slot's token (T: the zero row for an empty slot); the bin row takes every dropped pair
        source = ops.tensor_scatter_elements(ops.full((X * C + 1,), T, dtype=ms.int32), slot, token, 0)
        rows = ops.concat((xt, ops.zeros((1, D), xt.dtype)))  # (T + 1, D)
        slots = ops.gather(rows, source[: X * C], 0).reshape(X, C, D)  # (X, C, D)
        out = self.combine(self.experts(self.dispatch(slots)))  # (X, C, D)
        out = ops.concat((out.reshape(X * C, D), ops.zeros((1, D), out.dtype)))  # (X C + 1, D)
        routed = ops.gather(out, slot, 0).reshape(k, T, D)  # (k, T, D)
        y = (routed * gates.T.reshape(k, T, 1)).sum(0)  # (T, D)

        # Load balance over this micro-batch's (token, choice) pairs, or each sequence's (module docstring).
        if self.aux_per_sequence:
            counts = ops.stop_gradient(chosen.astype(scores.dtype).reshape(k, B, S, X).sum(0).sum(1))  # (B, X)
            shares = (scores / scores.sum(-1, keepdims=True)).reshape(B, S, X).mean(1)  # (B, X)
            aux = X * (counts / (S * k) * shares).sum(-1).mean()
        else:
            stats = ops.concat(
                (ops.stop_gradient(chosen.astype(scores.dtype).sum(0)), scores.sum(0), Tensor([T], scores.dtype))
            )  # (2X + 1,)
            n = stats[2 * X]
            aux = X * (stats[:X] / (n * k) * (stats[X : 2 * X] / n)).sum()
        y = self.aux_loss(y, aux)
        ops.assign(self.dropped, (k * T - keep.astype(ms.float32).sum()).astype(ms.float32))
        if self.has_bias:
            ops.assign(self.load, self.load + ops.stop_gradient(chosen.astype(ms.float32).sum(0)))
        y = self.take_tokens(y.reshape(B, S, D))  # (B, s, D)
        return y + self.shared(x) if self.shared is not None else y

    def choose(self, scores):
        """(T, X) scores -> (T, k) experts: the best biased scores, among the best groups' experts."""
        choice = scores + self.score_bias if self.has_bias else scores  # (T, X)
        if self.groups > 1:
            T, X, G = choice.shape[0], self.n_experts, self.groups
            grouped = choice.reshape(T, G, X // G)
            rank = ops.topk(grouped, 2)[0].sum(-1)  # (T, G): each group's two best
            best = ops.topk(rank, self.topk_groups)[1]  # (T, g)
            keep = ops.one_hot(best, G, Tensor(1.0, ms.float32), Tensor(0.0, ms.float32)).sum(1)  # (T, G)
            keep = ops.broadcast_to(keep.reshape(T, G, 1), (T, G, X // G)).reshape(T, X)
            choice = ops.select(keep > 0, choice, ops.full_like(choice, -np.inf))  # the other groups' experts out
        return ops.topk(choice, self.top_k)[1]


def moe_layers(model: nn.Cell) -> list[MoE]:
    return [cell for _, cell in model.cells_and_names() if isinstance(cell, MoE)]
