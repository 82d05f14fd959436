"""Whether a proposal should run: the space's rules, what earlier trials proved, and the memory gate.

A proposal is skipped (recorded as PRUNED, costs no run) when it breaks the space, repeats a failure or a recorded
trial, is dominated by a known OOM or NaN (``autoresearch.search.feasibility``), or its predicted peak memory is over
``memory.limit_gb``. The gate also owns the memory prediction every candidate shows: the user's estimator
(``--estimator``), cached per config, recalibrated against measured peaks as trials end.
"""

from __future__ import annotations

import importlib
import logging

import optuna

from autoresearch.records import FAILURE_KINDS, SPACE_CONSTRAINT, Attr, Skip, Status, config_key
from autoresearch.search.feasibility import FeasibilityMemory
from autoresearch.space import SearchSpace
from autoresearch.study.storage import recorded_keys, status_of

GiB = 1024**3
log = logging.getLogger("autoresearch")


def load_callable(spec: str):
    """``package.module:function`` -> the function (for --estimator; a user's own code, never an LLM's)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise SystemExit(f"--estimator wants MODULE:FUNCTION, got {spec!r}")
    return getattr(importlib.import_module(module), name)


class Gate:
    def __init__(self, space: SearchSpace, estimator: str | None, learn: bool = True):
        self.space = space
        self.learning = learn  # off (--no-learn): only the space's rules and duplicates skip a proposal
        self.memory = FeasibilityMemory(space)  # also holds the memory model, calibrated as trials end
        self.estimator = self._load_estimator(estimator) if learn else None
        self._estimates: dict[tuple, int | None] = {}

    @staticmethod
    def _load_estimator(spec: str | None):
        if not spec:
            return None
        try:
            return load_callable(spec)
        except (ImportError, AttributeError) as exc:
            log.warning("memory gate off: cannot load estimator %s (%s)", spec, exc)
            return None

    def learn(self, number: int, params: dict, status: str, metrics: dict) -> None:
        """Record a finished trial. The memory model is calibrated on this gate's own estimate of the config beside
        the measured peak, not the estimate the trial's summary carries: the calibration maps what the gate predicts
        from, and the two differ under a user's --estimator, or a trial run by an older core (a replayed table: its
        summaries' estimates came from the core it was collected with, and calibrating today's estimates on them
        counted the old under-estimate twice)."""
        if not self.learning:
            return
        est, _ = self.predict_memory(params)
        if est is not None and metrics.get("estimated_memory_bytes") is not None:
            metrics = {**metrics, "estimated_memory_bytes": est}
        self.memory.record(params, status, metrics, trial=number)

    def predict_memory(self, params: dict) -> tuple[int | None, int | None]:
        """(analytic estimate, calibrated prediction) of the per-rank peak, or Nones without an estimator."""
        if self.estimator is None:
            return None, None
        key = config_key(params)
        if key not in self._estimates:  # the core's estimator composes a Hydra config: worth caching
            try:
                self._estimates[key] = self.estimator(self.space.overrides(params))
            except Exception:  # an estimator that cannot handle a config must not stop the study
                self._estimates[key] = None
        est = self._estimates[key]
        if est is None:
            return None, None
        return int(est), int(self.memory.memory_model.predict(float(est)))  # recalibrated as trials end

    def oom_probability(self, params: dict) -> float | None:
        """P(the run's peak passes ``memory.limit_gb``) by the calibrated memory model and its error on configs it
        has not seen (``MemoryModel.oom_probability``); None without an estimate or a limit."""
        est, _ = self.predict_memory(params)
        limit = self.memory_limit_bytes(params)
        if est is None or limit is None or not self.learning:
            return None
        return self.memory.memory_model.oom_probability(est, limit)

    def risk(self, params: dict) -> dict[str, float]:
        """P(failure) by kind (``oom``, ``nan``) as known before ``params`` run: 1 or 0 where the annotations prove
        the run dominated or safe (``FeasibilityMemory.proof``); else, for OOM, the memory model's
        ``oom_probability`` where there is an estimate; else ``FeasibilityMemory.risk`` along the annotations (a
        guess from other runs included). A kind is absent when nothing is known of it."""
        if not self.learning:
            return {}
        out = {}
        for kind in (Status.OOM, Status.NAN):
            p = self.memory.proof(params, kind)
            if p is None and kind == Status.OOM:
                p = self.oom_probability(params)
            if p is None:
                p = self.memory.risk(params, kind)
            if p is not None:
                out[kind] = p
        return out

    def memory_limit_bytes(self, params: dict) -> float | None:
        limit = params.get("memory.limit_gb", self.space.fixed.get("memory.limit_gb"))
        return float(limit) * GiB if isinstance(limit, (int, float)) and limit > 0 else None

    def skip(self, study: optuna.Study, params: dict, recorded: dict | None = None) -> Skip | None:
        """Why ``params`` should not run, or None. ``recorded``: the study's finished trials by config key
        (``recorded_keys``), when the caller checks many proposals."""
        problems = self.space.check(params)
        if problems:
            return Skip(Status.REJECTED, "; ".join(problems), SPACE_CONSTRAINT)
        if self.learning:  # repeats of failures, OOM/NaN dominance, then the memory gate
            est, _ = self.predict_memory(params)
            found = self.memory.verdict(params, est, self.memory_limit_bytes(params))
            if found:
                kind, reason = found  # a repeat of an error or invalid trial is no failure kind to learn
                return Skip(
                    Status.DUPLICATE if kind is None else Status.PRUNED, reason, kind if kind in FAILURE_KINDS else None
                )
        # Repeats of any recorded trial, pruned ones included (the memory only knows trials that ran).
        recorded = recorded_keys(study) if recorded is None else recorded
        t = recorded.get(config_key(self.space.coerce(params)))
        if t is not None:
            kind = t.user_attrs.get(Attr.FAILURE_KIND)
            reason = f"duplicate of trial {t.number} ({status_of(t)})"
            return Skip(Status.PRUNED if kind else Status.DUPLICATE, reason, kind)
        return None

    def skip_reason(self, study: optuna.Study, params: dict, recorded: dict | None = None) -> str | None:
        """``ProposalContext.check``: why a proposal would be skipped, or None."""
        try:
            skipped = self.skip(study, params, recorded)
        except ValueError as exc:  # coerce() refuses a value of the wrong type
            return str(exc)
        return skipped.reason if skipped else None
