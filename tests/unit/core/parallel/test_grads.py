"""core.parallel.grads on one process: the global gradient norm and the clipping factor against NumPy float64."""

import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor

from core.parallel.comm import mesh_groups
from core.parallel.dims import ParallelDims
from core.parallel.grads import GradientSync, sum_of_squares
from core.parallel.placement import replicated

SHAPES = [(24, 8), (8, 8), (20, 8), (8,), (3, 5, 7)]


def _grads(seed: int, scale: float) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * scale).astype(np.float32) for s in SHAPES]


@pytest.mark.parametrize("shape", [(1,), (7,), (16, 3), (4, 5, 6)])
def test_sum_of_squares_is_float64s(shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert float(sum_of_squares(Tensor(x)).asnumpy()) == pytest.approx((x.astype(np.float64) ** 2).sum(), rel=1e-6)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("micro_batches, clip", [(1, 0.5), (1, 2.0), (3, 0.5), (1, 0.0)])
def test_norm_and_factor_are_the_global_mean_losss(fused, micro_batches, clip):
    """The norm is of the mean over micro-batches (the summed gradients / micro_batches); the factor turns the
    summed gradients into that mean, clipped to ``clip`` times the norm when it is above (0: never clipped)."""
    grads = _grads(7, scale=1.0)
    params = [Parameter(Tensor(np.zeros(s, np.float32)), name=f"p{i}") for i, s in enumerate(SHAPES)]
    dims = ParallelDims()
    sync = GradientSync(
        params,
        placements={p.name: replicated(p.shape) for p in params},
        dims=dims,
        groups=mesh_groups(dims),
        micro_batches=micro_batches,
        max_norm=clip * _norm(grads) / micro_batches,
        fused=fused,
    )
    out, norm, scale = sync(tuple(Tensor(g) for g in grads))
    mean_norm = _norm(grads) / micro_batches
    assert float(norm.asnumpy()) == pytest.approx(mean_norm, rel=1e-6)
    coef = min(clip * mean_norm / (mean_norm + 1e-6), 1.0) if clip > 0 else 1.0
    assert float(scale.asnumpy()) == pytest.approx(coef / micro_batches, rel=1e-6)
    for o, g in zip(
        out, grads, strict=True
    ):  # the gradients come back as they went in: the optimizer applies the factor
        np.testing.assert_array_equal(o.asnumpy(), g)
    assert ms.get_context("device_target") == "CPU"


def _norm(grads) -> float:
    return math.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads))
