"""The profile's numbers fitted to measured steps: what ``python -m core.perf calibrate`` does with its trials and a
study does with its runs as they land (``autoresearch.search.prior``), one function for both, so that the same
measurements give the same numbers.

    shares(cfg)            a config's step, and the seconds of it each fitted number's time scale carries
    fit(runs, start)       the numbers that reproduce the runs' measured steps best
    step_at(s, numbers)    a config's step at other values of the numbers, from its shares

The step-time model's time is a sum of terms, each proportional to one number of the profile (a block's launches,
PyNative's dispatch, a ring step's latency) or to its inverse (the matmul efficiency). A config's step at other
values of those numbers is therefore its step at the start values with each number's share scaled: the share is the
step with that number's time doubled, less the step. That is exact for every layout whose critical path does not
change with the numbers, i.e. every layout but a pipeline's, where it is the first-order change (the pipeline's
bubble grows with its stages' time). Fitting is then a linear least-squares problem in the scales, on relative
errors (a slow layout weighs as much as a fast one), within each number's bounds, each scale pulled toward 1 by a
ridge so small that it only holds a number no run moves.

Which run identifies which number: a one-process compiled run the efficiency (and launches), runs at several
micro-batch counts the launches, a PyNative run the dispatch, a run of several ranks the latency inside a trial (a
peer that shares the cores arrives late at every collective: several times the all-reduce micro-benchmark's). The
calibration command runs one layout for each; a study has whatever it ran.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from core.config import TrainConfig
from core.perf.step import estimate_step

FITTED = ("matmul_efficiency", "launch_overhead_us", "pynative_overhead_us", "intra_node_latency_us")
INVERSE = ("matmul_efficiency",)  # time goes as 1 / the number
BOUNDS = {  # what each number may be: an efficiency at most the reference rate's
    "matmul_efficiency": (1e-4, 1.0),
    "launch_overhead_us": (0.0, 1e5),
    "pynative_overhead_us": (0.0, 1e6),
    "intra_node_latency_us": (0.0, 1e5),
}
RIDGE = 1e-6  # each scale's pull toward 1 (against a run's squared relative error): holds what no run moves


@dataclass(frozen=True)
class Shares:
    """A config's predicted step (seconds) at the start numbers, and the seconds each number's time carries."""

    step: float
    parts: np.ndarray  # one per key of ``keys``, in order
    keys: tuple[str, ...]


def shares(cfg: TrainConfig, keys: tuple[str, ...] = FITTED) -> Shares:
    """``cfg``'s step and each number's share of it, the numbers as ``cfg.cluster`` gives them (set them: a null
    has no share)."""
    step = estimate_step(cfg).step_time_sec
    parts = []
    for key in keys:
        value = getattr(cfg.cluster, key)
        if not value:
            parts.append(0.0)
            continue
        doubled = value / 2 if key in INVERSE else value * 2
        cluster = dataclasses.replace(cfg.cluster, **{key: doubled})
        parts.append(estimate_step(dataclasses.replace(cfg, cluster=cluster)).step_time_sec - step)
    return Shares(step, np.array(parts), tuple(keys))


def step_at(s: Shares, start: dict[str, float], numbers: dict[str, float]) -> float:
    """The step of the config of ``s`` (shares taken at ``start``) at ``numbers`` instead."""
    return s.step + float(s.parts @ (_scales(s.keys, start, numbers) - 1.0))


def fit(runs: list[tuple[Shares, float]], start: dict[str, float], held: tuple[str, ...] = ()) -> dict[str, float]:
    """The numbers (the keys of the shares) that reproduce ``runs`` — (shares at ``start``, measured seconds) —
    best, within ``BOUNDS``; a number no run's step depends on, and each of ``held``, stays at its start."""
    keys = runs[0][0].keys if runs else FITTED
    a = [s.parts / measured for s, measured in runs]
    b = [1.0 - (s.step - s.parts.sum()) / measured for s, measured in runs]
    ridge = np.sqrt(RIDGE) * np.eye(len(keys))
    a = np.vstack([*a, ridge]) if a else ridge
    b = np.r_[b, ridge.diagonal()]
    low, high = [], []
    for key in keys:
        lo, hi = BOUNDS[key]
        value = start[key]
        if not value > 0 or key in held:  # the number stays
            low.append(1.0)
            high.append(1.0 + 1e-12)
            continue
        if key in INVERSE:  # scale = start / number
            lo, hi = value / hi, (value / lo if lo > 0 else np.inf)
        else:  # scale = number / start
            lo, hi = lo / value, hi / value
        low.append(lo)
        high.append(hi)
    scales = optimize.lsq_linear(a, b, bounds=(low, high)).x
    return {
        key: (start[key] / scale if key in INVERSE else start[key] * scale)
        for key, scale in zip(keys, scales, strict=True)
    }


def bound_at(key: str, value: float) -> float | None:
    """The one of its ``BOUNDS`` at which ``value`` of number ``key`` stopped, or None."""
    return next((b for b in BOUNDS[key] if math.isclose(value, b, rel_tol=1e-6, abs_tol=1e-9)), None)


def _scales(keys, start: dict[str, float], numbers: dict[str, float]) -> np.ndarray:
    return np.array(
        [
            1.0 if not start[k] > 0 else (start[k] / numbers[k]) if k in INVERSE else (numbers[k] / start[k])
            for k in keys
        ]
    )
