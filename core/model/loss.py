"""Cross-entropy over a large vocabulary without the (tokens x vocab) tensors autodiff would keep.

All three losses are the mean negative log-likelihood over tokens whose label is not ``ignore_index`` (0, not
NaN, when every token is ignored):

- ``naive_cross_entropy(logits, labels)``: ``ops.log_softmax`` + gather, differentiated by MindSpore. Autodiff
  keeps the (N, V) log-probabilities for the backward; the reference the other two are measured against.
- ``cross_entropy(logits, labels)``: one op with the hand-written backward ``(softmax - onehot) * g / n_valid``,
  computed chunk by chunk of rows from the logits and two small buffers the forward saves: (N, 2) indices
  [row in chunk, target] and (N,) token weights (1 / n_valid, or 0 for ignored tokens).
- ``linear_cross_entropy(hidden, weight, labels)``: the lm_head matmul fused in too, chunk by chunk over tokens,
  so the (N, V) logits never exist: the fused linear cross-entropy of Liger-Kernel (Hsu et al. 2024, "Liger
  Kernel: Efficient Triton Kernels for LLM Training"), which also computes the gradients during the forward
  pass. Wijmans et al. 2024 ("Cut Your Losses in Large-Vocabulary Language Models") take the same idea down to
  blocks of the vocabulary inside one kernel.

Custom backward in MindSpore 2.10 (docs/mindspore-cpu.md, "Autodiff and custom backward"): a ``Cell`` with a
``bprop`` method gives correct gradients in PyNative and under ``mindspore.jit`` only if the Cell owns no Parameter,
so the lm_head weight is an *input* (a model passes its own Parameter or tied embedding).

What MindSpore 2.10's CPU backend does, measured (fresh processes, fp32), and shaped this code (the figures:
benchmarks/RESULTS.md, "core/model/loss.py"; the three losses side by side: "Fused cross-entropy"):
- Broadcasting elementwise ops (``x - m[:, None]``, ``x * s[:, None]``, ``where``, ``masked_fill``) raise the
  memory peak by several extra output-sized buffers; after an explicit ``BroadcastTo`` the op adds none. So per-row
  scales go on the small (rows, D) side where the algebra allows, and are broadcast explicitly elsewhere.
- ``ReduceMax`` (``ops.amax``) over V is many times slower than ``ArgMaxWithValue``, and the softmax kernel needs
  no workspace, so the logsumexp is read off the softmax: ``lse = max(x) - log(softmax(x)[argmax x])`` (that
  probability is >= 1/V, so its log is well conditioned).
- Under jit, independent chunks are not run one after another: without a ``Depend`` edge chaining chunk i+1 to
  chunk i, the fused step peaked several times higher.
- Graph mode has no in-place slice writes (``x[a:b] = y``, ``index_add``, ``copy_``: each copies the whole
  buffer), so ``cross_entropy`` assembles its (N, V) gradient with one ``Concat``: the chunk results and the
  result are alive together, which puts it level with naive in memory (see benchmarks/fused_ce.py). In PyNative,
  ``index_add`` into a preallocated gradient is in place (below naive's peak), but the same code took more than
  naive under jit, the training path. Only the fused version, which never forms (N, V), saves memory here.
- float32 ``exp`` is approximate (its relative error measured against float64), so probabilities, hence
  gradients, carry its element-wise error whatever the formula; tests bound gradients norm-wise.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from core.model.precision import Computes, rounded

IGNORE_INDEX = -100
# Rows per chunk default to about this many fp32 logits (32 MiB; 256 rows at V = 32768): small next to the (N, V)
# tensors avoided (512 MiB at N = 4096), big enough that the chunk matmuls run at full speed. Under jit the
# unrolled graph keeps some memory per chunk once compiled, so 128-row chunks took no less memory and 512-row ones
# more (benchmarks/RESULTS.md, "core/model/loss.py").
CHUNK_ELEMENTS = 1 << 23

# Under jit, a Python function that contains a branch (even `a if c else b`, as in ops.zeros_like or
# ops.softmax) and is called from both a bprop-Cell's construct and its bprop fails to compile ("The func graph
# is empty"). So the backward passes use Primitive objects like these, and the helpers below are each called
# from only one side of any Cell.
_softmax = ops.Softmax(-1)
_matmul = ops.MatMul()
_matmul_nt = ops.MatMul(transpose_b=True)  # h @ W^T without copying W^T
_matmul_tn = ops.MatMul(transpose_a=True)  # G^T @ h without copying G^T
_scatter_add = ops.TensorScatterAdd()
_concat_rows = ops.Concat(0)
_zeros_like = ops.ZerosLike()
_depend = ops.Depend()
_argmax_with_value = ops.ArgMaxWithValue(-1)


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
    top, top_logit = _argmax_with_value(logits)  # (c,), (c,)
    top_p = ops.gather_elements(p, 1, top.reshape(-1, 1)).reshape(-1)  # = exp(top_logit - lse)
    target_logit = ops.gather_elements(logits, 1, index[:, 1:]).reshape(-1)
    return p, top_logit - ops.log(top_p) - target_logit


def _minus_onehot(p, index):
    """p (c, V) -> p - onehot(target): each row's softmax cross-entropy gradient, before scaling."""
    return _scatter_add(p, index, ops.fill(p.dtype, (index.shape[0],), -1.0))


def _fused_chunk(h, weight, index, token_weight, grad_weight):
    """One chunk of the fused loss: h (c, D), weight (V, D), index (c, 2), token_weight (c,), grad_weight (V, D)
    -> weighted loss sum (), d loss / d h (c, D), grad_weight + d loss / d weight from this chunk (V, D).
    A function of its own so that in PyNative the (c, V) temporaries die on return, not when the next chunk
    rebinds their names."""
    p, nll = _chunk_loss(_matmul_nt(h, weight), index)  # (c, V), (c,)
    g = _minus_onehot(p, index)  # (c, V)
    # Token weights go on the (c, D) side: (w * G) @ W = w * (G @ W) and (w * G)^T @ h = G^T @ (w * h), so no
    # (c, V) tensor is scaled.
    w = ops.broadcast_to(token_weight.reshape(-1, 1), h.shape)  # (c, D)
    grad_h = _matmul(g, weight) * w  # (c, D)
    # grad_h first, then the (V, D) update: under jit this order peaked lower than the reverse or none
    # (benchmarks/RESULTS.md, "core/model/loss.py").
    hw = _depend(h * w, grad_h)
    return (nll * token_weight).sum(), grad_h, grad_weight + _matmul_tn(g, hw)


class _CrossEntropy(nn.Cell):
    """loss = sum over tokens of weight * (lse - logit[target]); backward chunk by chunk from the logits."""

    def construct(self, logits, labels, ignore_index, c):
        index, weight = _prepare(labels, ignore_index, c)
        loss = ops.zeros((), ms.float32)
        for s in range(0, logits.shape[0], c):
            x = _depend(logits[s : s + c], loss)  # one chunk at a time
            _, nll = _chunk_loss(x, index[s : s + c])
            loss = loss + (nll * weight[s : s + c]).sum()
        # index and weight go out with the loss: they are all the backward needs beside the logits.
        return loss, index, weight

    def bprop(self, logits, labels, ignore_index, c, out, dout):
        _, index, weight = out
        row_scale = weight * dout[0]  # (N,) d loss / d nll_i
        chunks = [row_scale]
        for s in range(0, logits.shape[0], c):
            x = _depend(logits[s : s + c], chunks[-1])  # one chunk at a time
            g = _minus_onehot(_softmax(x), index[s : s + c])  # (c, V)
            # An explicit broadcast: an implicit one would cost several more (c, V) buffers (module docstring).
            scale = ops.BroadcastTo(g.shape)(row_scale[s : s + c].reshape(-1, 1))
            chunks.append(g * scale)
        return _concat_rows(chunks[1:]), _zeros_like(labels), 0, 0


class _LinearCrossEntropy(nn.Cell):
    """loss = sum over tokens of weight * CE(hidden @ weight^T, labels); gradients computed in the forward.

    Why in the forward (Liger) rather than recomputing each chunk's logits in the backward: it does 3 chunk
    matmuls instead of 4, and the gradients it holds from forward to backward, (N, D) + (V, D), have the size of
    the result anyway. Measured side by side under jit, it was faster and peaked lower than the recomputing
    version. The cost: a forward without backward (evaluation) still computes the gradients, under jit too, since
    the Depend chain that keeps one chunk alive at a time puts them on the loss's path: forward-only took longer
    than naive's forward, which holds the (N, V) logits (benchmarks/RESULTS.md, "core/model/loss.py").
    """

    def construct(self, hidden, weight, labels, ignore_index, c):
        index, token_weight = _prepare(labels, ignore_index, c)
        loss = ops.zeros((), ms.float32)
        grad_weight = ops.zeros(weight.shape, weight.dtype)  # (V, D)
        grad_hidden = []
        for s in range(0, hidden.shape[0], c):
            h = _depend(hidden[s : s + c], grad_weight)  # (c, D), one chunk at a time
            loss_c, grad_h, grad_weight = _fused_chunk(
                h, weight, index[s : s + c], token_weight[s : s + c], grad_weight
            )
            loss = loss + loss_c
            grad_hidden.append(grad_h)
        return loss, ops.concat(grad_hidden, 0), grad_weight

    def bprop(self, hidden, weight, labels, ignore_index, c, out, dout):
        # The gradients of the loss were made in the forward pass; the chain rule only scales them.
        return out[1] * dout[0], out[2] * dout[0], _zeros_like(labels), 0, 0


# Built once, at import, and shared: they own no Parameter and no state. The chunk size and ignore_index go in as
# Python ints, constants to jit. (A Cell built inside a jit-compiled function gets a function, not the forward
# outputs, as its bprop's `out`; a cache dict filled while compiling is empty again when the graph runs.)
_CROSS_ENTROPY = _CrossEntropy()
_LINEAR_CROSS_ENTROPY = _LinearCrossEntropy()


def naive_cross_entropy(logits, labels, ignore_index: int = IGNORE_INDEX):
    """logits (N, V) fp32, labels (N,) int32 -> mean NLL over non-ignored tokens (scalar fp32); autodiff backward."""
    keep = labels != ignore_index
    valid = keep.astype(ms.float32)
    target = ops.where(keep, labels, ops.zeros_like(labels))
    logp = ops.log_softmax(logits, -1)  # (N, V), kept for backward
    nll = -ops.gather_elements(logp, 1, target.reshape(-1, 1)).reshape(-1)
    return (nll * valid).sum() / ops.maximum(valid.sum(), 1.0)


def cross_entropy(logits, labels, ignore_index: int = IGNORE_INDEX, chunk_size: int | None = None):
    """logits (N, V) fp32, labels (N,) int32 -> mean NLL over non-ignored tokens (scalar fp32).

    chunk_size: rows per chunk (default: about CHUNK_ELEMENTS logits per chunk)."""
    chunk = rows_per_chunk(logits.shape[0], logits.shape[1], chunk_size)
    return _CROSS_ENTROPY(logits, labels, ignore_index, chunk)[0]


def linear_cross_entropy(hidden, weight, labels, ignore_index: int = IGNORE_INDEX, chunk_size: int | None = None):
    """hidden (N, D), weight (V, D) (lm_head or tied embedding), labels (N,) int32 -> mean NLL (scalar fp32)
    of the logits hidden @ weight^T, without materialising them.

    chunk_size: tokens per chunk (default: about CHUNK_ELEMENTS logits per chunk)."""
    chunk = rows_per_chunk(hidden.shape[0], weight.shape[0], chunk_size)
    return _LINEAR_CROSS_ENTROPY(hidden, weight, labels, ignore_index, chunk)[0]


def linear_cross_entropy_eval(hidden, weight, labels, ignore_index: int = IGNORE_INDEX, chunk_size: int | None = None):
    """The loss of ``linear_cross_entropy`` for evaluation: chunked the same way, but no gradient is made.

    ``linear_cross_entropy`` computes its gradients in the forward pass (they are its whole point in training),
    which would double the cost of a validation pass that never calls backward."""
    chunk = rows_per_chunk(hidden.shape[0], weight.shape[0], chunk_size)
    index, token_weight = _prepare(labels, ignore_index, chunk)
    loss = ops.zeros((), ms.float32)
    for s in range(0, hidden.shape[0], chunk):
        h = _depend(hidden[s : s + chunk], loss)  # one chunk at a time
        _, nll = _chunk_loss(_matmul_nt(h, weight), index[s : s + chunk])  # (c,)
        loss = loss + (nll * token_weight[s : s + chunk]).sum()
    return loss


class LinearCrossEntropyLoss(nn.Cell, Computes):
    """The trainer's loss head as an op: (hidden (B, S, D), weight (V, D), labels (B, S)) -> mean NLL.

    ``train=True``: ``linear_cross_entropy`` (gradients made in the forward pass); ``False``: the evaluation loss.
    A Cell that takes the head weight as an input, so that tensor parallelism can swap it for the vocab-parallel
    loss and FSDP can wrap it to gather a sharded weight, like every other weight's op (core.model.layers).
    In mixed precision the hidden states and the head come in the compute precision's values and the loss runs in
    fp32 arithmetic on them (``core.model.precision.rounded``).
    """

    def __init__(self, train: bool = True):
        super().__init__()
        self.train = train

    def construct(self, hidden, weight, labels):
        p = self.compute_precision
        h = rounded(hidden.reshape(-1, hidden.shape[-1]), p)  # (B*S, D)
        w, y = rounded(weight, p), labels.reshape(-1)  # (V, D), (B*S,)
        if self.train:
            return linear_cross_entropy(h, w, y)
        return linear_cross_entropy_eval(h, w, y)
