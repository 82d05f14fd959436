"""Run one trial on this machine and classify its end: ``run_trial``, the local executor
(``autoresearch.execute.local``) without a study around it, for tools and tests that run one trial.

A trial is ``<command> <fixed overrides> <params> trial.dir=<dir>`` (``python -m core.train`` by default), built as
an argument list (never a shell string: parameter values can come from an LLM). It runs in its own process group
so that a watchdog can end it together with any workers it started. The trial enforces its own wall budget; the
watchdog only fires a little after that budget plus the trial's grace period, for a run that hangs past its own
clock (``core_adapter.watchdog_seconds``).

Whatever happens, the caller gets a ``TrialResult``: the summary when the trial wrote one, otherwise the exit
code (or signal) and the tail of stderr, so that a crash without a summary is still a recorded, typed outcome.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from autoresearch.core_adapter import DEFAULT_COMMAND, watchdog_seconds
from autoresearch.execute.base import Interrupted, Resources, TrialSpec, wait
from autoresearch.execute.local import LocalExecutor
from autoresearch.execute.slots import Slot
from autoresearch.records import TrialResult

__all__ = ["Interrupted", "run_trial"]


def run_trial(
    overrides: Sequence[str],
    trial_dir: str | Path,
    *,
    command: Sequence[str] = DEFAULT_COMMAND,
    objective_metric: str | None = None,
    timeout: float | None = None,
    on_start: Callable[[int], None] | None = None,
    on_poll: Callable[[], None] | None = None,
    poll_sec: float = 30.0,
    env: dict | None = None,
    cwd: str | Path | None = None,
    stop: threading.Event | None = None,
) -> TrialResult:
    """Run ``[*command, *overrides, trial.dir=<trial_dir>]`` and classify its end.

    ``timeout`` defaults to ``watchdog_seconds(overrides)``. ``on_start(pid)`` is called once the process exists;
    ``on_poll()`` every ``poll_sec`` while it runs. Once ``stop`` is set (the caller is stopping while this runs in
    a worker thread) the trial is ended and ``Interrupted`` raised.
    """
    trial_dir = Path(trial_dir)
    trial_dir.mkdir(parents=True, exist_ok=True)
    spec = TrialSpec(
        argv=(*command, *overrides, f"trial.dir={trial_dir}"),
        trial_dir=trial_dir,
        name=trial_dir.name,
        resources=Resources(),
        limit=watchdog_seconds(overrides) if timeout is None else timeout,
        env=env,
        cwd=None if cwd is None else Path(cwd),
    )
    job = LocalExecutor().start(spec, Slot(0, ""))
    if on_start is not None:
        try:
            on_start(job.proc.pid)
        except BaseException:
            job.cancel()
            raise
    return wait(job, spec, objective_metric=objective_metric, stop=stop, on_poll=on_poll, poll_sec=poll_sec)
