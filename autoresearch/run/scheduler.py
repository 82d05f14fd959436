"""How trials run side by side: the main thread chooses, checks and tells; worker threads (``--workers``, one by
default) only wait for their trial's process, each in a slot of its own (``autoresearch.execute.slots``).

``drive(work, slots)`` fills every free slot with the next trial that should run, waits for one to end, hands its
result back, and repeats until the work says stop or has nothing left. It knows nothing of studies: the session
(``autoresearch.run.session``) is the ``Work`` that decides what runs and what an end means.
"""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Protocol

from autoresearch.execute.base import Interrupted
from autoresearch.execute.slots import Slot
from autoresearch.records import Status


class Exhausted(Exception):
    """The work has nothing left to run; the message says why."""


SKIPPED = object()  # what ``Work.next`` returns for a proposal it recorded without running: it costs no slot


class Work(Protocol):
    def next(self) -> Any:
        """The next item to run, or SKIPPED (one was proposed and recorded without running: the stop reasons are
        asked again); raises Exhausted when there is none."""

    def run(self, item: Any, slot: Slot, stop: threading.Event) -> Any:
        """Run ``item`` in ``slot`` (a worker thread); end it when ``stop`` is set."""

    def done(self, item: Any, result: Any, slot: Slot) -> None:
        """``item`` ended with ``result`` (the main thread)."""

    def stop_reason(self, running: int) -> str:
        """Why no further item should start ("" to go on); ``running`` items will count once they end."""

    def failure(self) -> str:
        """Why the work must stop as failed (say, errors in a row: the exit code is 1), or ""."""

    def abandon(self, running: list) -> None:
        """After Ctrl-C: the worker threads ended their items; record them as abandoned."""


def drive(work: Work, slots: list[Slot]) -> tuple[str, int]:
    """Run ``work`` in ``slots`` until it stops; (why, exit code: 0, 1 on a failure, 130 on Ctrl-C)."""
    stop = threading.Event()  # set on Ctrl-C / SIGTERM: worker threads end their items
    running: dict[Future, tuple[Any, Slot]] = {}
    free = list(reversed(slots))
    pool = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="trial")
    hard, code = "", 0  # a stop that no item's end can undo: nothing left to run, or a failure
    try:
        while True:
            why = hard  # otherwise asked again: a running trial that errs does not count toward --trials
            while free and not why:
                why = work.stop_reason(len(running))
                if why:
                    break
                try:
                    item = work.next()
                except Exhausted as exc:
                    why = hard = str(exc)
                    break
                if item is SKIPPED:
                    continue
                slot = free.pop()
                running[pool.submit(work.run, item, slot, stop)] = (item, slot)
            if not running:
                return why, code
            finished, _ = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
            for future in finished:
                item, slot = running.pop(future)
                free.append(slot)
                work.done(item, future.result(), slot)
            if not hard and (failed := work.failure()):
                hard, code = failed, 1
    except KeyboardInterrupt:
        stop.set()
        for future in running:  # each worker ends its trial; wait for them before recording it
            try:
                future.result()
            except Interrupted:
                pass
        work.abandon([item for item, _ in running.values()])
        return str(Status.INTERRUPTED), 130
    finally:
        pool.shutdown(wait=True)
