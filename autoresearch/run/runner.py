"""Run one trial as a subprocess and classify its end.

A trial is ``<command> <fixed overrides> <params> trial.dir=<dir>`` (``python -m core.train`` by default), built as
an argument list (never a shell string: parameter values can come from an LLM). It runs in its own process group
so that a watchdog can end it together with any workers it started. The trial enforces its own wall budget; the
watchdog only fires a little after that budget plus the trial's grace period, for a run that hangs past its own
clock (``core_adapter.watchdog_seconds``).

Whatever happens, the caller gets a ``TrialResult``: the summary when the trial wrote one, otherwise the exit
code (or signal) and the tail of stderr, so that a crash without a summary is still a recorded, typed outcome.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from autoresearch.core_adapter import DEFAULT_COMMAND, read_result, watchdog_seconds
from autoresearch.records import Status, TrialResult
from core.trial import fork_server
from core.trial.processes import kill_group

STOP_POLL_SEC = 0.2  # how soon a trial in a worker thread notices that the agent is stopping


class Interrupted(Exception):
    """The agent is stopping (``stop`` was set): the trial was ended, its outcome says nothing of its config."""


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

    ``timeout`` defaults to ``watchdog_seconds(overrides)``. ``on_start(pid)`` is called once the process exists
    (the agent records the pid so that a restarted agent can end an orphan); ``on_poll()`` every ``poll_sec``
    while it runs (the agent's heartbeat). Once ``stop`` is set (the agent was interrupted while this runs in a
    worker thread) the trial is ended and ``Interrupted`` raised.
    """
    trial_dir = Path(trial_dir)
    trial_dir.mkdir(parents=True, exist_ok=True)
    argv = [*command, *overrides, f"trial.dir={trial_dir}"]
    limit = watchdog_seconds(overrides) if timeout is None else timeout
    start = polled = time.monotonic()
    killed = False
    with open(trial_dir / "stdout.log", "wb") as out, open(trial_dir / "stderr.log", "wb") as err:
        # A new session = a new process group: the watchdog can end the trial and every worker it started.
        # fork_server.popen: forked from the agent's warm server (MindSpore already imported) when one runs.
        proc = fork_server.popen(
            argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True, env=env, cwd=cwd
        )
        try:
            if on_start is not None:
                on_start(proc.pid)
            while True:
                remaining = limit - (time.monotonic() - start)
                if remaining <= 0:
                    kill_group(proc.pid, proc)
                    killed = True
                    break
                if stop is not None and stop.is_set():
                    raise Interrupted(f"trial in {trial_dir} ended: the agent is stopping")
                try:
                    proc.wait(timeout=min(poll_sec, remaining, STOP_POLL_SEC if stop is not None else poll_sec))
                    break
                except subprocess.TimeoutExpired:
                    if on_poll is not None and time.monotonic() - polled >= poll_sec:
                        polled = time.monotonic()
                        on_poll()
        except BaseException:
            # The agent itself is being stopped (Ctrl-C, ``stop``): do not leave the trial running behind it.
            kill_group(proc.pid, proc)
            raise
    wall = time.monotonic() - start
    result = read_result(trial_dir, proc.returncode, objective_metric, wall)
    if killed:
        result.status, result.reason = (
            Status.TIMEOUT,
            (
                f"killed by the agent's watchdog after {wall:.0f}s (budget + grace + margin = {limit:.0f}s); "
                + result.reason
            ),
        )
    return result
