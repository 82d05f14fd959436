"""How a trial can end, and what identifies a config: the records every other agent module shares.

A leaf module (it imports nothing of the agent), so that storage, learning, samplers, proposers and reports read
the same statuses, exit codes and config identity instead of importing them from each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any

from core.trial import STATUS  # the core's exit-code table (DESIGN §3.3); core.trial imports no MindSpore

# DESIGN §3.3: exit code -> status of a trial that ran.
EXIT_STATUS = {int(code): name for code, name in STATUS.items()}
FAILURE_STATUSES = ("error", "invalid", "oom", "compile_error", "nan", "timeout")
TRIAL_STATUSES = ("ok", *FAILURE_STATUSES)  # = RAN: the statuses of trials that actually ran
RAN = TRIAL_STATUSES
# Failures that say something about the config's region of the space: each is a constraint of the study
# (``storage``) and evidence for the feasibility memory (``learn``). ``space``: a point that breaks the space's own
# constraints.
FAILURE_KINDS = ("oom", "nan", "compile_error", "timeout")
CONSTRAINT_KEYS = FAILURE_KINDS + ("space",)
# Proposals that never ran: dominated by a known failure or over the memory gate (pruned), a repeat of a recorded
# trial (duplicate), outside the space or its constraints (rejected).
SKIPPED_STATUSES = ("pruned", "duplicate", "rejected")
# FAILed by the agent, not by the trial (its agent died, or was stopped): the config runs again.
ABANDONED = ("reaped", "interrupted")

# A finite run "diverged" when its final loss is this many times its first: far beyond the step-to-step noise of a
# run whose learning rate is merely too small to move the loss, and far below what a blown-up run shows (measured
# on the tiny model over 20 steps, benchmarks/data/tabular.json: lr 1 and 10 end at 3-115x their first loss,
# every lr up to 0.1 at 0.49-0.70x).
DIVERGENCE_RATIO = 1.5


def positive_number(x: Any) -> bool:
    """A finite number above 0 (not a bool, not NaN): a metric that was really measured."""
    return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def diverged(metrics: dict | None) -> bool:
    """Whether a run's loss rose to more than ``DIVERGENCE_RATIO`` times its first value."""
    first, final = (metrics or {}).get("first_loss"), (metrics or {}).get("final_loss")
    return positive_number(first) and positive_number(final) and final > DIVERGENCE_RATIO * first


@dataclass
class TrialResult:
    """What one trial process left behind (``autoresearch.runner.run_trial``)."""

    status: str  # ok | error | invalid | oom | compile_error | nan | timeout
    exit_code: int | None  # the process's return code; negative = killed by that signal
    reason: str
    summary: dict | None  # trial_summary.json, or None when the trial left none
    objective: float | None  # the objective metric of an ok trial, else None
    wall_time: float  # seconds, as seen by the runner
    trial_dir: Path

    @property
    def metrics(self) -> dict:
        """The summary's metrics, plus ``compile_cache`` ("loaded" / "compiled") when the trial used the core's
        compile cache: a loaded trial's peak memory lacks the compiler's (autoresearch.learn)."""
        summary = self.summary or {}
        metrics = dict(summary.get("metrics") or {})
        if summary.get("compile_cache"):
            metrics["compile_cache"] = summary["compile_cache"]
        return metrics


def value_key(v: Any) -> tuple:
    """A hashable, type-aware form of one value: numbers compare as numbers (``4 == 4.0``; floats to 12
    significant digits, so that 0.003 and 0.0030000000000000005, or a value that went through the storage and
    back, are one value), while ``True`` and ``1`` stay different (a boolean choice is not a count)."""
    if v is None or isinstance(v, (bool, str)):
        return (type(v).__name__, v)
    if isinstance(v, Real):
        return ("number", float(f"{float(v):.12g}"))
    return ("other", repr(v))


def config_key(params: dict) -> tuple:
    """The identity of a config: what makes two trials "the same config" everywhere in the agent."""
    return tuple(sorted((k, value_key(v)) for k, v in params.items()))
