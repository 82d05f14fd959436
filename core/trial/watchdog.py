"""The watchdog: ends this rank from the side when its main thread cannot, with the trial's exit code and a
summary (memory over budget: exit 10; still running past the wall budget plus grace: exit 13).

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


class Watchdog(threading.Thread):
    """Ends this rank from the side when the main thread cannot: memory over budget (exit 10) or the run
    still alive ``grace`` seconds after its wall budget (exit 13, a hung step or a stuck collective)."""

    def __init__(
        self,
        on_fire: Callable[[Exit, str], None],
        *,
        limit_bytes: int | None = None,
        hard_deadline: float | None = None,
        interval: float = 0.02,
    ):
        super().__init__(name="trial-watchdog", daemon=True)
        self.on_fire, self.limit_bytes, self.hard_deadline, self.interval = (
            on_fire,
            limit_bytes,
            hard_deadline,
            interval,
        )
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
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
