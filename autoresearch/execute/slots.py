"""Slots for concurrent trials (``--workers K``): each running trial gets its own share of the machine.

Trials that share cores or devices measure each other: a throughput study would learn the contention, not the
config. So slot i gets disjoint resources, and a trial sizes itself to what it was given:

- CPU: the cores this agent may use (its affinity) split into K equal sets; the trial runs under
  ``taskset -c <set>`` and the core splits that set among its ranks (``core.runtime.settings._cpu_share``).
- Ascend: ``world_size`` devices per slot through ``ASCEND_RT_VISIBLE_DEVICES`` (slot i: devices
  i*world_size ... (i+1)*world_size - 1). Written to the runtime's documented variable; not run on an NPU here.

One worker needs no slot: the trial gets the whole machine, as it always did.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Slot:
    index: int
    label: str  # shown in the trial's line, e.g. "cores 2-3"
    prefix: tuple[str, ...] = ()  # put before the trial command
    env: dict = field(default_factory=dict)  # added to the trial's environment


def _available_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def _ranges(cores: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (taskset's list syntax)."""
    parts, start = [], None
    for i, c in enumerate(cores):
        if start is None:
            start = c
        if i + 1 == len(cores) or cores[i + 1] != c + 1:
            parts.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ",".join(parts)


def make_slots(workers: int, device: str = "CPU", world_size: int = 1, cores: list[int] | None = None) -> list[Slot]:
    """K slots, or a SystemExit that says why K does not fit and what to do instead."""
    if workers < 1:
        raise SystemExit(f"--workers must be at least 1 (got {workers})")
    if workers == 1:
        return [Slot(0, "")]
    if device == "CPU":
        cores = _available_cores() if cores is None else cores
        per = len(cores) // workers
        if per < 1:
            raise SystemExit(
                f"--workers {workers}: this agent may use {len(cores)} CPU core(s), fewer than one per "
                f"concurrent trial; use --workers {len(cores)} or fewer"
            )
        taskset = shutil.which("taskset")
        if taskset is None:
            raise SystemExit(
                f"--workers {workers} pins each trial to its own cores with taskset, which is not on "
                "PATH (util-linux); install it or use --workers 1"
            )
        slots = []
        for i in range(workers):
            mine = _ranges(cores[i * per : (i + 1) * per])
            slots.append(Slot(i, f"cores {mine}", (taskset, "-c", mine)))
        return slots
    if device == "Ascend":
        return [
            Slot(i, f"devices {ids}", env={"ASCEND_RT_VISIBLE_DEVICES": ids})
            for i in range(workers)
            for ids in [",".join(str(d) for d in range(i * world_size, (i + 1) * world_size))]
        ]
    raise SystemExit(f"--workers {workers}: no way to give each trial its own {device} resources; use --workers 1")
