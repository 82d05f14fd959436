"""Cross-entropy over a large vocabulary without holding the (tokens x vocab) tensors autodiff would keep.

Three losses, all the mean negative log-likelihood over tokens whose label is not ``ignore_index``:

- ``naive_cross_entropy(logits, labels)``: ``ops.log_softmax`` + gather, differentiated by MindSpore.
  Autodiff keeps the (N, V) log-probabilities for the backward and builds further (N, V) temporaries there;
  it is the reference the other two are measured against.
- ``cross_entropy(logits, labels)``: one op with a hand-written backward ``(softmax - onehot) * g / n_valid``
  (the textbook gradient of softmax cross-entropy), computed chunk by chunk over rows, so that beside the
  input logits and the returned gradient only one chunk of rows is alive.
- ``linear_cross_entropy(hidden, weight, labels)``: the lm_head matmul fused in as well, chunk by chunk over
  tokens, so the full (N, V) logits never exist. This is the fused linear cross-entropy of Liger-Kernel
  (Hsu et al. 2024, "Liger Kernel: Efficient Triton Kernels for LLM Training"), which computes the gradients
  during the forward pass; Wijmans et al. 2024 ("Cut Your Losses in Large-Vocabulary Language Models") push
  the same idea down to blocks of the vocabulary inside one kernel.

Custom backward in MindSpore 2.10 (see shared/MINDSPORE_CPU.md): a ``Cell`` with a ``bprop`` method gives correct
gradients in PyNative and under ``mindspore.jit`` only if the Cell owns no Parameter, so the lm_head weight is an
*input* here (a model passes its own Parameter or tied embedding in). ``ms._Function`` fails under jit.

Three facts about MindSpore's CPU kernels shape the code (measured in fresh processes, 1024 x 32768 fp32):
- Elementwise ops that broadcast (``x - row_max[:, None]``, ``x * scale[:, None]``, ``where``, ``masked_fill``)
  grow the memory peak by about 4 extra output-sized buffers; the same op on equal shapes, or after an explicit
  ``ops.broadcast_to``, adds none. So no (rows, V) op here broadcasts, and per-row scales are applied to the
  small (rows, D) side wherever the algebra allows.
- ``ops.softmax`` needs no workspace, so the per-row logsumexp is read off the softmax itself:
  ``lse = max(x) - log(max(softmax(x)))`` (the largest probability is exp(max - lse) >= 1/V, so its log is well
  conditioned); the usual ``max + log(sum(exp(x - max)))`` would broadcast.
- float32 ``exp`` is approximate on this CPU (relative error: mean 1.4e-6, max 5.6e-6 against float64), so
  probabilities, hence gradients, carry that much element-wise error whatever the formula; tests check gradients
  norm-wise.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

IGNORE_INDEX = -100
# Rows per chunk default to about this many fp32 elements of logits (16 MiB): big enough for efficient matmuls,
# small next to the (N, V) tensors being avoided (N = 4096, V = 32768 is 512 MiB).
CHUNK_ELEMENTS = 1 << 22

# Under jit, a Python function that contains a branch (even `a if c else b`, as in ops.zeros_like or
# ops.softmax) and is called from both a bprop-Cell's construct and its bprop fails to compile ("The func graph
# is empty"). So the backward passes use Primitive objects like these, and the helpers below are each called
# from only one side of any Cell.
_softmax = ops.Softmax(-1)
_matmul = ops.MatMul()
_matmul_nt = ops.MatMul(transpose_b=True)                                       # h @ W^T without copying W^T
_matmul_tn = ops.MatMul(transpose_a=True)                                       # G^T @ h without copying G^T
_scatter_add = ops.TensorScatterAdd()
_concat_rows = ops.Concat(0)
_zeros_like = ops.ZerosLike()


def rows_per_chunk(n: int, v: int, chunk_size: int | None = None) -> int:
    """Rows of an (n, v) problem per chunk: chunk_size, or about CHUNK_ELEMENTS elements, at most n."""
    if chunk_size is None:
        chunk_size = max(1, CHUNK_ELEMENTS // v)
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0 (got {chunk_size})")
    return min(chunk_size, n)


def _prepare(labels, ignore_index, c):
    """labels (N,) int32 -> index (N, 2) int32 = [row within its chunk of c rows, target class],
    weight (N,) fp32 = 1 / n_valid for kept tokens, 0 for ignored ones (and all 0, not NaN, if none is kept).
    Ignored tokens point at class 0; their weight 0 removes them from the loss and the gradient."""
    keep = labels != ignore_index
    target = ops.where(keep, labels, _zeros_like(labels))
    rows = ops.arange(labels.shape[0], dtype=ms.int32) % c
    valid = keep.astype(ms.float32)
    return ops.stack([rows, target], 1), valid / ops.maximum(valid.sum(), 1.0)


def _chunk_loss(logits, index):
    """logits (c, V), index (c, 2) -> probabilities p (c, V), per-token loss lse - logit[target] (c,)."""
    p = _softmax(logits)
    lse = ops.amax(logits, -1) - ops.log(ops.amax(p, -1))                       # (c,)
    target_logit = ops.gather_elements(logits, 1, index[:, 1:]).reshape(-1)
    return p, lse - target_logit


def _minus_onehot(p, index):
    """p (c, V) -> p - onehot(target): each row's softmax cross-entropy gradient, before scaling."""
    return _scatter_add(p, index, ops.fill(p.dtype, (index.shape[0],), -1.0))


class _CrossEntropy(nn.Cell):
    """loss = sum over tokens of weight * (lse - logit[target]); backward chunk by chunk from the logits."""

    def __init__(self, ignore_index: int, chunk: int):
        super().__init__()
        self.ignore_index = ignore_index
        self.chunk = chunk

    def construct(self, logits, labels):
        c = self.chunk
        index, weight = _prepare(labels, self.ignore_index, c)
        loss = ops.zeros((), ms.float32)
        for s in range(0, logits.shape[0], c):
            _, nll = _chunk_loss(logits[s:s + c], index[s:s + c])
            loss = loss + (nll * weight[s:s + c]).sum()
        # index and weight go out with the loss: they are all the backward needs beside the logits.
        return loss, index, weight

    def bprop(self, logits, labels, out, dout):
        c = self.chunk
        _, index, weight = out
        row_scale = weight * dout[0]                                            # (N,) d loss / d nll_i
        chunks = []
        for s in range(0, logits.shape[0], c):
            g = _minus_onehot(_softmax(logits[s:s + c]), index[s:s + c])       # (c, V)
            # An explicit broadcast: an implicit one would cost ~4 more (c, V) buffers (module docstring).
            scale = ops.BroadcastTo(g.shape)(row_scale[s:s + c].reshape(-1, 1))
            chunks.append(g * scale)
        return _concat_rows(chunks), _zeros_like(labels)


class _LinearCrossEntropy(nn.Cell):
    """loss = sum over tokens of weight * CE(hidden @ weight^T, labels); gradients computed in the forward."""

    def __init__(self, ignore_index: int, chunk: int):
        super().__init__()
        self.ignore_index = ignore_index
        self.chunk = chunk

    def construct(self, hidden, weight, labels):
        c = self.chunk
        index, token_weight = _prepare(labels, self.ignore_index, c)
        loss = ops.zeros((), ms.float32)
        grad_weight = ops.zeros(weight.shape, weight.dtype)                    # (V, D)
        grad_hidden = []
        for s in range(0, hidden.shape[0], c):
            h = hidden[s:s + c]                                                 # (c, D)
            p, nll = _chunk_loss(_matmul_nt(h, weight), index[s:s + c])         # (c, V), (c,)
            w = token_weight[s:s + c]
            loss = loss + (nll * w).sum()
            g = _minus_onehot(p, index[s:s + c])                                # (c, V)
            # Token weights go on the (c, D) side: (w * G) @ W = w * (G @ W) and (w * G)^T @ h = G^T @ (w * h),
            # so no (c, V) tensor is scaled.
            w = ops.broadcast_to(w.reshape(-1, 1), h.shape)                     # (c, D)
            grad_hidden.append(_matmul(g, weight) * w)                          # (c, D)
            grad_weight = grad_weight + _matmul_tn(g, h * w)                    # (V, D)
        return loss, ops.concat(grad_hidden, 0), grad_weight

    def bprop(self, hidden, weight, labels, out, dout):
        # The gradients of the loss were made in the forward pass; the chain rule only scales them.
        return out[1] * dout[0], out[2] * dout[0], _zeros_like(labels)


class _LinearCrossEntropyRecompute(nn.Cell):
    """As _LinearCrossEntropy, but the forward keeps only the loss; the backward recomputes chunk logits."""

    def __init__(self, ignore_index: int, chunk: int):
        super().__init__()
        self.ignore_index = ignore_index
        self.chunk = chunk

    def construct(self, hidden, weight, labels):
        c = self.chunk
        index, token_weight = _prepare(labels, self.ignore_index, c)
        loss = ops.zeros((), ms.float32)
        for s in range(0, hidden.shape[0], c):
            _, nll = _chunk_loss(_matmul_nt(hidden[s:s + c], weight), index[s:s + c])
            loss = loss + (nll * token_weight[s:s + c]).sum()
        return loss, index, token_weight

    def bprop(self, hidden, weight, labels, out, dout):
        c = self.chunk
        _, index, token_weight = out
        row_scale = token_weight * dout[0]
        grad_weight = _zeros_like(weight)
        grad_hidden = []
        for s in range(0, hidden.shape[0], c):
            h = hidden[s:s + c]
            g = _minus_onehot(_softmax(_matmul_nt(h, weight)), index[s:s + c])
            w = ops.BroadcastTo(h.shape)(row_scale[s:s + c].reshape(-1, 1))
            grad_hidden.append(_matmul(g, weight) * w)
            grad_weight = grad_weight + _matmul_tn(g, h * w)
        return _concat_rows(grad_hidden), grad_weight, _zeros_like(labels)


_CELLS: dict = {}


def _cell(kind, ignore_index, chunk):
    # One Cell per configuration, built once: jit then reuses its compiled graph.
    key = (kind, ignore_index, chunk)
    if key not in _CELLS:
        _CELLS[key] = kind(ignore_index, chunk)
    return _CELLS[key]


def naive_cross_entropy(logits, labels, ignore_index: int = IGNORE_INDEX):
    """logits (N, V) fp32, labels (N,) int32 -> mean NLL over non-ignored tokens (scalar fp32); autodiff backward."""
    keep = labels != ignore_index
    valid = keep.astype(ms.float32)
    target = ops.where(keep, labels, ops.zeros_like(labels))
    logp = ops.log_softmax(logits, -1)                                          # (N, V), kept for backward
    nll = -ops.gather_elements(logp, 1, target.reshape(-1, 1)).reshape(-1)
    return (nll * valid).sum() / ops.maximum(valid.sum(), 1.0)


def cross_entropy(logits, labels, ignore_index: int = IGNORE_INDEX, chunk_size: int | None = None):
    """logits (N, V) fp32, labels (N,) int32 -> mean NLL over non-ignored tokens (scalar fp32).

    chunk_size: rows per chunk (default: about CHUNK_ELEMENTS logits per chunk)."""
    chunk = rows_per_chunk(logits.shape[0], logits.shape[1], chunk_size)
    return _cell(_CrossEntropy, ignore_index, chunk)(logits, labels)[0]


def linear_cross_entropy(hidden, weight, labels, ignore_index: int = IGNORE_INDEX, chunk_size: int | None = None,
                         recompute: bool = False):
    """hidden (N, D), weight (V, D) (lm_head or tied embedding), labels (N,) int32 -> mean NLL (scalar fp32)
    of the logits hidden @ weight^T, without materialising them.

    chunk_size: tokens per chunk (default: about CHUNK_ELEMENTS logits per chunk)."""
    chunk = rows_per_chunk(hidden.shape[0], weight.shape[0], chunk_size)
    kind = _LinearCrossEntropyRecompute if recompute else _LinearCrossEntropy
    return _cell(kind, ignore_index, chunk)(hidden, weight, labels)[0]
