"""The records every part of the agent shares: how a trial can end (``Status`` and its groupings), what a skipped
proposal is (``Skip``), what one trial of a study looks like as a row (``TrialRow``), the names of the user
attributes a study stores, and what identifies a config (``config_key``).

A leaf module: it imports nothing of the agent, so that storage, learning, proposers, the session and the reports
read the same records instead of importing them from each other. The core's own statuses come from its trial
contract (``core.trial.contract``), so the two cannot disagree.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

from core.trial.contract import Exit


class Status(str, enum.Enum):
    """How a trial of a study ended. The first seven are the core's (a trial that ran: its exit code's status);
    the others are the agent's (a proposal that never ran, or a trial its agent abandoned)."""

    OK = Exit.OK.status
    ERROR = Exit.ERROR.status
    INVALID = Exit.INVALID.status
    OOM = Exit.OOM.status
    COMPILE_ERROR = Exit.COMPILE_ERROR.status
    NAN = Exit.NAN.status
    TIMEOUT = Exit.TIMEOUT.status
    PRUNED = "pruned"  # dominated by a known failure, or over the memory gate
    DUPLICATE = "duplicate"  # a repeat of a recorded trial
    REJECTED = "rejected"  # outside the space or its constraints
    REAPED = "reaped"  # its agent died while it ran
    INTERRUPTED = "interrupted"  # its agent was stopped (Ctrl-C, SIGTERM) while it ran
    NODE_FAIL = "node_fail"  # a node it ran on failed (its executor said so: Slurm's NODE_FAIL)
    PREEMPTED = "preempted"  # its executor ended it for other work (Slurm's PREEMPTED)
    CANCELLED = "cancelled"  # a person cancelled it (scancel), not the agent

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of_exit(cls, code: int | None) -> Status:
        """The status of a trial process's exit code (an unknown or missing code is an error)."""
        return cls(Exit(code).status) if code in Exit._value2member_map_ else cls.ERROR


# The statuses of trials that actually ran (the core's).
RAN = (Status.OK, Status.ERROR, Status.INVALID, Status.OOM, Status.COMPILE_ERROR, Status.NAN, Status.TIMEOUT)
FAILED = RAN[1:]
# Failures that say something about the config's region of the space: each is a constraint of the study
# (``study.storage``) and evidence for the feasibility memory (``search.feasibility``).
FAILURE_KINDS = (Status.OOM, Status.NAN, Status.COMPILE_ERROR, Status.TIMEOUT)
SPACE_CONSTRAINT = "space"  # the constraint of a point that breaks the space's own constraints
CONSTRAINT_KEYS = (*FAILURE_KINDS, SPACE_CONSTRAINT)
# Proposals that never ran.
SKIPPED = (Status.PRUNED, Status.DUPLICATE, Status.REJECTED)
# Runs that paid for a failure the agent learns to avoid: out of memory, diverged, over the budget (the study's
# waste, ``study.ledger``).
WASTED = (Status.OOM, Status.NAN, Status.TIMEOUT)
# FAILed by the agent, not by the trial: the config says nothing by them, and runs again (but once, and not after
# a person's cancel).
ABANDONED = (Status.REAPED, Status.INTERRUPTED, Status.NODE_FAIL, Status.PREEMPTED, Status.CANCELLED)


class Attr:
    """Names of the user attributes of a study's trials (``study.storage`` explains each) and of the study."""

    STATUS, EXIT_CODE, REASON, OBJECTIVE, METRICS = "status", "exit_code", "reason", "objective", "metrics"
    WALL_TIME, TRIAL_DIR, LEDGER, FAILURE_KIND = "wall_time_sec", "trial_dir", "ledger", "failure_kind"
    PROPOSER, RATIONALE, FALLBACK_FROM, LLM_USAGE = "proposer", "rationale", "fallback_from", "llm_usage"
    PREDICTED_MEMORY, ESTIMATED_MEMORY = "predicted_memory_bytes", "estimated_memory_bytes"
    AGENT, HEARTBEAT, TRIAL_PID, RETRY_OF = "agent", "heartbeat_at", "trial_pid", "retry_of"
    CONFIRMATION_OF, REPEAT, PREDICTED_OBJECTIVE = "confirmation_of", "repeat", "predicted_objective"
    # the study's own
    SPACE, OBJECTIVE_METRIC, DIRECTION, PARAM_NAMES, SPACE_PATH, WORLD_SIZE, BASELINE, CALIBRATION_SEC = (
        "space",
        "objective_metric",
        "direction",
        "param_names",
        "space_path",
        "world_size",
        "baseline",  # the baseline's params (autoresearch.space.baseline), or None
        "calibration_device_sec",  # device-seconds the study spent measuring this machine (core.perf.micro)
    )


BASELINE_PROPOSER = "baseline"  # who "proposed" the baseline's trial: the study runs it first


@dataclass(frozen=True)
class Skip:
    """Why a proposal does not run: its status (pruned, duplicate, rejected), the reason a person can act on, and
    the constraint it breaks (a failure kind, ``space``, or None)."""

    status: Status
    reason: str
    kind: str | None = None


# A finite run "diverged" when its final loss is this many times its first: far beyond the step-to-step noise of a
# run whose learning rate is merely too small to move the loss, and far below what a blown-up run shows
# (benchmarks/RESULTS.md, "Agent efficiency").
DIVERGENCE_RATIO = 1.5


def is_number(x: Any) -> bool:
    """A finite real number, not a bool: a value that was really measured."""
    return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)


def foreknowledge(attrs: dict) -> str:
    """What the agent knew of a trial before it ran it, from its attributes: the gate's calibrated peak and the
    proposer's failure probability (the GP's rationale says ``P(no failure) 0.93``), e.g. ``predicted peak 812
    MiB, failure probability 0.07``; "" when it knew neither. Said beside a failed trial, it tells a surprise from
    a bet."""
    known = []
    if is_number(peak := attrs.get(Attr.PREDICTED_MEMORY)):
        known.append(f"predicted peak {peak / 2**20:,.0f} MiB")
    if match := re.search(r"P\(no failure\) ([0-9.]+)", attrs.get(Attr.RATIONALE) or ""):
        known.append(f"failure probability {1 - float(match[1]):.2f}")
    return ", ".join(known)


def plan_errors(rows: list) -> list[float]:
    """|predicted / measured - 1| of each ok search run the step-time model predicted before it ran (``--plan``),
    in trial order: what the report and Claude's prompt say of the model's accuracy."""
    return [
        abs(r.predicted_objective / r.objective - 1.0)
        for r in rows
        if r.status == Status.OK
        and r.predicted_objective is not None
        and is_number(r.objective)
        and r.objective
        and r.confirmation_of is None
    ]


def gain(value: Any, baseline: Any, maximize: bool) -> float | None:
    """How much better ``value`` is than the baseline's, as a ratio above 1 when better: value / baseline for an
    objective maximised (a throughput's speed-up), baseline / value for one minimised (a time, a loss); None
    where either is not a positive number."""
    if not (positive_number(value) and positive_number(baseline)):
        return None
    return value / baseline if maximize else baseline / value


def positive_number(x: Any) -> bool:
    return is_number(x) and x > 0


def number_or_none(x: Any) -> float | None:
    return float(x) if is_number(x) else None


def diverged(metrics: dict | None) -> bool:
    """Whether a run's loss rose to more than ``DIVERGENCE_RATIO`` times its first value."""
    first, final = (metrics or {}).get("first_loss"), (metrics or {}).get("final_loss")
    return positive_number(first) and positive_number(final) and final > DIVERGENCE_RATIO * first


def tidy(x: float) -> float:
    """A number to 12 significant digits: 0.0030000000000000005 -> 0.003, so that overrides, tables and duplicate
    checks see the number a person would write."""
    return float(f"{x:.12g}")


def value_key(v: Any) -> tuple:
    """A hashable, type-aware form of one value: numbers compare as numbers (``4 == 4.0``; floats to 12
    significant digits, so that a value that went through the storage and back is one value), while ``True`` and
    ``1`` stay different (a boolean choice is not a count)."""
    if v is None or isinstance(v, (bool, str)):
        return (type(v).__name__, v)
    if isinstance(v, Real):
        return ("number", tidy(float(v)))
    return ("other", repr(v))


def changes(params: dict, baseline: dict) -> dict:
    """The params whose value differs from the baseline's (``value_key``: 4 == 4.0, True != 1)."""
    return {k: v for k, v in params.items() if value_key(v) != value_key(baseline.get(k))}


def config_key(params: dict) -> tuple:
    """The identity of a config: what makes two trials "the same config" everywhere in the agent."""
    return tuple(sorted((k, value_key(v)) for k, v in params.items()))


@dataclass
class TrialResult:
    """What one trial process left behind (``core_adapter.read_result``)."""

    status: Status
    exit_code: int | None  # the process's return code; negative = killed by that signal
    reason: str
    summary: dict | None  # trial_summary.json, or None when the trial left none
    objective: float | None  # the objective metric of an ok trial, else None
    wall_time: float  # seconds, as seen by the runner
    trial_dir: Path

    @property
    def metrics(self) -> dict:
        """The summary's metrics, plus ``compile_cache`` ("loaded" / "compiled") when the trial used the core's
        compile cache: a loaded trial's peak memory lacks the compiler's (``search.feasibility``)."""
        summary = self.summary or {}
        metrics = dict(summary.get("metrics") or {})
        if summary.get("compile_cache"):
            metrics["compile_cache"] = summary["compile_cache"]
        return metrics


@dataclass(kw_only=True)
class TrialRow:
    """One trial of a study as the proposers, the reports and the ledger read it (``study.storage.trial_rows``
    builds them, and nothing else)."""

    number: int
    state: str  # Optuna's: COMPLETE, PRUNED, FAIL, RUNNING
    status: str  # a Status, or the state's name while it runs
    params: dict = field(default_factory=dict)
    exit_code: int | None = None
    objective: float | None = None
    peak_memory_bytes: int | None = None
    predicted_memory_bytes: int | None = None
    estimated_memory_bytes: int | None = None
    predicted_objective: float | None = None  # the step-time model's, before the run (--plan)
    wall_time_sec: float | None = None
    proposer: str | None = None
    failure_kind: str | None = None
    reason: str = ""
    rationale: str = ""
    trial_dir: str | None = None
    confirmation_of: int | None = None
    ledger: dict | None = None  # study.ledger; None while running
    diverged: bool = False  # ran ok, but its loss blew up (``diverged``): evidence of a NaN region
    baseline: bool = False  # the baseline's config (autoresearch.space.baseline)
    gain: float | None = None  # objective against the baseline's mean (``gain``: above 1 is better)
    memory_ratio: float | None = None  # peak memory over the baseline's
