"""Learning from exit codes: a feasibility memory consulted before a proposal runs, and a memory model.

A trial ends with a typed status (DESIGN §3.3: ok, error, invalid, oom, compile_error, nan, timeout). Some
failures say more than "this exact config failed":

- **OOM** is monotone in memory: a config that needs at least as much memory as one that went out of memory,
  on the same layout, will too. The space says which way each param pushes memory (``memory: up|down|none``).
- **NaN** is (roughly) monotone in step size: a learning rate at or above one that diverged, with the same
  optimizer and batch, diverges too (``nan: up|down|none``). A run that ended ok but whose loss rose well above
  where it started (``diverged``) is the same blow-up caught before the numbers overflowed, and counts as NaN
  evidence: a larger learning rate would only diverge faster, so it cannot be the best run either.

So ``FeasibilityMemory.check`` skips exact repeats and *dominated* proposals without spending a trial, with a
reason a person can act on. An unannotated param must be equal for a dominance comparison: we only skip what
the annotations prove, never on a guess.

``MemoryModel`` recalibrates the analytic memory estimate (``metrics.estimated_memory_bytes``) against measured
peaks (``metrics.peak_memory_bytes``) with a least-squares line, so that the next estimate is closer to what
this machine really uses (HyperParallel-style planners estimate; we estimate, run, and correct).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real
from typing import Any, Optional

from autoresearch.outcomes import TRIAL_STATUSES, config_key, diverged, positive_number, value_key
from autoresearch.param import Param, scalar_text
from autoresearch.space import SearchSpace

__all__ = ["FeasibilityMemory", "MemoryModel", "Outcome"]

# Skipped without running: nothing was learned from it, so record() accepts and ignores it (handy on resume).
IGNORED_STATUSES = ("pruned",)
# Peaks from these statuses are real measurements; an OOM's peak is only where the run was cut off.
_MEASURED_STATUSES = ("ok", "nan", "timeout")

# kind -> (Param annotation, label in reasons, what dominance implies)
_DOMINANCE = {
    "oom": ("memory", "OOM", "this proposal needs at least as much memory"),
    "nan": ("nan", "NaN", "this proposal is at least as likely to diverge"),
}


@dataclass
class Outcome:
    """One recorded trial: its params, status, summary metrics and (when known) its trial number."""

    params: dict
    status: str
    metrics: Optional[dict] = None
    trial: Optional[int] = None

    @property
    def label(self) -> str:
        return f"trial {self.trial}" if self.trial is not None else "an earlier trial"

    @property
    def proves(self) -> Optional[str]:
        """The failure kind this outcome is evidence of, for dominance: its status, or "nan" for a finite run
        whose loss diverged."""
        if self.status in _DOMINANCE:
            return self.status
        return "nan" if self.status in ("ok", "timeout") and diverged(self.metrics) else None


class FeasibilityMemory:
    """What past trials proved about the space. ``record`` every finished trial; ``check`` each proposal."""

    def __init__(self, space: SearchSpace):
        self.space = space
        self.outcomes: list[Outcome] = []
        self.memory_model = MemoryModel()
        self._by_key: dict[tuple, list[Outcome]] = {}

    def record(self, params: dict, status: str, metrics: dict | None = None, trial: int | None = None) -> None:
        """Remember a finished trial. ``metrics`` is the summary's ``metrics`` dict (or None): a measured
        peak beside an estimate recalibrates ``memory_model``, unless the trial loaded its graphs from the compile
        cache (``compile_cache: loaded``): on CPU its peak lacks the compiler's memory, which the estimate, fit on
        trials that compile, includes."""
        if status in IGNORED_STATUSES:
            return
        if status not in TRIAL_STATUSES:
            raise ValueError(f"unknown trial status {status!r}; one of {', '.join(TRIAL_STATUSES)}")
        outcome = Outcome(dict(params), status, dict(metrics) if metrics else None, trial)
        self.outcomes.append(outcome)
        self._by_key.setdefault(config_key(params), []).append(outcome)
        if status in _MEASURED_STATUSES and metrics and metrics.get("compile_cache") != "loaded":
            est, peak = metrics.get("estimated_memory_bytes"), metrics.get("peak_memory_bytes")
            if positive_number(est) and positive_number(peak):
                self.memory_model.add(est, peak)

    def check(self, params: dict, estimated_bytes: float | None = None,
              limit_bytes: float | None = None) -> Optional[str]:
        """A one-line reason to skip ``params`` without running it, or None to run it (see ``verdict``)."""
        found = self.verdict(params, estimated_bytes, limit_bytes)
        return found[1] if found else None

    def verdict(self, params: dict, estimated_bytes: float | None = None,
                limit_bytes: float | None = None) -> Optional[tuple[Optional[str], str]]:
        """(failure kind it predicts or None, one-line reason) to skip ``params``, or None to run it. Checked in
        order: an exact repeat, OOM dominance, NaN dominance, and (when both are given) the memory model's
        prediction for ``estimated_bytes`` against ``limit_bytes``."""
        earlier = self._by_key.get(config_key(params), [])
        failed = [o for o in earlier if o.status != "ok"]
        if failed:
            o = failed[0]
            return o.status, f"same params as {o.label}, which ended {o.status}; not repeating a failure"
        if earlier:
            return None, f"duplicate of {earlier[0].label} (ok); its result stands"
        for kind in _DOMINANCE:
            for o in self.outcomes:
                if o.proves == kind and self.dominates(o.params, params, kind):
                    return kind, self._dominance_reason(o, kind)
        if estimated_bytes is not None and limit_bytes is not None:
            predicted = self.memory_model.predict(estimated_bytes)
            if predicted > limit_bytes:
                return "oom", (f"predicted peak memory {_gib(predicted)} exceeds the limit {_gib(limit_bytes)} "
                               f"({self.memory_model.describe()}); lower the micro-batch or enable recompute")
        return None

    def dominates(self, failed: dict, proposal: dict, kind: str) -> bool:
        """Whether a ``kind`` ("oom" | "nan") failure at ``failed`` proves that ``proposal`` fails the same way:
        for every param, ``up`` -> proposal >= failed (a choice compares positions in its values), ``down``
        -> proposal <= failed, ``none`` -> ignored, unannotated -> equal."""
        attr = _DOMINANCE[kind][0]
        for name, param in self.space.params.items():
            if name not in failed or name not in proposal:
                return False
            direction = getattr(param, attr)
            if direction == "none":
                continue
            a, b = proposal[name], failed[name]
            if direction is None:
                if value_key(a) != value_key(b):
                    return False
                continue
            pa, pb = _position(param, a), _position(param, b)
            if pa is None or pb is None:
                return False
            if (direction == "up" and pa < pb) or (direction == "down" and pa > pb):
                return False
        return True

    def _dominance_reason(self, o: Outcome, kind: str) -> str:
        attr, label, implication = _DOMINANCE[kind]
        params = self.space.params
        drivers = [n for n, p in params.items() if getattr(p, attr) in ("up", "down")]
        same = [n for n, p in params.items() if getattr(p, attr) is None]
        at = ", ".join(f"{n}={scalar_text(o.params[n])}" for n in drivers)
        if o.status != kind:  # evidence without the failure itself: a diverged loss
            m = o.metrics or {}
            label = f"divergence (loss {m['first_loss']:.4g} -> {m['final_loss']:.4g})"
        text = f"dominated by {label} in {o.label}" + (f" at {at}" if at else "")
        if same:
            shown = ", ".join(same[:4]) + (", ..." if len(same) > 4 else "")
            text += f" (same {shown})"
        text += f": {implication}"
        def valid(name, value):  # a way out must be a point the space allows (SWAP only in PyNative, ...)
            return not self.space.check({**o.params, name: value})

        escapes = [e for n in drivers if (e := _escape(params[n], o.params[n], getattr(params[n], attr), valid))]
        if escapes:
            text += f"; to run, change one of: {', '.join(escapes)}"
        elif same:
            text += f"; change one of {', '.join(same)} to run"
        return text

    def counts(self) -> dict[str, int]:
        """How many recorded trials ended with each status."""
        out: dict[str, int] = {}
        for o in self.outcomes:
            out[o.status] = out.get(o.status, 0) + 1
        return out

    def describe(self) -> str:
        """A few lines for people and for the LLM's prompt: outcomes by status and the memory model."""
        counts = ", ".join(f"{s} {n}" for s, n in self.counts().items()) or "no trials yet"
        return f"outcomes: {counts}\nmemory model: {self.memory_model.describe()}"


def _position(param: Param, value: Any) -> Optional[float]:
    """Where ``value`` sits along the param's axis (a choice's index), or None when it is not comparable."""
    if param.type == "choice":
        i = param.index(value)
        return float(i) if i >= 0 else None
    if not isinstance(value, Real) or isinstance(value, bool):
        return None
    return value_key(value)[1]


def _escape(param: Param, failed_value: Any, direction: str, valid=lambda name, value: True) -> str:
    """How to move ``param`` out of the dominated region, e.g. "training.micro_batch_size < 8" or
    "memory.recompute in [full]" (a choice's values only where ``valid``); "" when there is no room."""
    if param.type == "choice":
        i = param.index(failed_value)
        room = [v for v in (param.values[:i] if direction == "up" else param.values[i + 1:]) if valid(param.name, v)]
        return f"{param.name} in [{', '.join(scalar_text(v) for v in room)}]" if room else ""
    edge = param.low if direction == "up" else param.high
    if failed_value == edge:
        return ""
    return f"{param.name} {'<' if direction == 'up' else '>'} {scalar_text(failed_value)}"


def _gib(n: float) -> str:
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
        a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
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
        return f"peak ≈ {a:.3g} × estimate {sign} {_gib(abs(b))} from {len(self.points)} measured trial(s)"
