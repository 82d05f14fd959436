"""The memory model: measured peaks against the core's analytic estimate, so that the next estimate is closer to
what this machine really uses (HyperParallel-style planners estimate; the agent estimates, runs, and corrects).
"""

from __future__ import annotations

from autoresearch.records import positive_number


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


class MemoryModel:
    """measured_peak ≈ a * estimated + b, fitted from (estimated, measured) pairs.

    No points: the estimate as is (a=1, b=0). One point: the ratio measured/estimated (b=0). Two or more: least
    squares — unless the estimates are all equal or the fitted slope is not positive (the estimates do not
    separate the trials), then the ratio of the sums, which never predicts less memory for a bigger estimate.
    """

    def __init__(self, points: list[tuple[float, float]] | None = None):
        self.points: list[tuple[float, float]] = []
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

    def describe(self) -> str:
        a, b = self.coefficients()
        if not self.points:
            return "uncalibrated (using the analytic estimate as is)"
        sign = "+" if b >= 0 else "-"
        return f"peak ≈ {a:.3g} × estimate {sign} {gib(abs(b))} from {len(self.points)} measured trial(s)"
