"""Resident memory of this rank: its peak from the kernel, and the device's own cap where it has one.

On Ascend the budget (``memory.limit_gb``) is MindSpore's device-memory cap and its allocator raises "Out of
Memory". On CPU the cap is ignored (docs/mindspore-cpu.md, "Memory": a process allocated far beyond a "1GB" cap) and
MindSpore's memory statistics read 0, so the kernel's figures are the measurement: VmHWM (the resident high-water
mark) and RSS from /proc. A budget then behaves like a device cap through a watchdog (``core.trial.watchdog``) plus
a check of VmHWM after every step, which catches a peak that came and went between two polls. The estimate of a
config's peak before it runs is ``core.memory.estimate``.
"""

from __future__ import annotations

import os

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def current_rss_bytes() -> int | None:
    """Resident set size now, from /proc/self/statm (cheap enough to poll every few ms)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return None


def peak_rss_bytes() -> int | None:
    """Resident high-water mark since start or the last ``reset_peak`` (VmHWM)."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to clear_refs). False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def apply_device_memory_limit(limit_gb: float | None, device: str) -> bool:
    """Give the device allocator its cap where it has one. Returns True if the device enforces it itself.

    CPU workaround: MindSpore's CPU allocator ignores ``max_device_memory``/``set_memory(max_size)``, so on CPU
    this returns False and the caller enforces the budget on RSS (``core.trial.watchdog``).
    """
    if limit_gb is None or device == "CPU":
        return False
    import mindspore as ms  # function-level: the supervisor and the agent import this module without MindSpore

    ms.runtime.set_memory(max_size=f"{limit_gb}GB")
    return True
