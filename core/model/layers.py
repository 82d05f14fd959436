"""Layers of the GPT: Linear, Embedding, RMSNorm, rotary embedding, GQA attention, SwiGLU MLP.

Written from elementary ops that have CPU kernels in MindSpore 2.10 (docs/mindspore-cpu.md): the fused mint
embedding, rms_norm and attention kernels are Ascend-only, so the gather, the norm and the attention are spelled
out here. Every leaf layer owns its init rule (`reset_parameters(rng)`); `GPT.init_weights` hands each one a
generator seeded from (seed, the layer's name), so weights do not depend on construction order.

Seams for parallelism (the layers know nothing of ranks; ``core.training.parallelize`` uses these):
- every layer with a weight applies it through an op Cell, ``self.op(x, self.weight)``, that takes the weight
  as an input: tensor parallelism wraps the op (column/row-parallel, vocab-parallel), FSDP wraps it again to
  gather a sharded weight (the bprop-Cell form that carries gradients under ``mindspore.jit``);
- attention and the MLP pass their input through one ``self.enter`` (an ``Identity``) before the projections
  that read it: tensor parallelism makes it the region's one entry (an all-reduce of the input gradient, or with
  sequence parallelism an all-gather of the sequence), shared by those projections as Megatron-LM's fused QKV and
  gate/up matmuls share theirs, so each region pays one collective each way and saves one gathered input;
- attention calls one ``self.sdpa(q, k, v, positions)``, which context parallelism replaces;
- RoPE and the causal mask come from token positions, not from an assumed ``[:S]`` start.

Shape letters: B batch, S sequence, D model width, H query heads, K key/value heads, E head dim, F ffn width.
"""

import math

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops
from mindspore.common.initializer import initializer

from core.config.model import yarn_mscale
from core.model.precision import Computes, to_compute, written


def parameter(shape, dtype) -> Parameter:
    # Placeholder storage; GPT.init_weights fills it (names are only known once the cell tree is assembled).
    return Parameter(initializer("zeros", shape, dtype))


def normal(rng: np.random.Generator, shape, std: float, dtype) -> Tensor:
    # Drawn in float32 on the host so every rank and machine gets the same bits, then cast to the model dtype.
    return Tensor(rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(dtype)


class Identity(nn.Cell):
    """A seam: the identity here, a collective where ``core.training.parallelize`` puts one."""

    def construct(self, x):
        return x


_matmul_nt = ops.MatMul(transpose_b=True)


def linear(x, w):
    """x (..., in) @ w^T with w (out, in), as one 2-D MatMul that reads w transposed in place.

    On CPU a jit step of a small GPT ran faster this way than with mint's linear on 3-D input, with the same losses
    (benchmarks/RESULTS.md, "core/model/layers.py").
    """
    return _matmul_nt(x.reshape(-1, x.shape[-1]), w).reshape(x.shape[:-1] + (-1,))


# Attention's matmuls over (B, N) batches, the second operand read transposed in place for q k^T.
_bmm = ops.BatchMatMul()
_bmm_nt = ops.BatchMatMul(transpose_b=True)
_tile = ops.Tile()  # a primitive: functional ops.tile fails to compile in a bprop's grad (selective recompute)


def _heads_first(x):
    """(B, S, N, E) <-> (B, N, S, E), as a Transpose kernel that writes a new tensor.

    Not mint.permute, and RoPE's halves not by mint.split: on CPU those return views, and MindSpore 2.10 makes a
    view contiguous for the next kernel several times slower than the copying kernel does; RoPE's forward and
    backward ran several times faster with kernels, bit-identical (benchmarks/view_ops.py; benchmarks/RESULTS.md,
    "Views, on an AVX2 machine").
    """
    return ops.transpose(x, (0, 2, 1, 3))


class MatMul(nn.Cell, Computes):
    """The op of a Linear: (x (..., in), w (out, in)) -> x @ w^T (..., out), in the compute precision."""

    def construct(self, x, w):
        p = self.compute_precision
        return written(linear(to_compute(x, p), to_compute(w, p)), p)


class AddBias(nn.Cell, Computes):
    """The op of a Bias: (y (..., out), b (out,)) -> y + b."""

    def construct(self, y, b):
        p = self.compute_precision
        return written(y + to_compute(b, p), p)


class Bias(nn.Cell):
    """A linear's bias (out_features,), zeros at init, as a cell of its own with the weight-and-op seam (its
    ``weight`` is the bias vector), so that FSDP gathers it and tensor parallelism splits it like any weight."""

    def __init__(self, out_features: int, dtype=ms.float32):
        super().__init__()
        self.weight = parameter((out_features,), dtype)
        self.op = AddBias()

    def reset_parameters(self, rng: np.random.Generator):
        self.weight.set_data(Tensor(np.zeros(self.weight.shape, np.float32)).astype(self.weight.dtype))

    def construct(self, y):
        return self.op(y, self.weight)


class Linear(nn.Cell):
    """y = x W^T (+ b with ``bias``); W is stored (out_features, in_features) as in torch/Megatron checkpoints."""

    def __init__(self, in_features: int, out_features: int, *, init_std: float, dtype=ms.float32, bias: bool = False):
        super().__init__()
        self.init_std = init_std
        self.weight = parameter((out_features, in_features), dtype)
        self.op = MatMul()
        self.has_bias = bias  # a plain bool: graph mode reads it as a constant
        self.bias = Bias(out_features, dtype) if bias else None

    def reset_parameters(self, rng: np.random.Generator):
        self.weight.set_data(normal(rng, self.weight.shape, self.init_std, self.weight.dtype))

    def construct(self, x):
        y = self.op(x, self.weight)  # (..., in) -> (..., out)
        return self.bias(y) if self.has_bias else y


class Lookup(nn.Cell, Computes):
    """The op of an Embedding: (tokens (B, S) int32, table (V, D)) -> rows (B, S, D), a gather (mint's embedding
    kernel is missing on CPU; ops.gather and its gradient work). The rows, not the table, are cast: the activations
    start in the compute precision here, and the table's gradient is a scatter of fp32 rows (under FSDP the gathered
    table is already bf16, as torch FSDP's and Megatron's are: core.parallel.fsdp)."""

    def construct(self, tokens, table):
        return to_compute(ops.gather(table, tokens, 0), self.compute_precision)


class Embedding(nn.Cell):
    """Token embedding table (vocab_size, dim)."""

    def __init__(self, vocab_size: int, dim: int, *, init_std: float, dtype=ms.float32):
        super().__init__()
        self.init_std = init_std
        self.weight = parameter((vocab_size, dim), dtype)
        self.op = Lookup()

    def reset_parameters(self, rng: np.random.Generator):
        self.weight.set_data(normal(rng, self.weight.shape, self.init_std, self.weight.dtype))

    def construct(self, tokens):
        return self.op(tokens, self.weight)  # (B, S) int32 -> (B, S, D)


class RMSNormOp(nn.Cell, Computes):
    """The op of an RMSNorm: (x (..., D), w (D,)) -> x / sqrt(mean(x^2) + eps) * w, statistics in float32.

    Over (N, D) rows: MindSpore's CPU reductions over the last axis of a 3-D tensor take a slow path, several times
    slower than over a 2-D one (the weight's gradient, a sum over rows, likewise; benchmarks/RESULTS.md,
    "Slow kernel paths: reductions over 3-D tensors and broadcasting element-wise ops"). A written-out backward was
    faster per norm but made ``capture_mode=bytecode`` crash the process (SIGSEGV) in MindSpore 2.10, so autodiff
    writes this one.
    """

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def construct(self, x, w):
        p = self.compute_precision
        x32 = x.reshape(-1, x.shape[-1]).astype(ms.float32)  # (N, D)
        inv_rms = mint.rsqrt(mint.mean(x32 * x32, dim=-1, keepdim=True) + self.eps)  # (N, 1)
        return written(to_compute(x32 * inv_rms, p) * to_compute(w, p), p).reshape(x.shape)


class RMSNorm(nn.Cell):
    """Root-mean-square norm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * w, no mean-centering, no bias.

    Statistics are taken in float32 whatever the model dtype, as low-precision sums of squares lose digits.
    """

    def __init__(self, dim: int, eps: float, dtype=ms.float32):
        super().__init__()
        self.weight = parameter((dim,), dtype)
        self.op = RMSNormOp(eps)

    def reset_parameters(self, rng: np.random.Generator):
        self.weight.set_data(Tensor(np.ones(self.weight.shape, np.float32)).astype(self.weight.dtype))

    def construct(self, x):
        return self.op(x, self.weight)


def causal_mask(q_positions, k_positions, dtype):
    """Additive mask (Sq, Sk): 0 where the key's position <= the query's, -inf above. Every query sees its own
    position among the keys, so no row is all -inf (softmax stays defined)."""
    allowed = k_positions.reshape(1, -1) <= q_positions.reshape(-1, 1)  # (Sq, Sk) bool
    return ops.select(allowed, ops.zeros(allowed.shape, dtype), ops.fill(dtype, allowed.shape, -np.inf))


class CausalAttention(nn.Cell, Computes):
    """Scaled dot-product attention with a causal mask from positions (Vaswani et al. 2017): q (B, H, Sq, E),
    k (B, K, Sk, E) and v (B, K, Sk, Ev) with their positions, K dividing H (GQA: each KV head serves H / K query
    heads); by hand, as the fused kernels are Ascend-only."""

    _count = 0  # gives each cell's max_logit a name of its own (it is added after the cell tree is named)

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale  # 1 / sqrt(E) (ModelConfig.softmax_scale)
        self.track_max = False  # a plain bool: graph mode reads it as a constant

    def track(self, label: str) -> None:
        """Keep the largest scaled logit q k^T a query attends to in ``max_logit`` (-inf: none since it was reset),
        for ``training.max_attention_logit``; ``label`` names the block (``layers.3``). Called before anything
        compiles."""
        self.label = label
        CausalAttention._count += 1
        self.max_logit = Parameter(Tensor(-np.inf, ms.float32), name=f"max_logit_{self._count}", requires_grad=False)
        self.track_max = True

    def construct(self, q, k, v, q_positions, k_positions):
        B, H, Sq, E = q.shape
        K, Sk, Ev = k.shape[1], k.shape[2], v.shape[3]
        n_rep = H // K
        # GQA without copying k and v per query head: query head h = j * n_rep + r reads KV head j, so the n_rep
        # heads of group j are contiguous in q and attend as one batch of n_rep * Sq rows (a free reshape). On
        # CPU a repeated k / v costs a broadcast forward and a 5-D ReduceSum backward, the largest sums of medium's
        # step. The figures behind this and the two choices below: benchmarks/RESULTS.md,
        # "Slow kernel paths: reductions over 3-D tensors and broadcasting element-wise ops".
        p = self.compute_precision  # q, k, v in it (after RoPE: written), the softmax in fp32, cast back
        q, k, v = written(q, p), written(k, p), written(v, p)
        q = q.reshape(B, K, n_rep * Sq, E)
        mask = causal_mask(_tile(q_positions, (n_rep,)), k_positions, ms.float32)  # (n_rep * Sq, Sk)
        scores = written(_bmm_nt(q, k), p) * self.scale  # (B, K, n_rep * Sq, Sk)
        # The mask written out to the scores' shape (one tensor the graph shares across layers): a broadcasting Add
        # takes MindSpore's per-element slow path on CPU, several times an Add of equal shapes.
        scores = scores + ops.broadcast_to(mask, scores.shape)
        if self.track_max:  # over the logits a query attends to (the masked ones are -inf)
            largest = ops.stop_gradient(scores.reshape(-1).max()).astype(ms.float32)
            ops.assign(self.max_logit, ops.maximum(self.max_logit, largest))
        # Softmax in float32 (exp of low-precision logits loses the small probabilities), over 2-D rows: MindSpore's
        # CPU reductions (softmax's backward) run several times slower over a 4-D tensor's last axis than a 2-D one's.
        probs = to_compute(mint.softmax(scores.reshape(-1, Sk).astype(ms.float32), dim=-1), p)
        return written(_bmm(probs.reshape(scores.shape), v), p).reshape(B, H, Sq, Ev)  # (B, H, Sq, Ev)


class SDPA(nn.Cell):
    """``sdpa(q, k, v, positions)``: causal attention among this rank's tokens, q (B, H, S, E), k/v (B, K, S, E)
    at ``positions`` (S,). The seam that context parallelism replaces (``core.parallel.context_parallel``)."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale
        self.attend = CausalAttention(scale)

    def construct(self, q, k, v, positions):
        return self.attend(q, k, v, positions, positions)


def rope_frequencies(cfg) -> tuple[np.ndarray, float]:
    """(inverse frequencies theta^(-2i/E) (E/2,), the factor on cos and sin) of ``cfg`` (a ModelConfig), after its
    ``rope_scaling``, in float64.

    llama3 (Llama 3.1's reference code): a dimension whose wavelength 2 pi / f is longer than L / low (L the original
    context) turns f / factor, one shorter than L / high keeps f, and between them f blends the two by
    s = (L / wavelength - low) / (high - low). yarn (Peng et al. 2023, "YaRN", sections 3.2-3.4): with r = L /
    wavelength the rotations a dimension makes over the original context, dimensions with r above beta_fast keep f,
    below beta_slow turn f / factor, and a linear ramp over dimension indices joins them; cos and sin are scaled by
    the attention factor (0.1 ln factor + 1 by default), which tempers the softmax.
    """
    E = cfg.rope_dim
    inv_freq = cfg.rope_theta ** (-np.arange(0, E, 2, dtype=np.float64) / E)  # (E/2,)
    factor, L = cfg.rope_factor, cfg.rope_original_max_len
    if cfg.rope_scaling == "llama3":
        low, high = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        wavelength = 2 * math.pi / inv_freq
        smooth = np.clip((L / wavelength - low) / (high - low), 0.0, 1.0)  # 0: long wavelengths, 1: short ones
        return (1 - smooth) * inv_freq / factor + smooth * inv_freq, 1.0
    if cfg.rope_scaling == "yarn":
        # the dimension index i at which a dimension makes r rotations over the original context
        def dim_at(r: float) -> float:
            return E * math.log(L / (r * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))

        lo, hi = dim_at(cfg.rope_beta_fast), dim_at(cfg.rope_beta_slow)
        if cfg.rope_truncate:
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, E - 1)
        ramp = np.clip((np.arange(E // 2) - lo) / ((hi - lo) or 0.001), 0.0, 1.0)  # 0: keep f, 1: f / factor
        attention = cfg.rope_attention_factor
        if attention is None:
            attention = yarn_mscale(factor)
        return inv_freq * (1 - ramp) + inv_freq / factor * ramp, attention
    return inv_freq, 1.0


def rope_tables(cfg):
    """cos and sin of the rotary angles pos * f_i (Su et al. 2021, RoFormer; f from ``rope_frequencies``), each
    (max_seq_len, R/2) for the rotated width R (``ModelConfig.rope_dim``), times the scaling's attention factor.

    Computed once in float64 on the host; angles grow to max_seq_len, where float32 arithmetic would drift.
    """
    inv_freq, scale = rope_frequencies(cfg)
    angles = np.outer(np.arange(cfg.max_seq_len, dtype=np.float64), inv_freq)  # (S, E/2)
    return np.cos(angles) * scale, np.sin(angles) * scale


def rope_at(cos, sin, positions, precision: str):
    """The RoPE tables (max_S, R/2) at ``positions`` (S,), in the compute precision: (S, R/2) each."""
    return to_compute(ops.gather(cos, positions, 0), precision), to_compute(ops.gather(sin, positions, 0), precision)


def apply_rope(x, cos, sin):
    """Rotate pairs (x_i, x_{i+E/2}) of each head by the position's angles: x (B, N, S, E), cos/sin (S, E/2).

    The half-split pairing (GPT-NeoX, HF Llama) rather than RoFormer's interleaved (x_2i, x_2i+1): the two are
    the same model up to a fixed permutation of each head's q/k rows, and halves slice without strided access.
    """
    x1, x2 = ops.split(x, x.shape[-1] // 2, axis=-1)  # (B, N, S, E/2) each
    # Halves as kernels, not views (see _heads_first); tables broadcast once per shape (the graph computes a
    # repeated op once: q, k and every layer share them); - sin as a table, so that backward has no Neg of a big
    # gradient (a kernel of its own per use: benchmarks/RESULTS.md, "Views, on an AVX2 machine"); a - b and
    # a + (-b) are the same float.
    neg_sin = ops.broadcast_to(ops.neg(sin), x1.shape)
    cos, sin = ops.broadcast_to(cos, x1.shape), ops.broadcast_to(sin, x1.shape)
    return ops.concat((x1 * cos + x2 * neg_sin, x1 * sin + x2 * cos), axis=-1)


class Attention(nn.Cell):
    """Causal grouped-query self-attention (Ainslie et al. 2023, GQA) with RoPE on q and k.

    n_kv_heads key/value heads are shared by groups of n_heads / n_kv_heads query heads; query head h reads
    KV head h // group. Head counts and the sequence length are read from the projections' outputs at run time,
    so a tensor-parallel wrapper may shard wq/wk/wv/wo by heads, and sequence parallelism may hand in a slice of
    the sequence that ``enter`` gathers once for the three projections, without touching this code.
    """

    def __init__(self, cfg, *, out_std: float, dtype=ms.float32):
        super().__init__()
        d_model, n_heads, n_kv_heads, std = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.init_std
        self.head_dim = E = cfg.head_size  # d_model / n_heads unless the model says (q: d_model -> H * E)
        self.wq = Linear(d_model, n_heads * E, init_std=std, dtype=dtype, bias=cfg.attn_bias)
        self.wk = Linear(d_model, n_kv_heads * E, init_std=std, dtype=dtype, bias=cfg.attn_bias)
        self.wv = Linear(d_model, n_kv_heads * E, init_std=std, dtype=dtype, bias=cfg.attn_bias)
        self.wo = Linear(n_heads * E, d_model, init_std=out_std, dtype=dtype)
        self.qk_norm = cfg.qk_norm  # a plain bool: graph mode reads it as a constant
        self.q_norm = RMSNorm(E, cfg.norm_eps, dtype) if cfg.qk_norm else None  # (..., E): each head's vector
        self.k_norm = RMSNorm(E, cfg.norm_eps, dtype) if cfg.qk_norm else None
        self.sdpa = SDPA(cfg.softmax_scale)
        self.enter = Identity()

    def construct(self, x, cos, sin, positions):
        E = self.head_dim
        x = self.enter(x)  # (B, S, D): the sequence whole again under sequence parallelism
        q, k, v = self.wq(x), self.wk(x), self.wv(x)  # (B, S, H*E), (B, S, K*E) x 2
        B, S = q.shape[0], q.shape[1]
        q, k = q.reshape(B, S, -1, E), k.reshape(B, S, -1, E)  # (B, S, H, E), (B, S, K, E)
        if self.qk_norm:  # Qwen3: each head's q and k normalised before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q = _heads_first(q)  # (B, H, S, E)
        k = _heads_first(k)  # (B, K, S, E)
        v = _heads_first(v.reshape(B, S, -1, E))  # (B, K, S, E)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        out = self.sdpa(q, k, v, positions)  # (B, H, S, E)
        out = _heads_first(out).reshape(B, S, -1)  # (B, S, H*E)
        return self.wo(out)  # (B, S, D)


class SwiGLU(nn.Cell):
    """(gate, up) -> silu(gate) * up: the element-wise part of the MLP (a seam that selective recompute wraps)."""

    def construct(self, gate, up):
        # silu(gate) * up, spelled out: mint's silu fails to compile when differentiated inside a bprop under jit
        return ops.sigmoid(gate) * gate * up


class MLP(nn.Cell):
    """SwiGLU feed-forward (Shazeer 2020, "GLU Variants Improve Transformer"): down(silu(gate(x)) * up(x))."""

    def __init__(self, d_model: int, ffn_hidden: int, *, init_std: float, out_std: float, dtype=ms.float32):
        super().__init__()
        self.w_gate = Linear(d_model, ffn_hidden, init_std=init_std, dtype=dtype)
        self.w_up = Linear(d_model, ffn_hidden, init_std=init_std, dtype=dtype)
        self.w_down = Linear(ffn_hidden, d_model, init_std=out_std, dtype=dtype)
        self.act = SwiGLU()
        self.enter = Identity()

    def construct(self, x):
        x = self.enter(x)  # (B, S, D): as Attention's
        return self.w_down(self.act(self.w_gate(x), self.w_up(x)))  # (B, S, F) -> (B, S, D)
