"""What every executor shares: what a trial needs (``Resources``), how it is asked to run (``TrialSpec``), how an
executor saw it end (``Ended``), the two protocols (``Executor`` starts and adopts, ``Job`` is one started trial),
and ``wait``: one job from its start to the ``TrialResult`` the study is told.

The trial itself classifies its end in ``trial_summary.json`` (the core's contract); an executor adds only what the
trial cannot know — a scheduler's time limit, a lost node, a person's cancel — as ``Ended.status``, which then wins
over the summary's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from autoresearch.core_adapter import read_result
from autoresearch.execute.slots import Slot
from autoresearch.records import Status, TrialResult


class Interrupted(Exception):
    """The agent is stopping (``stop`` was set): the trial was ended, its outcome says nothing of its config."""


@dataclass(frozen=True, kw_only=True)
class Resources:
    """What one trial asks its executor for: ``nodes`` hosts, ``devices_per_node`` ranks on each (devices on an
    NPU cluster), and ``cores_per_node`` CPU cores on each (None: the executor's default)."""

    nodes: int = 1
    devices_per_node: int = 1
    cores_per_node: int | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node


@dataclass(frozen=True, kw_only=True)
class TrialSpec:
    """One trial to start: its full command line (``trial.dir`` included), where it writes, and what it needs."""

    argv: tuple[str, ...]
    trial_dir: Path
    name: str  # unique per study and trial: a Slurm job name, how a restarted agent finds the job again
    resources: Resources
    limit: float  # seconds from its start: the trial's own budget + grace + a margin; past it the trial is ended
    env: dict | None = None  # the environment to run in (None: the agent's)
    cwd: Path | None = None


@dataclass(frozen=True)
class Ended:
    """How an executor saw a trial end: the process's exit code (negative: the signal that ended it; None when
    unknown) and, when the executor knows better than the trial's summary, the status and why."""

    exit_code: int | None
    status: Status | None = None
    reason: str = ""


class Job(Protocol):
    record: dict  # stored on the study's trial (``Attr.TRIAL_PID``): what ``Executor.adopt`` finds it again by
    started: float | None  # time.time() when it started running (None while a scheduler still queues it)
    slack: float  # seconds past ``TrialSpec.limit`` before the agent cancels it (its executor enforces the limit)

    def poll(self, timeout: float) -> Ended | None:
        """Wait up to ``timeout`` seconds for the trial's end; None while it runs."""

    def cancel(self) -> None:
        """End the trial now, with everything it started (on every node)."""


class Executor(Protocol):
    name: str

    def slots(self, workers: int, device: str, world_size: int) -> list[Slot]:
        """``workers`` slots for trials side by side (``--workers``), or a SystemExit saying why they do not fit."""

    def start(self, spec: TrialSpec, slot: Slot) -> Job: ...

    def adopt(self, record: dict) -> Job | None:
        """The job of a trial whose agent died (``record`` as stored), still running or ended since; None when
        there is nothing to adopt (not this executor's, or gone without a trace): the trial is then reaped."""


def wait(
    job: Job,
    spec: TrialSpec,
    *,
    objective_metric: str | None = None,
    stop: threading.Event | None = None,
    on_poll: Callable[[], None] | None = None,
    poll_sec: float = 30.0,
    check_sec: float = 0.2,
) -> TrialResult:
    """Wait for ``job`` to end and classify it; past ``spec.limit`` it is cancelled (a timeout: the trial hung past
    its own clock), and once ``stop`` is set it is cancelled and ``Interrupted`` raised. ``on_poll()`` runs every
    ``poll_sec`` while it runs (the agent's heartbeat); ``check_sec`` is how often stop and the limit are checked."""
    polled, killed = time.monotonic(), False
    try:
        while True:
            remaining = check_sec if job.started is None else spec.limit + job.slack - (time.time() - job.started)
            if remaining <= 0:
                job.cancel()
                killed = True
                ended = job.poll(timeout=60.0) or Ended(None)
                break
            if stop is not None and stop.is_set():
                raise Interrupted(f"trial in {spec.trial_dir} ended: the agent is stopping")
            ended = job.poll(timeout=min(check_sec, remaining))
            if ended is not None:
                break
            if on_poll is not None and time.monotonic() - polled >= poll_sec:
                polled = time.monotonic()
                on_poll()
    except BaseException:
        # The agent itself is being stopped (Ctrl-C, ``stop``): do not leave the trial running behind it.
        job.cancel()
        raise
    wall = 0.0 if job.started is None else time.time() - job.started
    result = read_result(spec.trial_dir, ended.exit_code, objective_metric, wall)
    if killed:
        result.status, result.reason = (
            Status.TIMEOUT,
            f"killed by the agent's watchdog after {wall:.0f}s (budget + grace + margin = {spec.limit:.0f}s); "
            + result.reason,
        )
    elif ended.status is not None and ended.status != result.status:
        result.status, result.reason = (
            ended.status,
            f"{ended.reason}; {result.reason}" if result.reason else ended.reason,
        )
    if result.status != Status.OK:
        result.objective = None
    return result
