"""The watchdog: ends this rank from the side when its main thread cannot, with the trial's exit code and a
summary (memory over budget: exit 10; still running past the wall budget plus grace: exit 13; its supervisor gone,
say killed -9: exit 1, so that no rank outlives the supervisor that would have ended it).

CPU workaround: MindSpore's CPU allocator ignores its memory cap, so on CPU the budget is enforced on this rank's
resident memory (``core.memory.probe``), polled every ``interval`` seconds, and checked again after every step
against the high-water mark (a peak between two polls still counts).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from core.memory.probe import current_rss_bytes
from core.trial.contract import Exit, oom_reason

SUPERVISOR_CHECK_TICKS = 25  # whether the supervisor lives, every 25 intervals (0.5 s at the default 0.02 s)


class Watchdog(threading.Thread):
    """Ends this rank from the side when the main thread cannot: memory over budget (exit 10) or the run
    still alive ``grace`` seconds after its wall budget (exit 13, a hung step or a stuck collective)."""

    def __init__(
        self,
        on_fire: Callable[[Exit, str], None],
        *,
        limit_bytes: int | None = None,
        hard_deadline: float | None = None,
        supervisor_pid: int | None = None,
        interval: float = 0.02,
    ):
        super().__init__(name="trial-watchdog", daemon=True)
        self.on_fire, self.limit_bytes, self.hard_deadline, self.interval = (
            on_fire,
            limit_bytes,
            hard_deadline,
            interval,
        )
        self.supervisor_pid = supervisor_pid
        self._stop_event = threading.Event()

    def _supervisor_gone(self) -> bool:
        if self.supervisor_pid is None:
            return False
        try:
            os.kill(self.supervisor_pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def run(self) -> None:
        ticks = 0
        while not self._stop_event.wait(self.interval):
            ticks += 1
            if ticks % SUPERVISOR_CHECK_TICKS == 0 and self._supervisor_gone():
                self._fire(Exit.ERROR, f"this rank's supervisor (pid {self.supervisor_pid}) is gone; ended")
                return
            if self.limit_bytes is not None:
                resident = current_rss_bytes()
                if resident is not None and resident > self.limit_bytes:
                    self._fire(Exit.OOM, oom_reason("rank RSS", resident, self.limit_bytes))
                    return
            if self.hard_deadline is not None and time.time() > self.hard_deadline:
                self._fire(
                    Exit.TIMEOUT,
                    "timeout: the run was still going past its wall budget plus grace "
                    "(a hung step or collective); killed",
                )
                return

    def _fire(self, code: Exit, reason: str) -> None:
        try:
            self.on_fire(code, reason)
        finally:
            os._exit(int(code))

    def stop(self) -> None:
        self._stop_event.set()
