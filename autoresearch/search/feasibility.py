"""Learning from exit codes: a feasibility memory consulted before a proposal runs.

A trial ends with a typed status (``autoresearch.records.Status``: ok, error, invalid, oom, compile_error, nan,
timeout). Some failures say more than "this exact config failed":

- **OOM** is monotone in memory: a config that needs at least as much memory as one that went out of memory,
  on the same layout, will too. The space says which way each param pushes memory (``memory: up|down|none``).
- **NaN** is (roughly) monotone in step size: a learning rate at or above one that diverged, with the same
  optimizer and batch, diverges too (``nan: up|down|none``). A run that ended ok but whose loss rose well above
  where it started (``diverged``) is the same blow-up caught before the numbers overflowed, and counts as NaN
  evidence: a larger learning rate would only diverge faster, so it cannot be the best run either.

So ``FeasibilityMemory.check`` skips exact repeats and *dominated* proposals without spending a trial, with a
reason a person can act on. An unannotated param must be equal for a dominance comparison: we only skip what
the annotations prove, never on a guess.

Short of a proof, ``risk`` says how likely a proposal fails the same way, from the same annotations: how far it
sits from the nearest failure that would dominate it against how far from the nearest run that proves it safe.
After a NaN at one learning rate the next one down is a coin toss, two down less so; the proposer holds such bets
back while safer candidates remain.

Measured peaks beside their estimates recalibrate the memory model (``autoresearch.search.memory_model``), whose
prediction the memory gate compares with ``memory.limit_gb``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

from autoresearch.records import RAN, Status, config_key, diverged, positive_number, value_key
from autoresearch.search.memory_model import MemoryModel, gib
from autoresearch.space import SearchSpace
from core.config import scalar_text

# Skipped without running: nothing was learned from it, so record() accepts and ignores it (handy on resume).
IGNORED_STATUSES = (Status.PRUNED,)
# Peaks from these statuses are real measurements; an OOM's peak is only where the run was cut off.
_MEASURED_STATUSES = (Status.OK, Status.NAN, Status.TIMEOUT)

# Where no run has proved a region safe, ``risk`` reads the distance to the nearest failure against this one, in
# steps along the annotated axes (a choice's values; a number's range counts as RANGE_STEPS): a config one step
# below a NaN's learning rate is as likely to fail as not, two steps below one in three.
_UNPROVEN = 1.0
RANGE_STEPS = 4
# What a failure with other unannotated values (e.g. the other optimizer) is worth as a guess: on the suite's tables
# a learning rate that gave a NaN with one optimizer gave one with the other (benchmarks/data/tabular.json: lr 100
# with both), but the annotations promise nothing.
BORROWED = 0.5
# Before any run failed a way: past this many steps beyond the region runs proved safe, P(failure) is taken as
# FRONTIER_RISK (above the gp's hold-back limit for NaN, so such a config waits while a nearer one remains). A leap
# is measured by ratio where a choice's values are positive numbers (``_leap_axis``): one step of an evenly spaced
# grid is 1, of a 1-3-10 grid 0.95-1.05 (hence the quarter step of slack), and 0.1 -> 1 among 0.001, 0.003, 0.01,
# 0.1, 1 is 1.33, a longer leap than the grid's own steps.
FRONTIER_STEPS = 1.25
FRONTIER_RISK = 0.3

# The memory gate skips a config whose P(OOM) (the calibrated prediction read with its error on unseen configs) passes
# this: 0.5, a prediction over the budget. 0.7 was tried on the dev tables (seeds 0-9): the gp's runs the same, tpe's
# OOM exits 9.4% -> 12.3% on tabular (benchmarks/RESULTS.md, "Search efficiency across tables, re-collected").
GATE_OOM = 0.5

# kind -> (Param annotation, label in reasons, what dominance implies)
_DOMINANCE = {
    Status.OOM: ("memory", "OOM", "this proposal needs at least as much memory"),
    Status.NAN: ("nan", "NaN", "this proposal is at least as likely to diverge"),
}


@dataclass
class Outcome:
    """One recorded trial: its params, status, summary metrics and (when known) its trial number."""

    params: dict
    status: str
    metrics: dict | None = None
    trial: int | None = None

    @property
    def label(self) -> str:
        return f"trial {self.trial}" if self.trial is not None else "an earlier trial"

    @property
    def proves(self) -> str | None:
        """The failure kind this outcome is evidence of, for dominance: its status, or "nan" for a finite run
        whose loss diverged."""
        if self.status in _DOMINANCE:
            return Status(self.status)
        return Status.NAN if self.status in (Status.OK, Status.TIMEOUT) and diverged(self.metrics) else None


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
        if status not in RAN:
            raise ValueError(f"unknown trial status {status!r}; one of {', '.join(RAN)}")
        outcome = Outcome(dict(params), status, dict(metrics) if metrics else None, trial)
        self.outcomes.append(outcome)
        self._by_key.setdefault(config_key(params), []).append(outcome)
        if status in _MEASURED_STATUSES and metrics and metrics.get("compile_cache") != "loaded":
            est, peak = metrics.get("estimated_memory_bytes"), metrics.get("peak_memory_bytes")
            if positive_number(est) and positive_number(peak):
                self.memory_model.add(est, peak)

    def check(self, params: dict, estimated_bytes: float | None = None, limit_bytes: float | None = None) -> str | None:
        """A one-line reason to skip ``params`` without running it, or None to run it (see ``verdict``)."""
        found = self.verdict(params, estimated_bytes, limit_bytes)
        return found[1] if found else None

    def verdict(
        self, params: dict, estimated_bytes: float | None = None, limit_bytes: float | None = None
    ) -> tuple[str | None, str] | None:
        """(failure kind it predicts or None, one-line reason) to skip ``params``, or None to run it. Checked in
        order: an exact repeat, OOM dominance, NaN dominance, and (when both are given) the memory model's
        prediction for ``estimated_bytes`` against ``limit_bytes``."""
        earlier = self._by_key.get(config_key(params), [])
        failed = [o for o in earlier if o.status != Status.OK]
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
            p_oom = self.memory_model.oom_probability(estimated_bytes, limit_bytes)
            if p_oom > GATE_OOM:
                return Status.OOM, (
                    f"predicted peak memory {gib(self.memory_model.predict(estimated_bytes))} exceeds the limit "
                    f"{gib(limit_bytes)}, P(OOM) {p_oom:.2f} ({self.memory_model.describe()}); lower the micro-batch "
                    "or enable recompute"
                )
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
            pa, pb = param.position(a), param.position(b)
            if pa is None or pb is None:
                return False
            if (direction == "up" and pa < pb) or (direction == "down" and pa > pb):
                return False
        return True

    def risk(self, params: dict, kind: str) -> float | None:
        """P(``params`` fails with ``kind``) read from the annotations, or None when no run failed that way.

        Along the annotated axes (in steps), d_fail is how far ``params`` would move to be dominated by a failure and
        d_safe how far to be dominated by a run that did not fail that way, which the same monotony proves safe:
        d_safe / (d_safe + d_fail), so 0 when proved safe and 1 when dominated; without such a run, d_safe is
        ``_UNPROVEN``. Runs compare when their unannotated params are equal; where no such run failed that way, the
        other runs' answer counts times ``BORROWED``."""
        own = self._own_risk(params, kind)
        if own is not None:
            return own
        # Nothing failed this way with these unannotated values (another optimizer, say): read the other values'
        # failures at a discount, for a guess is all they give (dominance never skips on them, nor does a 0 prove).
        borrowed = self._risk_among(params, kind, self.outcomes)
        if borrowed is not None:
            return BORROWED * borrowed
        return self._frontier_risk(params, kind)

    def _frontier_risk(self, params: dict, kind: str) -> float | None:
        """Before any run failed this way: a config more than ``FRONTIER_STEPS`` past what the runs proved safe,
        along the axes annotated for ``kind``, is in untried country (``FRONTIER_RISK``); nearer, or before any run,
        nothing is known. So the search widens the proven region a step at a time instead of leaping to the end of
        a ``nan: up`` axis, where the first NaN of a study is usually bought."""
        attr, axes = self._axes(kind)
        safe = _proven_safe(self.outcomes, kind)
        if not axes or not safe:
            return None
        d = min((g for o in safe if (g := _gap(axes, attr, o.params, params, _leap_axis)) is not None), default=None)
        return FRONTIER_RISK if d is not None and d > FRONTIER_STEPS else None

    def proof(self, params: dict, kind: str) -> float | None:
        """1.0 when a ``kind`` failure dominates ``params``, 0.0 when a run that did not fail that way proves it safe
        (both among runs with its unannotated values, the monotony the annotations state); None otherwise."""
        own = self._own_risk(params, kind)
        return own if own in (0.0, 1.0) else None

    def _own_risk(self, params: dict, kind: str) -> float | None:
        """``risk`` among the runs whose unannotated params equal ``params``' (None: no failure there to read)."""
        same = [n for n, p in self.space.params.items() if getattr(p, _DOMINANCE[kind][0]) is None]
        return self._risk_among(
            params,
            kind,
            [o for o in self.outcomes if all(value_key(o.params.get(n)) == value_key(params.get(n)) for n in same)],
        )

    def _axes(self, kind: str) -> tuple[str, dict]:
        """(the annotation ``kind`` reads, the params annotated ``up`` or ``down`` for it)."""
        attr = _DOMINANCE[kind][0]
        return attr, {n: p for n, p in self.space.params.items() if getattr(p, attr) in ("up", "down")}

    def _risk_among(self, params: dict, kind: str, comparable: list[Outcome]) -> float | None:
        attr, axes = self._axes(kind)
        failures = [o for o in comparable if o.proves == kind]
        if not failures or not axes:
            return None
        safe = _proven_safe(comparable, kind)

        d_fail = min((g for o in failures if (g := _gap(axes, attr, params, o.params)) is not None), default=None)
        d_safe = min((g for o in safe if (g := _gap(axes, attr, o.params, params)) is not None), default=_UNPROVEN)
        if d_fail is None:
            return None
        return 1.0 if d_fail == 0 else d_safe / (d_safe + d_fail)

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

        escapes = [e for n in drivers if (e := params[n].escape(o.params[n], getattr(params[n], attr), valid))]
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


def _proven_safe(outcomes: list[Outcome], kind: str) -> list[Outcome]:
    """The runs that did not fail ``kind``'s way: any measured peak fitted; a NaN run (or a diverged one) says
    nothing of NaN."""
    return [o for o in outcomes if o.status in _MEASURED_STATUSES and (kind == Status.OOM or o.proves is None)]


def _gap(axes: dict, attr: str, low: dict, high: dict, axis=None) -> float | None:
    """How far ``low`` must move up each annotated axis (down, for a ``down`` axis) to reach ``high``, in steps
    (``axis``: where a value sits, ``_axis`` unless given)."""
    axis = axis or _axis
    total = 0.0
    for name, param in axes.items():
        a, b = axis(param, low.get(name)), axis(param, high.get(name))
        if a is None or b is None:
            return None
        total += max(0.0, (b - a) if getattr(param, attr) == "up" else (a - b))
    return total


def _axis(param, value) -> float | None:
    """Where ``value`` sits along an annotated param's axis, in steps: a choice by its index, a number by its place
    between the bounds (log-scaled where the space says so) on a five-point scale."""
    position = param.position(value)
    if position is None:
        return None
    if getattr(param, "values", None) is not None:
        return position
    return RANGE_STEPS * param.encode(value)[0]


def _leap_axis(param, value) -> float | None:
    """``_axis`` for a leap into untried country: a choice of positive numbers in increasing or decreasing order is
    a sampling of a ratio scale, so its values sit by log ratio, spread over as many steps as the choice has gaps
    (evenly spaced values keep their indices). Learning rates 0.001, 0.003, 0.01, 0.1, 1 sit at 0, 0.64, 1.33,
    2.67, 4: going from 0.1 to 1 multiplies the rate by 10 where the grid's first steps multiplied it by 3."""
    values = getattr(param, "values", None)
    position = param.position(value)
    if position is None or values is None or len(values) < 2 or not all(positive_number(v) for v in values):
        return _axis(param, value)
    logs = [math.log(v) for v in values]
    gaps = [b - a for a, b in pairwise(logs)]
    if not (all(g > 0 for g in gaps) or all(g < 0 for g in gaps)):
        return position
    return (len(values) - 1) * (logs[int(position)] - logs[0]) / (logs[-1] - logs[0])
