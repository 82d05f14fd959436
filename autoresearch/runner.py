"""Run one trial as a subprocess and read what it left behind (DESIGN §3.2–3.4).

A trial is ``python -m core.train <fixed overrides> <params> trial.dir=<dir>``, built as an argument list (never
a shell string: parameter values can come from an LLM). It runs in its own process group so that a watchdog can
end it together with any workers it started. The trial enforces its own wall budget; the watchdog only fires a
little after that budget plus the trial's grace period, for a run that hangs past its own clock.

Whatever happens, the caller gets a ``TrialResult``: the summary when the trial wrote one, otherwise the exit
code (or signal) and the tail of stderr, so that a crash without a summary is still a recorded, typed outcome.
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from autoresearch.outcomes import EXIT_STATUS, TrialResult
from core.trial import fork_server as warm

DEFAULT_COMMAND: tuple[str, ...] = (sys.executable, "-m", "core.train")

# Used when the overrides give no wall budget: a trial bounded only by steps still must not hang forever.
DEFAULT_WALL_SEC = 3600.0
DEFAULT_GRACE_SEC = 30.0  # core.config.TrialConfig.grace_sec
KILL_WAIT_SEC = 5.0  # between SIGTERM and SIGKILL of the trial's process group
STOP_POLL_SEC = 0.2  # how soon a trial in a worker thread notices that the agent is stopping
STDERR_TAIL_CHARS = 2000


class Interrupted(Exception):
    """The agent is stopping (``stop`` was set): the trial was ended, its outcome says nothing of its config."""


def override_value(overrides: Sequence[str], key: str) -> str | None:
    """The last value given for ``key`` in ``key=value`` overrides (Hydra: the last one wins)."""
    value = None
    for item in overrides:
        k, sep, v = item.lstrip("+").partition("=")
        if sep and k == key:
            value = v
    return value


def _float_or(text: str | None, default: float | None) -> float | None:
    try:
        return float(text) if text not in (None, "", "null", "None") else default
    except ValueError:
        return default


def watchdog_seconds(overrides: Sequence[str]) -> float:
    """How long to let a trial run: its own wall budget and grace, plus a margin for start-up and writing."""
    wall = _float_or(override_value(overrides, "trial.max_wall_time_sec"), None) or DEFAULT_WALL_SEC
    grace = _float_or(override_value(overrides, "trial.grace_sec"), DEFAULT_GRACE_SEC)
    return wall + grace + max(10.0, 0.1 * wall)


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
        # warm.popen: forked from the agent's warm server (MindSpore already imported) when one runs, else Popen.
        proc = warm.popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True, env=env,
                          cwd=cwd)
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
        result.status, result.reason = "timeout", (
            f"killed by the agent's watchdog after {wall:.0f}s (budget + grace + margin = {limit:.0f}s); "
            + result.reason)
    return result


def kill_group(pgid: int, proc: subprocess.Popen | warm.WarmProcess | None = None) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left of it after ``KILL_WAIT_SEC``.

    ``proc`` is the leader when it is our child (so that it is waited for, not left a zombie); without it
    (an orphan of a dead agent) the group is polled until it is gone.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + KILL_WAIT_SEC
        while time.monotonic() < deadline:
            if proc is not None:
                try:
                    proc.wait(timeout=deadline - time.monotonic())
                except subprocess.TimeoutExpired:
                    pass
                break  # leader gone; workers of its group may linger, so SIGKILL the group anyway
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def read_result(trial_dir: str | Path, exit_code: int | None, objective_metric: str | None = None,
                wall_time: float | None = None) -> TrialResult:
    """Build a TrialResult from a trial directory and the process's exit code (None when unknown)."""
    trial_dir = Path(trial_dir)
    summary = load_summary(trial_dir / "trial_summary.json")
    if summary is not None:
        status = str(summary.get("status") or EXIT_STATUS.get(summary.get("exit_code"), "error"))
        reason = str(summary.get("reason") or "")
        wall = summary.get("wall_time_sec") if wall_time is None else wall_time
    else:
        status, reason = _classify_without_summary(exit_code)
        tail = stderr_tail(trial_dir)
        if tail:
            reason = f"{reason}; stderr tail: {tail}"
        wall = wall_time
    objective = _objective(summary, objective_metric) if status == "ok" else None
    return TrialResult(status=status, exit_code=exit_code, reason=reason, summary=summary, objective=objective,
                       wall_time=float(wall or 0.0), trial_dir=trial_dir)


def load_summary(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # missing, or torn by a crash mid-write (the core writes atomically, a fake might not)
    return data if isinstance(data, dict) else None


def _classify_without_summary(exit_code: int | None) -> tuple[str, str]:
    if exit_code is None:
        return "error", "no trial_summary.json and no exit code"
    if exit_code < 0:
        name = signal.Signals(-exit_code).name if -exit_code in signal.Signals._value2member_map_ else -exit_code
        hint = " (possibly the host's OOM killer)" if exit_code == -signal.SIGKILL else ""
        return "error", f"killed by signal {name}{hint}; no trial_summary.json"
    status = EXIT_STATUS.get(exit_code, "error")
    if status == "ok":
        return "error", "exited 0 but wrote no trial_summary.json"
    return status, f"exited {exit_code} ({status}) without writing trial_summary.json"


def stderr_tail(trial_dir: Path, limit: int = STDERR_TAIL_CHARS) -> str:
    try:
        with open(trial_dir / "stderr.log", "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _objective(summary: dict | None, metric: str | None) -> float | None:
    if summary is None or metric is None:
        return None
    value = (summary.get("metrics") or {}).get(metric)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def estimate_with_core(overrides: Sequence[str]) -> int | None:
    """Per-rank memory estimate of a config from the core's analytic model, without MindSpore or a run.

    None when the core cannot estimate it (e.g. the config is invalid: the trial itself will say why). Cached in
    the process: composing the Hydra config takes ~0.1 s, and a proposer may rank hundreds of configs.
    """
    return _estimate(tuple(overrides))


@functools.lru_cache(maxsize=8192)
def _estimate(overrides: tuple[str, ...]) -> int | None:
    from core.config import ConfigError, load_config  # light: hydra + dataclasses, no MindSpore
    from core.memory import estimate_memory_bytes

    try:
        return int(estimate_memory_bytes(load_config(list(overrides))))
    except (ConfigError, ValueError):
        return None
