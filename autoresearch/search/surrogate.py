"""A Gaussian-process surrogate for the few dozen trials a study runs, and the acquisition that ranks candidates.

Configs are encoded on the unit cube (``encode``): a number by its position between its bounds (log-scaled where the
space says ``log``), a numeric choice by its position in ``values`` (the spaces list them in order), a choice of
names one-hot. The GP has a Matérn-5/2 kernel with one length-scale per feature (ARD) and a learned noise, its
hyper-parameters set by maximising the marginal likelihood (Rasmussen & Williams 2006, §2.2, §4.2 and §5.4).
Objectives are ranked and mapped to normal quantiles first (a Gaussian copula, as in HEBO, Cowen-Rivers et al.
2022): a diverged run's loss of 9 then weighs as one bad rank, not as a cliff that flattens every other difference.

Candidates are ranked by expected improvement (Jones, Schonlau & Welch 1998) times the probability that they do not
fail (a kernel-weighted Beta estimate from the runs that failed): failures never enter the surrogate as values.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats

from autoresearch.space import SearchSpace

# Bounds of the hyper-parameters (log scale): length-scales on the unit cube, signal and noise variance of the
# copula-transformed objective (unit variance by construction).
_LOG_LENGTH = (math.log(0.05), math.log(10.0))
_LOG_SIGNAL = (math.log(0.05), math.log(20.0))
_LOG_NOISE = (math.log(1e-6), math.log(1.0))


def encode(space: SearchSpace, params: dict) -> np.ndarray:
    """Features in [0, 1] of one config (see the module docstring)."""
    return np.asarray([x for name, p in space.params.items() for x in p.encode(params[name])], dtype=float)


def copula(y: np.ndarray) -> np.ndarray:
    """Ranks mapped to standard-normal quantiles (ties share their mean rank)."""
    ranks = stats.rankdata(y)
    return stats.norm.ppf((ranks - 0.5) / len(y))


def _scaled_sq(a: np.ndarray, b: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """((a_i - b_j) / l)² per feature: (n, m, d)."""
    return ((a[:, None, :] - b[None, :, :]) / lengths) ** 2


def matern52(a: np.ndarray, b: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """k(a, b) with unit signal variance; a: (n, d), b: (m, d), lengths: (d,) -> (n, m)."""
    d = np.sqrt(5.0 * _scaled_sq(a, b, lengths).sum(-1))
    return (1.0 + d + d * d / 3.0) * np.exp(-d)


class GaussianProcess:
    """Zero-mean GP regression on standardised targets, hyper-parameters fitted at construction (L-BFGS-B on the
    negative log marginal likelihood and its analytic gradient, from two starts: short and long length-scales)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, *, min_signal: float | None = None):
        """``min_signal``: the least signal variance the fit may settle on (default: the bound ``_LOG_SIGNAL``);
        a prior's error scale that a few runs must not talk the model out of."""
        self.x, self.y = x, y
        dim = x.shape[1]
        self._sq = _scaled_sq(x, x, np.ones(dim))  # (n, n, d) squared differences, unscaled
        signal = (
            _LOG_SIGNAL if min_signal is None else (math.log(min_signal), max(_LOG_SIGNAL[1], math.log(min_signal)))
        )
        bounds = [_LOG_LENGTH] * dim + [signal, _LOG_NOISE]
        start_signal = max(0.0, signal[0])
        starts = [
            np.r_[np.full(dim, math.log(0.5)), start_signal, math.log(1e-2)],
            np.r_[np.full(dim, math.log(2.0)), start_signal, math.log(1e-1)],
        ]
        fits = [optimize.minimize(self._objective, s, jac=True, method="L-BFGS-B", bounds=bounds) for s in starts]
        theta = min(fits, key=lambda r: r.fun).x
        try:
            self._set(theta)
        except np.linalg.LinAlgError:  # the same config run twice, at the smallest noise: more noise, and it fits
            theta[-1] = max(theta[-1], math.log(1e-2))
            self._set(theta)

    def _set(self, theta: np.ndarray) -> None:
        dim = self.x.shape[1]
        self.lengths, self.signal, self.noise = np.exp(theta[:dim]), math.exp(theta[dim]), math.exp(theta[dim + 1])
        self._scaled = self._sq / self.lengths**2
        self._dist = np.sqrt(5.0 * self._scaled.sum(-1))
        self._k = self.signal * (1.0 + self._dist + self._dist**2 / 3.0) * np.exp(-self._dist)
        self._chol = np.linalg.cholesky(self._k + (self.noise + 1e-8) * np.eye(len(self.x)))
        self._alpha = np.linalg.solve(self._chol.T, np.linalg.solve(self._chol, self.y))

    def _objective(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Negative log marginal likelihood (without its constant) and its gradient in theta (R&W eq. 5.9)."""
        try:
            self._set(theta)
        except np.linalg.LinAlgError:
            return 1e10, np.zeros_like(theta)
        nll = 0.5 * self.y @ self._alpha + np.log(np.diag(self._chol)).sum()
        inv = np.linalg.solve(self._chol.T, np.linalg.solve(self._chol, np.eye(len(self.x))))
        w = inv - np.outer(self._alpha, self._alpha)  # dNLL/dθ = ½ tr(w dK/dθ)
        # dK/dlog l_k = σ² (5/3)(1 + d) e^{-d} ((x_ik - x_jk) / l_k)²
        common = self.signal * (5.0 / 3.0) * (1.0 + self._dist) * np.exp(-self._dist)
        grad_l = 0.5 * np.einsum("ij,ijk->k", w * common, self._scaled)
        grad_s = 0.5 * (w * self._k).sum()
        grad_n = 0.5 * self.noise * np.trace(w)
        return float(nll), np.r_[grad_l, grad_s, grad_n]

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation at x: (m, d) -> (m,), (m,)."""
        ks = self.signal * matern52(x, self.x, self.lengths)
        mean = ks @ self._alpha
        v = np.linalg.solve(self._chol, ks.T)
        var = np.maximum(self.signal - (v * v).sum(0), 1e-12)
        return mean, np.sqrt(var)


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float) -> np.ndarray:
    """E[max(best - f, 0)] for f ~ N(mean, std²): improvement of a minimisation."""
    z = (best - mean) / std
    return std * (z * stats.norm.cdf(z) + stats.norm.pdf(z))


def failure_probability(x: np.ndarray, ran: np.ndarray, failed: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """P(fail) at x: a Beta(1, 1) prior updated by the runs so far, each weighted by its kernel similarity to x.
    ran: (n, d) features of the runs, failed: (n,) 0/1."""
    if len(ran) == 0:
        return np.full(len(x), 0.5)
    w = matern52(x, ran, lengths)
    return (1.0 + w @ failed) / (2.0 + w.sum(1))
