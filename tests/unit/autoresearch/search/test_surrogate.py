"""The GP surrogate and acquisition behind ``--proposer gp``, against references computed another way."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize

from autoresearch.search import surrogate
from autoresearch.space import ChoiceParam, FloatParam, SearchSpace


def _data(n: int = 14, dim: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, dim))
    y = np.sin(3 * x[:, 0]) + x[:, 1] ** 2 + 0.05 * rng.standard_normal(n)
    return x, (y - y.mean()) / y.std()


@pytest.mark.parametrize("theta", [[0.3, 0.7, 1.5, 1.2, 0.01], [0.1, 2.0, 0.5, 0.4, 0.2], [1.0, 1.0, 1.0, 3.0, 1e-4]])
def test_likelihood_gradient_matches_finite_differences(theta):
    x, y = _data()
    gp = surrogate.GaussianProcess(x, y)
    t = np.log(theta)
    numeric = optimize.approx_fprime(t, lambda v: gp._objective(v)[0], 1e-6)
    analytic = gp._objective(t)[1]
    np.testing.assert_allclose(analytic, numeric, rtol=1e-4, atol=1e-4)


def test_likelihood_matches_the_dense_formula():
    """-log N(y; 0, K + σn² I) up to its constant n/2 log 2π, with K built entry by entry."""
    x, y = _data(n=8)
    gp = surrogate.GaussianProcess(x, y)
    lengths, signal, noise = np.array([0.4, 0.9, 2.0]), 1.3, 0.05
    k = np.empty((8, 8))
    for i in range(8):
        for j in range(8):
            r = math.sqrt((((x[i] - x[j]) / lengths) ** 2).sum())
            d = math.sqrt(5) * r
            k[i, j] = signal * (1 + d + d * d / 3) * math.exp(-d)
    k += (noise + 1e-8) * np.eye(8)
    want = 0.5 * y @ np.linalg.solve(k, y) + 0.5 * np.linalg.slogdet(k)[1]
    got = gp._objective(np.r_[np.log(lengths), math.log(signal), math.log(noise)])[0]
    assert got == pytest.approx(want, rel=1e-9)


def test_posterior_fits_the_data_and_reverts_to_the_prior_far_away():
    x, y = _data(n=20)
    gp = surrogate.GaussianProcess(x, y)
    mean, std = gp.predict(x)
    assert np.abs(mean - y).max() < 0.3 and std.max() < 0.5
    far_mean, far_std = gp.predict(np.full((1, 3), 50.0))
    assert abs(far_mean[0]) < 1e-6 and far_std[0] == pytest.approx(math.sqrt(gp.signal), rel=1e-6)


@pytest.mark.parametrize("mean,std,best", [(0.0, 1.0, 0.0), (1.0, 0.5, 0.2), (-1.0, 2.0, 0.5)])
def test_expected_improvement_matches_monte_carlo(mean, std, best):
    draws = np.random.default_rng(1).normal(mean, std, 2_000_000)
    want = np.maximum(best - draws, 0.0).mean()
    got = surrogate.expected_improvement(np.array([mean]), np.array([std]), best)[0]
    assert got == pytest.approx(want, rel=5e-3)


def test_encode_positions_log_ranges_and_one_hot_names():
    space = SearchSpace(
        name="s",
        objective={"metric": "val_loss", "direction": "minimize"},
        params={
            "optim.lr": FloatParam(low=1e-4, high=1e-2, log=True),
            "training.micro_batch_size": ChoiceParam(values=[1, 2, 4, 8]),
            "optim": ChoiceParam(values=["adamw", "muon", "sgd"]),
            "parallel.sp": ChoiceParam(values=[False, True]),
        },
    )
    f = surrogate.encode(
        space, {"optim.lr": 1e-3, "training.micro_batch_size": 4, "optim": "muon", "parallel.sp": True}
    )
    np.testing.assert_allclose(f, [0.5, 2 / 3, 0.0, 1.0, 0.0, 1.0])


def test_copula_keeps_the_order_and_bounds_an_outlier():
    y = np.array([2.1, 2.0, 9.0e3, 2.5, 2.0])
    z = surrogate.copula(y)
    assert z[1] == z[4] < z[0] < z[3] < z[2]  # ties share a rank
    assert z[2] < 2.0  # a diverged loss is one bad rank, not a cliff
    np.testing.assert_allclose(z.mean(), 0.0, atol=0.1)


def test_failure_probability_rises_near_failures_and_is_even_without_evidence():
    ran = np.array([[0.0, 0.0], [0.1, 0.0], [1.0, 1.0]])
    failed = np.array([1.0, 1.0, 0.0])
    p = surrogate.failure_probability(
        np.array([[0.05, 0.0], [1.0, 0.95], [40.0, 40.0]]), ran, failed, np.array([0.2, 0.2])
    )
    assert p[0] > 0.6 > 0.4 > p[1]
    assert p[2] == pytest.approx(0.5, abs=1e-6)
    assert surrogate.failure_probability(np.zeros((2, 2)), np.zeros((0, 2)), np.zeros(0), np.ones(2)).tolist() == [
        0.5,
        0.5,
    ]


def test_the_same_config_run_twice_fits_and_predicts_between_its_two_values():
    x = np.array([[0.1, 0.2], [0.1, 0.2], [0.5, 0.5], [0.9, 0.1]])
    y = np.array([0.0, 0.1, -1.0, 1.0])
    mean, std = surrogate.GaussianProcess(x, y).predict(x[:1])
    assert 0.0 <= mean[0] <= 0.1 and np.isfinite(std[0])
