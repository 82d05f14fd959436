"""core.runtime.kernels' fused CPU kernels against float64 NumPy, in PyNative and under jit. (The fused AdamW kernel is
checked through the optimizer: tests/unit/test_optim.py runs it against the papers' rules.)"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from core.runtime import kernels

# Sizes around the kernel's vector width (8) and chunk (2**15 elements), so that partial lanes, several chunks
# per tensor (shared by the threads) and a 0-d-like single element are all summed.
SHAPES = [(1,), (7,), (9, 3), (256, 128), (40000,), (3, 70001)]


def tensors(seed: int = 0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) * (i + 1) for i, s in enumerate(SHAPES)]


def reference(xs, weights) -> float:
    return float(sum(w * (x.astype(np.float64) ** 2).sum() for x, w in zip(xs, weights, strict=True)))


@ms.jit
def _compiled(xs, weights):
    return kernels.sum_of_squares(xs, weights)


@pytest.mark.parametrize("jit", [False, True])
def test_sum_of_squares_matches_float64(jit):
    xs = tensors()
    weights = np.array([1.0, 0.5, 2.0, 1.0, 0.25, 1.0], np.float32)
    args = (ms.mutable(tuple(Tensor(x) for x in xs)), Tensor(weights))
    out = (_compiled if jit else kernels.sum_of_squares)(*args).asnumpy()
    assert out.shape == (1,) and out.dtype == np.float32
    # Accumulated in float64 and rounded once: within float32's rounding of the exact value.
    np.testing.assert_allclose(out[0], reference(xs, weights), rtol=2e-7)


def test_sum_of_squares_is_the_same_whatever_the_threads():
    xs = ms.mutable(tuple(Tensor(x) for x in tensors(1)))
    weights = Tensor(np.ones(len(SHAPES), np.float32))
    results = []
    try:
        for n in (1, 2, 3):
            kernels.set_threads(n)
            results.append(kernels.sum_of_squares(xs, weights).asnumpy())
    finally:
        kernels.set_threads(1)
    assert results[0] == results[1] == results[2]  # fixed chunks added in a fixed order: bit-identical


def test_cpu_kernels_only_on_cpu():
    assert kernels.library_path() is not None  # built by pip install (pyproject.toml)
    assert kernels.use_cpu_kernels("CPU", None) and kernels.use_cpu_kernels("CPU", True)
    assert not kernels.use_cpu_kernels("CPU", False)
    assert not kernels.use_cpu_kernels("Ascend", None)


def test_without_the_built_extension_the_default_falls_back_and_true_is_an_error(monkeypatch, caplog):
    monkeypatch.setattr(kernels, "library_path", lambda: None)  # installed where no C++ compiler was found
    with caplog.at_level("WARNING", logger="core.runtime.kernels"):
        assert not kernels.use_cpu_kernels("CPU", None)
    assert "not built" in caplog.text and "MindSpore's own kernels" in caplog.text
    with pytest.raises(RuntimeError, match="execution.cpu_kernels=true"):
        kernels.use_cpu_kernels("CPU", True)
