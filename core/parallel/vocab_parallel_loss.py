"""The fused linear cross-entropy with the vocabulary split over tensor-parallel ranks (Megatron-LM's
vocab-parallel cross-entropy, Shoeybi et al. 2019, fused with the head matmul as in ``core.model.loss``).

Rank t holds rows [t*V/tp, (t+1)*V/tp) of the head weight and computes only its (tokens, V/tp) block of logits,
chunk by chunk; the full-vocabulary logits never exist anywhere. Per chunk of tokens, three numbers per row are
reduced across the group: each rank's log-sum-exp over its vocabulary block (all-gathered, then combined as
``lse = m + log(sum_t exp(lse_t - m))`` with ``m = max_t lse_t``, the online-softmax merge of Milakov &
Gimelshein 2018), and the target's logit (all-reduced: only the rank that owns the target contributes it). Then
every rank knows the exact loss, and its block of ``softmax - onehot`` gives

    d loss / d weight_t = (softmax - onehot)_t^T h   (this rank's rows: no communication)
    d loss / d h        = sum_t (softmax - onehot)_t W_t   (partial per rank: the caller's region entry sums it)

Like ``core.model.loss.linear_cross_entropy``, the gradients are made in the forward pass (Liger-Kernel), so the Cell's
bprop only scales them. The caller enters the tensor-parallel region first (``CopyTo``, or with sequence
parallelism ``GatherFrom`` along the sequence), whose backward sums the partial ``d loss / d h``.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from core.model.loss import IGNORE_INDEX, rows_per_chunk
from core.model.precision import Computes, rounded
from core.parallel import comm

_softmax = ops.Softmax(-1)
_matmul = ops.MatMul()
_matmul_nt = ops.MatMul(transpose_b=True)
_matmul_tn = ops.MatMul(transpose_a=True)
_scatter_add = ops.TensorScatterAdd()
_depend = ops.Depend()
_argmax_with_value = ops.ArgMaxWithValue(-1)
_zeros_like = ops.ZerosLike()


def _local_targets(labels, start, rows_local, c):
    """labels (N,) -> index (N, 2) = [row within its chunk, target's column in this rank's block (0 if not
    here)], here (N,) float 1/0 = the target is in this rank's block, token weight (N,) = 1/n_valid or 0 for
    ignored tokens (all 0, not NaN, if none is kept)."""
    keep = (labels != IGNORE_INDEX).astype(ms.float32)
    local = labels - start
    here_b = ops.logical_and(local >= 0, local < rows_local)
    here = here_b.astype(ms.float32) * keep
    column = ops.where(here_b, local, _zeros_like(local))
    rows = ops.arange(labels.shape[0], dtype=ms.int32) % c
    return ops.stack([rows, column], 1), here, keep / ops.maximum(keep.sum(), 1.0)


class _Merge(nn.Cell):
    """Per-row log-sum-exp over the whole vocabulary and the target's logit, from each rank's block."""

    def __init__(self, group: comm.Group):
        super().__init__()
        self.gather = comm.all_gather(group, 0)
        self.reduce = comm.all_reduce(group)

    def construct(self, logits, index, here):
        p = _softmax(logits)  # (c, Vt), this block only
        top, top_logit = _argmax_with_value(logits)
        top_p = ops.gather_elements(p, 1, top.reshape(-1, 1)).reshape(-1)  # exp(top_logit - lse_t)
        lse_t = top_logit - ops.log(top_p)  # (c,)
        every = self.gather(lse_t.reshape(1, -1))  # (tp, c)
        m = ops.amax(every, 0)
        lse = m + ops.log(ops.sum(ops.exp(every - m.reshape(1, -1)), 0))  # (c,)
        target = ops.gather_elements(logits, 1, index[:, 1:]).reshape(-1) * here
        target = self.reduce(target)  # (c,)
        return p, lse_t, lse, target


class _VocabBlock(nn.Cell):
    """Holds what both losses need: the merge over the group and where this rank's vocabulary block starts."""

    def __init__(self, group: comm.Group, vocab_start: int):
        super().__init__()
        self.merge = _Merge(group)
        self.start = vocab_start


class _VocabParallelLinearCrossEntropy(_VocabBlock):
    """loss = sum over tokens of weight * (lse - logit[target]) with this rank's (V/tp, D) block of the head."""

    def construct(self, hidden, weight, labels, c):
        index, here, token_weight = _local_targets(labels, self.start, weight.shape[0], c)
        loss = ops.zeros((), ms.float32)
        grad_weight = ops.zeros(weight.shape, weight.dtype)  # (Vt, D)
        grad_hidden = []
        for s in range(0, hidden.shape[0], c):
            h = _depend(hidden[s : s + c], grad_weight)  # (c, D), one chunk at a time
            idx, w_tok = index[s : s + c], token_weight[s : s + c]
            p, lse_t, lse, target = self.merge(_matmul_nt(h, weight), idx, here[s : s + c])
            loss = loss + ((lse - target) * w_tok).sum()
            scale = ops.BroadcastTo(p.shape)(
                ops.exp(lse_t - lse).reshape(-1, 1)
            )  # explicit broadcast (core.model.loss)
            g = _scatter_add(p * scale, idx, -here[s : s + c])  # softmax - onehot, this block
            w = ops.broadcast_to(w_tok.reshape(-1, 1), h.shape)  # (c, D)
            grad_h = _matmul(g, weight) * w  # (c, D), partial over ranks
            grad_weight = grad_weight + _matmul_tn(g, _depend(h * w, grad_h))
            grad_hidden.append(grad_h)
        return loss, ops.concat(grad_hidden, 0), grad_weight

    def bprop(self, hidden, weight, labels, c, out, dout):
        return out[1] * dout[0], out[2] * dout[0], _zeros_like(labels), 0


class _VocabParallelEval(_VocabBlock):
    """The loss of ``_VocabParallelLinearCrossEntropy`` without making gradients (validation)."""

    def construct(self, hidden, weight, labels, c):
        index, here, token_weight = _local_targets(labels, self.start, weight.shape[0], c)
        loss = ops.zeros((), ms.float32)
        for s in range(0, hidden.shape[0], c):
            h = _depend(hidden[s : s + c], loss)
            _, _, lse, target = self.merge(_matmul_nt(h, weight), index[s : s + c], here[s : s + c])
            loss = loss + ((lse - target) * token_weight[s : s + c]).sum()
        return loss


class VocabParallelCrossEntropyLoss(nn.Cell, Computes):
    """The trainer's loss op with the head weight split by vocabulary rows over ``group``:
    (hidden (B, S, D) or, with sequence parallelism, (B, S/tp, D); weight (V/tp, D); labels (B, S)) -> mean NLL,
    the same number on every rank of the group."""

    def __init__(self, group: comm.Group, *, vocab_start: int, sequence_parallel: bool, train: bool = True):
        super().__init__()
        # Enter the region: the backward of either sums the partial d loss / d hidden over the group.
        self.enter = comm.enter_region(group, sequence_parallel)
        self.train = train
        if train:
            self.ce = _VocabParallelLinearCrossEntropy(group, vocab_start)
        else:
            self.ce = _VocabParallelEval(group, vocab_start)

    def construct(self, hidden, weight, labels):
        p = self.compute_precision  # the loss in fp32 on the compute precision's values (LinearCrossEntropyLoss)
        h = self.enter(hidden)  # (B, S, D)
        h, weight = rounded(h.reshape(-1, h.shape[-1]), p), rounded(weight, p)
        c = rows_per_chunk(h.shape[0], weight.shape[0])
        if self.train:
            return self.ce(h, weight, labels.reshape(-1), c)[0]
        return self.ce(h, weight, labels.reshape(-1), c)
