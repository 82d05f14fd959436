"""The plan as the search's prior (``--plan``): the core's step-time model (``core.perf``) predicts each candidate's
objective before it runs, and every trial that lands refits the model's efficiency to this study's runs.

The model splits a step into compute (with recompute, the optimizer and the pipeline's idle time, which grows with
the stages' compute), communication, kernel launches and PyNative's dispatch (``StepEstimate.breakdown``). A
device's real rate for each differs from its profile by a factor the profile cannot know for this model and this
machine, so after every run four factors are refitted, one per part, by least squares on the relative error of the
ok runs' step times, each pulled toward 1 by a ridge term: one run moves mostly the part that dominates it, and a
part no run exercised stays at its profile value.

This is how a study calibrates the model as it goes: on a CPU nobody has calibrated, the profile's numbers are its
micro-benchmarks' (``core.perf.micro``: no trial), each part's factor is then the ratio of what the runs show to what
the micro-benchmark measured (matmul efficiency for compute, launches, dispatch, the link inside a trial), and the
numbers ``python -m core.perf calibrate`` fits on its own trials are what the same runs give it (tested against it
on the same measurements). The refitted model is what the ``gp`` proposer starts from (its first trial is the
plan's best runnable point) and what its Gaussian process corrects (it models the log of measured over predicted).

What the model does not price (found by varying each param alone: ``memory.swap``, the runtime's settings) is left
to the runs: of points it predicts alike the plan runs the core's defaults first, and only runs at those defaults
refit the factors, so that an effect the model cannot see is not charged to every other config.

Only a throughput objective has a step time to predict: ``tokens_per_sec`` (the step's tokens over its median time)
or ``step_time_ms_median``. MFU is left out: the trials measure it against this machine's reference rate, the plan
against the profile's peak.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterable

import numpy as np
from scipy import optimize

from autoresearch.core_adapter import default_values, planned, predict_step
from autoresearch.records import Status, config_key, is_number
from autoresearch.space import SearchSpace
from autoresearch.space.space import CORE_COMMAND
from core.config import ConfigError
from core.perf import StepEstimate
from core.perf import fit as perf_fit

OBJECTIVES = ("tokens_per_sec", "step_time_ms_median")
PARTS = ("compute", "comm", "launch", "dispatch")  # the refitted factors, in this order
RIDGE = 0.01  # each factor's pull toward 1, against a run's squared relative error: one run is fitted ~99%
VALIDATE_POINTS = 64  # grid points tried before --plan gives up on a space the model cannot predict
PROBE_POINTS = 16  # grid points from which each param is varied to find those the model does not price


def parts_of(breakdown: dict[str, float]) -> np.ndarray:
    """Seconds of a step by refitted part (``PARTS``); they add up to the predicted step time."""
    launch, dispatch = breakdown.get("launch", 0.0), breakdown.get("dispatch", 0.0)
    comm = sum(v for k, v in breakdown.items() if k.startswith("comm_") and k != "comm_pp")
    return np.array([sum(breakdown.values()) - launch - dispatch - comm, comm, launch, dispatch])


class StepPrior:
    """The step-time model's prediction of a space's objective, refitted to the study's runs."""

    def __init__(self, space: SearchSpace):
        """Raises SpaceError for a space it cannot serve. A space that sizes no cluster is predicted on one host of
        each point's ranks (``core_adapter.predict_step(one_host=True)``), as the agent runs it."""
        metric = space.objective_metric
        if space.trial_command != CORE_COMMAND:
            raise space.error("trial_command", "--plan predicts core.train's trials; this space runs another command")
        if metric not in OBJECTIVES:
            raise space.error(
                "objective.metric",
                f"--plan predicts a step time, which {metric} is not; use one of {', '.join(OBJECTIVES)} or drop --plan",
            )
        self.space = space
        self.factors = np.ones(len(PARTS))
        self._estimates: dict[tuple, StepEstimate | None] = {}
        self._errors: dict[tuple, ConfigError] = {}
        self._fitted_on: tuple = ()
        self.defaults = default_values(space.fixed, list(space.params)) if space.params else {}
        self.start: dict[str, float] | None = None  # calibrating in-study: the numbers the fit starts from
        self.numbers: dict[str, float] = {}  # ... and where the runs have put them (cluster.<key> of every estimate)
        self._shares: dict[tuple, perf_fit.Shares] = {}

    def calibrate_in_study(self, start: dict[str, float]) -> None:
        """Fit the profile's numbers that trials show beyond micro-benchmarks (``core.perf.fit.FITTED``: matmul
        efficiency, launches, PyNative's dispatch, the latency inside a trial) to this study's runs as they land,
        starting from ``start`` (a CPU's micro-benchmarks, ``core.perf.micro``), with the very fit ``python -m
        core.perf calibrate`` runs on its own trials; the factors then stay at 1 (the numbers are what the runs
        refit)."""
        self.start = {k: float(start[k]) for k in perf_fit.FITTED}
        self._set_numbers(dict(self.start))

    @functools.cached_property
    def grid(self) -> list[dict]:
        """The space's grid, enumerated once (the proposers, the probe of unpriced params and Claude's plan read
        it; a space for a cluster has thousands of points)."""
        return self.space.grid()

    def factors_text(self) -> str:
        """What the runs refitted, in a few words: the in-study numbers, else the factors."""
        if self.start is not None:
            return ", ".join(f"{k} {v:.3g}" for k, v in self.numbers.items())
        return ", ".join(f"{name} x{f:.2f}" for name, f in zip(PARTS, self.factors, strict=True))

    def _set_numbers(self, numbers: dict[str, float]) -> None:
        if numbers != self.numbers:
            self.numbers = numbers
            self._estimates.clear()  # every estimate was made with the numbers before
            self._errors.clear()

    def _settings(self, params: dict) -> dict:
        return {**self.space.fixed, **params, **{f"cluster.{k}": v for k, v in self.numbers.items()}}

    def changes(self, params: dict) -> int:
        """How many of the point's params differ from what the core runs by default: among points the model
        cannot tell apart (it does not price ``memory.swap``, say), the plan runs the one that changes least
        first, and the runs teach the GP the rest."""
        return sum(k in self.defaults and v != self.defaults[k] for k, v in params.items())

    @functools.cached_property
    def unpriced(self) -> frozenset[str]:
        """The params whose value never moves the model's prediction: each varied alone over the values the grid
        gives it, from ``PROBE_POINTS`` points drawn from the grid, where the core takes at least two of them."""
        grid = self.grid
        values = {name: list(dict.fromkeys(p[name] for p in grid)) for name in self.space.params}
        bases = random.Random(0).sample(grid, min(len(grid), PROBE_POINTS))  # a stride could alias with the grid
        out = set()
        for name, options in values.items():
            tried, moved = False, False
            for base in bases:
                predicted = [t for v in options if (t := self.step_seconds({**base, name: v})) is not None]
                tried, moved = tried or len(predicted) > 1, moved or len(set(predicted)) > 1
            if tried and not moved:  # (a param bound to others by the space's rules is never varied alone: priced)
                out.add(name)
        return frozenset(out)

    def priced(self, params: dict) -> bool:
        """Whether the model prices all of this run: every unpriced param at the core's default. Only such runs
        refit the factors; a run with SWAP on, say, would charge its copies to compute and mislead the factors for
        every run without (its difference is the GP's to learn)."""
        return all(params.get(k) == self.defaults[k] for k in self.unpriced if k in self.defaults)

    def estimate(self, params: dict) -> StepEstimate | None:
        """The model's estimate of a point (cached), or None when the core's rules refuse it."""
        key = config_key(params)
        if key not in self._estimates:
            try:
                self._estimates[key] = predict_step(self._settings(params), one_host=True)
            except ConfigError as exc:
                self._estimates[key], self._errors[key] = None, exc
        return self._estimates[key]

    def ranks(self, params: dict) -> int | None:
        """The devices a point's trial uses, by the model's config (None where the core's rules refuse it)."""
        est = self.estimate(params)
        return None if est is None else round(est.tokens_per_sec / est.tokens_per_sec_per_device)

    def step_seconds(self, params: dict) -> float | None:
        """The predicted step time with the refitted factors."""
        est = self.estimate(params)
        return None if est is None else float(parts_of(est.breakdown) @ self.factors)

    def predict(self, params: dict) -> float | None:
        """The predicted objective with the refitted factors, in the objective's units."""
        seconds, est = self.step_seconds(params), self.estimate(params)
        if seconds is None:
            return None
        if self.space.objective_metric == "step_time_ms_median":
            return seconds * 1000.0
        return est.tokens_per_sec * est.step_time_sec / seconds  # the step's tokens over the refitted time

    def measured_seconds(self, params: dict, objective: float) -> float | None:
        """A run's step time from its objective (the inverse of ``predict``)."""
        est = self.estimate(params)
        if est is None or not objective > 0:
            return None
        if self.space.objective_metric == "step_time_ms_median":
            return objective / 1000.0
        return est.tokens_per_sec * est.step_time_sec / objective

    def refit(self, rows: Iterable) -> np.ndarray:
        """Refit the factors to the ok runs among ``rows`` (``TrialRow``s) that the model prices (``priced``);
        returns them. A run counts with its relative error, ``predicted / measured - 1``, so a slow layout weighs
        as much as a fast one."""
        runs = self._priced_runs(rows)
        key = tuple((config_key(p), o) for p, o in runs)
        if key == self._fitted_on:
            return self.factors
        if self.start is not None:
            self._set_numbers(self._fit_numbers(runs))
        else:
            self.factors = self._fit(runs)
        self._fitted_on = key
        return self.factors

    def held_out_errors(self, rows: Iterable) -> list[float]:
        """log(measured / predicted) of each ok priced run among ``rows``, as the model refitted to the *other* runs
        predicted it (leave-one-out): the model's out-of-sample error on this study. The refitted model reproduces
        the runs it was fitted to whatever its error elsewhere (three factors fit the first three runs exactly),
        so only these say how far to trust it on a config no run has been near. Empty with fewer than two runs:
        one run says nothing of the error between configs."""
        runs = self._priced_runs(rows)
        if len(runs) < 2:
            return []
        out = []
        for i, (params, objective) in enumerate(runs):
            others, measured = runs[:i] + runs[i + 1 :], self.measured_seconds(params, objective)
            if not measured:
                continue
            if self.start is not None:
                predicted = perf_fit.step_at(self._share(params), self.start, self._fit_numbers(others))
            else:
                predicted = float(parts_of(self.estimate(params).breakdown) @ self._fit(others))
            out.append(math.log(predicted / measured))
        return out

    def _fit_numbers(self, runs: list[tuple[dict, float]]) -> dict[str, float]:
        """The in-study numbers that fit ``runs`` (``core.perf.fit``: each run's step split by the numbers' shares
        at the start, once per config)."""
        told = [(self._share(p), self.measured_seconds(p, o)) for p, o in runs]
        return perf_fit.fit([(s, m) for s, m in told if m], self.start)

    def _share(self, params: dict) -> perf_fit.Shares:
        key = config_key(params)
        if key not in self._shares:
            start = {**self.space.fixed, **params, **{f"cluster.{k}": v for k, v in self.start.items()}}
            self._shares[key] = perf_fit.shares(planned(start, one_host=True))
        return self._shares[key]

    def _priced_runs(self, rows: Iterable) -> list[tuple[dict, float]]:
        return [
            (r.params, r.objective)
            for r in rows
            if r.status == Status.OK
            and is_number(r.objective)
            and set(r.params) == set(self.space.params)
            and self.priced(r.params)
        ]

    def _fit(self, runs: list[tuple[dict, float]]) -> np.ndarray:
        """The factors that fit ``runs`` (params, objective) best (ridge least squares on relative errors)."""
        a, b = [], []
        for params, objective in runs:
            measured, est = self.measured_seconds(params, objective), self.estimate(params)
            if measured:
                a.append(parts_of(est.breakdown) / measured)
                b.append(1.0)
        ridge = math.sqrt(RIDGE) * np.eye(len(PARTS))
        a = np.vstack([*a, ridge]) if a else ridge
        b = np.r_[b, ridge.diagonal()]  # the ridge rows pull each factor toward 1
        return optimize.lsq_linear(a, b, bounds=(1e-3, np.inf)).x

    def validate(self) -> None:
        """Raise SpaceError unless the model predicts at least one of the space's first grid points, quoting the
        core's reason for the first it refused (a cluster that does not match the layouts, an uncalibrated
        machine): a prior that predicts nothing would be a silent plain search."""
        points = self.grid[:VALIDATE_POINTS]
        if any(self.estimate(p) is not None for p in points):
            return
        first = self._errors[config_key(points[0])] if points else None
        raise self.space.error(
            first.field if first else "params",
            f"--plan: the step-time model predicts none of the space's first {len(points)} points"
            + (f"; the first: {first}" if first else ""),
        )
