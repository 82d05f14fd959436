"""The memory model: measured peaks against the core's analytic estimate, so that the next estimate is closer to
what this machine really uses (HyperParallel-style planners estimate; the agent estimates, runs, and corrects).
"""

from __future__ import annotations

import math

from scipy.stats import norm

from autoresearch.records import positive_number

# How far a peak may sit from its prediction before the study has measured anything: the sigma of
# log(measured / estimated) for core.memory on this CPU, from its held-out errors (benchmarks/RESULTS.md, "Memory
# estimate": p95 18.6% under jit and 22.9% in PyNative, i.e. 1.64 sigma of about 0.12); on a device without a
# fitted profile the textbook estimate is further off, and the measured errors below take over after a few runs.
PRIOR_LOG_ERROR = 0.12
# The prior counts as this many measured errors: after a handful of runs the study's own errors dominate it.
PRIOR_WEIGHT = 2


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


class MemoryModel:
    """measured_peak ≈ a * estimated + b, fitted from (estimated, measured) pairs, and how far off it may be.

    No points: the estimate as is (a=1, b=0). One point: the ratio measured/estimated (b=0). Two or more: least
    squares — unless the estimates are all equal or the fitted slope is not positive (the estimates do not
    separate the trials), then the ratio of the sums, which never predicts less memory for a bigger estimate.

    The error (``log_error``) is what makes the gate conservative until it has measured: each point predicted by
    the model of the other points (leave-one-out: the error on a config not yet run, which in-sample residuals of
    a two-parameter fit on a few points would hide), pooled with a prior spread that counts as ``PRIOR_WEIGHT``
    points. ``oom_probability`` reads a prediction with it as log-normal.
    """

    def __init__(self, points: list[tuple[float, float]] | None = None):
        self.points: list[tuple[float, float]] = []
        self._error: tuple[int, float] | None = None  # (points, log_error) when last computed
        for est, peak in points or ():
            self.add(est, peak)

    def __len__(self) -> int:
        return len(self.points)

    def add(self, estimated: float, measured: float) -> None:
        if not (positive_number(estimated) and positive_number(measured)):
            raise ValueError(f"memory points must be positive finite byte counts (got {estimated!r}, {measured!r})")
        self.points.append((float(estimated), float(measured)))

    def coefficients(self) -> tuple[float, float]:
        """(a, b) of ``predict(e) = a * e + b``."""
        n = len(self.points)
        if n == 0:
            return 1.0, 0.0
        xs = [p[0] for p in self.points]
        ys = [p[1] for p in self.points]
        ratio = (sum(ys) / sum(xs), 0.0)
        if n == 1:
            return ratio
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        if sxx <= 1e-12 * mx * mx:
            return ratio
        a = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
        if a <= 0:
            return ratio
        return a, my - a * mx

    def predict(self, estimated: float) -> float:
        """Predicted measured peak (bytes) for an analytic estimate; never below 0."""
        a, b = self.coefficients()
        return max(0.0, a * float(estimated) + b)

    def log_error(self) -> float:
        """Sigma of log(measured / predicted) for a config not yet run (see the class docstring). Cached until the
        next point: a proposer asks it of every candidate it weighs."""
        if self._error is not None and self._error[0] == len(self.points):
            return self._error[1]
        squares = 0.0
        for i, (est, peak) in enumerate(self.points):
            others = MemoryModel(self.points[:i] + self.points[i + 1 :])
            squares += math.log(peak / max(others.predict(est), 1.0)) ** 2
        error = math.sqrt((PRIOR_WEIGHT * PRIOR_LOG_ERROR**2 + squares) / (PRIOR_WEIGHT + len(self.points)))
        self._error = (len(self.points), error)
        return error

    def oom_probability(self, estimated: float, limit: float) -> float:
        """P(measured peak > ``limit``) for a config whose analytic estimate is ``estimated`` (bytes)."""
        predicted = self.predict(estimated)
        if predicted <= 0:
            return 0.0
        return float(norm.sf(math.log(limit / predicted) / self.log_error()))

    def describe(self) -> str:
        a, b = self.coefficients()
        if not self.points:
            return "uncalibrated (using the analytic estimate as is)"
        sign = "+" if b >= 0 else "-"
        return (
            f"peak ≈ {a:.3g} × estimate {sign} {gib(abs(b))} from {len(self.points)} measured trial(s), "
            f"±{100 * (math.exp(self.log_error()) - 1):.0f}% on a new config"
        )
