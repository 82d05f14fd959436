"""The fixed denominator of MFU: the best fp32 matmul rate on this machine, measured once and cached.

    python -m core.reference_rate [--device CPU] [--force]     # measure now (idle machine), print the cache entry

MFU = achieved model FLOP/s / (reference rate x the units the trial used). Measured per trial, the denominator
moved with whatever else the machine was doing, so MFU of two trials could not be compared (nor used as an
objective). Here it is measured once per machine and kept in ``reference_rate.json`` of the project's cache
(``core.runtime.cache_dirs``), keyed by the device, the CPU model, core count and SIMD flags, the MindSpore and
NumPy versions (a new BLAS may be faster: a new entry) and the method of measuring (``METHOD``).

The rate is the best of MindSpore's and NumPy's (OpenBLAS) fp32 2048 x 2048 matmul, each the fastest of 10 runs
after 30 warm-ups (MindSpore's CPU kernels tune their thread count over their first ~25 runs,
docs/mindspore-cpu.md), each in a fresh process of its own allowed every core, as this environment configures the
libraries (an ``OPENBLAS_CORETYPE`` pin, say, is respected) and as a trial runs them (MindSpore with a trial's
host-queue setting, ``core.runtime.settings``). The fastest run, not the median: other load only slows a run,
while the median moved by a third between back-to-back measurements on an idle machine (benchmarks/RESULTS.md,
"The host pipeline", **MFU and its reference**). Units: on CPU one unit is a host (its ranks share its cores), on an
accelerator one device (the rate of one device is measured).

The first trial on a machine measures it (a few seconds, after its timed steps) while holding a file lock, so
that concurrent trials wait rather than measure each other's load; ``autoresearch.agent`` measures it before it
starts trials.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import re
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

from core.runtime.cache_dirs import cache_root
from core.runtime.files import write_atomic

SIZE, WARMUP, REPEATS = 2048, 30, 10
# 2: NumPy measured on every core (an entry measured by a trial before could hold NumPy on one: _measure_in_child)
METHOD = 2


def cache_path() -> Path:
    return cache_root() / "reference_rate.json"


def cpu_model_and_flags() -> tuple[str, set[str]]:
    """The CPU's model name and feature flags from /proc/cpuinfo (benchmarks name them beside every figure too)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU", set()
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    return (model[1].strip() if model else "unknown CPU"), set(flags[1].split() if flags else ())


def machine_key(device: str) -> str:
    """What the rate depends on: device, CPU model, cores, SIMD flags, library versions, and how it is measured
    (``METHOD``)."""
    model, have = cpu_model_and_flags()
    flags = ",".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in have)
    libraries = f"mindspore {version('mindspore')}|numpy {version('numpy')}"
    return f"{device}|{model}|{os.cpu_count()} cores|{flags}|{libraries}|method {METHOD}"


def _best_rate(matmul, a, size: int) -> float:
    for _ in range(WARMUP):
        matmul(a)
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        matmul(a)
        times.append(time.perf_counter() - t0)
    return 2 * size**3 / min(times)


def measure(library: str, device: str, size: int = SIZE) -> float:
    """FLOP/s of ``library``'s (mindspore | numpy) fp32 size x size matmul in this process, on every core.

    One library per process: once MindSpore is loaded its idle kernel threads take CPU time from OpenBLAS's (NumPy
    at half its rate beside it)."""
    try:  # a trial of the agent's --workers runs under taskset: the reference is the whole machine's
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except (AttributeError, OSError):
        pass
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    if library == "numpy":
        return _best_rate(lambda x: x @ x, a, size)
    import mindspore as ms  # function-level: only the child that measures MindSpore loads it

    from core.runtime.settings import set_host_pipeline  # function-level: imports MindSpore, as above

    ms.set_device(device)
    set_host_pipeline(device)
    return _best_rate(lambda x: (x @ x).asnumpy(), ms.Tensor(a), size)


def _measure_in_child(library: str, device: str) -> float:
    # Without OMP_NUM_THREADS, which a trial sets for MindSpore (core.runtime.native_env; MindSpore's import sets it
    # too, below Python, for every process it starts): NumPy's OpenBLAS reads it and would use one core.
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run(
        [sys.executable, "-m", "core.runtime.reference_rate", "--device", device, "--child", library, str(SIZE)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    return float(out.stdout.strip().splitlines()[-1])


def reference_flops_per_sec(device: str = "CPU", force: bool = False, keep_higher: bool = False) -> float:
    """The cached reference rate for this machine (FLOP/s); measured in a fresh process the first time, or again
    with ``force``. ``keep_higher``: of the new and the cached measurement the higher stands (load only slows a
    run: a rate that turned out below what a trial achieved was measured under load)."""
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = machine_key(device)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one measurement at a time; the others then read it
        entries = json.loads(path.read_text()) if path.exists() else {}
        if force or key not in entries:
            # on an accelerator the host's BLAS is not the device's peak
            rates = {
                lib: _measure_in_child(lib, device)
                for lib in (("mindspore", "numpy") if device == "CPU" else ("mindspore",))
            }
            before = entries.get(key) if keep_higher else None
            if before and before["flops_per_sec"] >= max(rates.values()):
                return float(before["flops_per_sec"])
            entries[key] = {
                "flops_per_sec": max(rates.values()),
                "rates": rates,
                "size": SIZE,
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            write_atomic(path, json.dumps(entries, indent=1))
    return float(entries[key]["flops_per_sec"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="CPU")
    ap.add_argument("--force", action="store_true", help="measure again even if this machine has an entry")
    ap.add_argument("--child", nargs=2, metavar=("LIBRARY", "SIZE"), help=argparse.SUPPRESS)  # measure, print
    args = ap.parse_args(argv)
    if args.child:
        print(measure(args.child[0], args.device, int(args.child[1])))
        return 0
    rate = reference_flops_per_sec(args.device, force=args.force)
    print(f"{machine_key(args.device)}: {rate / 1e9:.0f} GFLOP/s ({cache_path()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
