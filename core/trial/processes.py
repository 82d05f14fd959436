"""Ending a process group: a trial and every worker it started run in one session (``start_new_session``), so one
signal to the group reaches them all. The supervisor kills its ranks at once; the agent's runner asks a trial to
stop (SIGTERM: its supervisor still writes a summary) and then kills what is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

KILL_WAIT_SEC = 5.0  # between SIGTERM and SIGKILL


def kill_group(pgid: int, proc=None, *, term_wait: float | None = None) -> None:
    """End process group ``pgid``: SIGTERM, then SIGKILL whatever is left after ``term_wait`` seconds (None:
    ``KILL_WAIT_SEC``; 0: SIGKILL at once).

    ``proc`` (a ``subprocess.Popen`` or ``core.trial.fork_server.WarmProcess``) is the leader when it is the
    caller's child, so that it is waited for, not left a zombie; without it (an orphan of a dead agent) the group
    is polled until it is gone.
    """
    term_wait = KILL_WAIT_SEC if term_wait is None else term_wait
    for sig in (signal.SIGTERM, signal.SIGKILL) if term_wait > 0 else (signal.SIGKILL,):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + term_wait
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
