"""Mixed precision (core.model.precision): the CPU's emulated bf16 rounds as bf16 does (NumPy's ml_dtypes as the
reference), and a whole model in each precision gives fp32 gradients to its fp32 parameters that differ from the
fp32 run's by about the precision's rounding: fp16 runs the real-cast path (the one Ascend runs in bf16) on CPU's
fp16 kernels, so a wrongly mixed op would fail or promote here."""

import mindspore as ms
import ml_dtypes
import numpy as np
import pytest
from mindspore import Tensor, ops

from core.config import load_config
from core.model.gpt import GPT
from core.model.layers import MatMul
from core.model.loss import LinearCrossEntropyLoss
from core.model.moe import MoE
from core.model.precision import EMULATED, FP16, FP32, set_precision, to_compute


def _bf16(a) -> np.ndarray:
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def test_emulated_bf16_rounds_like_bf16_forward_and_backward():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 24)).astype(np.float32) * np.float32(3.7)
    assert np.array_equal(to_compute(Tensor(x), EMULATED).asnumpy(), _bf16(x))
    assert not np.array_equal(_bf16(x), x)  # the rounding is not the identity on these numbers
    # the backward rounds the incoming gradient to bf16, as an accelerator's bf16 activation gradient is
    c = np.float32(1 / 3)
    grad = ms.grad(lambda t: (to_compute(t, EMULATED) * Tensor(c)).sum())(Tensor(x)).asnumpy()
    assert np.all(grad == _bf16(c))


def test_emulated_bf16_rounds_ties_to_even_as_bf16_does():
    # every 8-bit leading pattern, with the 16 bits bf16 drops just below, at and just above the tie, at exponents
    # from the smallest normal to the largest the split allows, both signs
    high = np.arange(256, dtype=np.uint32) << 16
    low = np.array([0x0000, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    exponents = np.array([1, 40, 120, 127, 128, 140, 220], np.uint32) << 23
    bits = (exponents[:, None, None] | high[None, :, None] | low[None, None, :]).reshape(-1)
    x = np.concatenate([bits, bits | np.uint32(0x80000000)]).view(np.float32)
    assert np.array_equal(to_compute(Tensor(x), EMULATED).asnumpy(), _bf16(x))


def test_emulated_matmul_is_bf16_operands_fp32_arithmetic_bf16_output():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((8, 32)).astype(np.float32), rng.standard_normal((5, 32)).astype(np.float32)
    op = MatMul()
    set_precision([op], EMULATED)
    got = op(Tensor(x), Tensor(w)).asnumpy()
    want = _bf16(_bf16(x) @ _bf16(w).T)  # float64 products of the rounded operands, the result rounded
    # bf16 operands multiply exactly in fp32; the fp32 sum may round a result across a bf16 boundary: one bf16 ulp
    np.testing.assert_allclose(got, want, rtol=2**-7, atol=0)
    assert np.mean(got == want) > 0.9
    assert not np.allclose(got, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5)


def _loss_and_grads(cfg, precision: str, tokens, jit: bool):
    model, loss = GPT(cfg.model, seed=0), LinearCrossEntropyLoss()
    set_precision([model, loss], precision)

    def forward(x, y):
        return loss(model(x), model.head_weight(), y)

    step = ms.value_and_grad(forward, None, model.trainable_params())
    value, grads = (ms.jit(step) if jit else step)(tokens[:, :-1], tokens[:, 1:])
    return model(tokens[:, :-1]).dtype, float(value), grads


@pytest.mark.parametrize(
    ("model", "jit"),
    [("tiny", True), ("deepseek-tiny", False)],  # GQA under jit; MLA, the sigmoid router, experts op by op
)
@pytest.mark.parametrize(("precision", "dtype", "bound"), [(FP16, ms.float16, 1e-2), (EMULATED, ms.float32, 1e-1)])
def test_a_model_in_low_precision_trains_its_fp32_weights(model, jit, precision, dtype, bound):
    cfg = load_config([f"model={model}", "training.seq_len=32"])
    tokens = Tensor(np.random.default_rng(2).integers(0, cfg.model.vocab_size, (2, 33)).astype(np.int32))
    _, want_loss, want = _loss_and_grads(cfg, FP32, tokens, jit)
    hidden_dtype, got_loss, got = _loss_and_grads(cfg, precision, tokens, jit)
    assert hidden_dtype == dtype  # fp16: the activations really are fp16 (emulated bf16: fp32 storage)
    assert got_loss == pytest.approx(want_loss, rel=1e-3)
    assert all(g.dtype == ms.float32 for g in got)  # the master weights' gradients: fp32 reductions and optimizer
    got, want = [g.asnumpy().astype(np.float64) for g in got], [w.asnumpy().astype(np.float64) for w in want]
    # The whole gradient within the precision's rounding of fp32's (fp16 2^-11, bf16 2^-8 per value, grown over the
    # layers; in deepseek-tiny bf16's rounded router logits send a few tokens to other experts, whose gradients then
    # differ outright: 5% of the norm), and every parameter's changed: the rounding is in effect everywhere.
    diff = np.sqrt(sum(np.sum((g - w) ** 2) for g, w in zip(got, want, strict=True)))
    assert diff / np.sqrt(sum(np.sum(w**2) for w in want)) < bound
    assert all(np.linalg.norm(g - w) > 1e-6 * np.linalg.norm(w) for g, w in zip(got, want, strict=True))


def test_fp32_is_the_identity():
    x = Tensor(np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32))
    assert to_compute(x, FP32) is x
    with pytest.raises(ValueError, match="fp32, bf16"):
        set_precision([MatMul()], "fp8")
    assert ops.equal(MatMul()(x, x), x @ x.T).all()


def test_the_moe_router_stays_fp32_in_every_precision():
    model = GPT(load_config(["model=deepseek-tiny"]).model)
    set_precision([model], FP16)
    moes = [c for _, c in model.cells_and_names() if isinstance(c, MoE)]
    assert moes and all(m.router.op.compute_precision == FP32 for m in moes)
    assert all(m.experts.compute_precision == FP16 and m.router.weight.dtype == ms.float32 for m in moes)
    x = Tensor(np.random.default_rng(4).standard_normal((1, 4, model.cfg.d_model)).astype(np.float16))
    assert moes[0].router(x.astype(ms.float32)).dtype == ms.float32  # as MoE.construct calls it
