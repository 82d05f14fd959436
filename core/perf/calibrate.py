"""``python -m core.perf calibrate [--force] [--rounds 3]``: measure the ``cpu-local`` profile on this machine and
cache it, as the reference rate is cached (``core.runtime.reference_rate``; the same machine key). ``--micro``
runs only the micro-benchmarks (``core.perf.micro``, under a minute), which a study runs itself when this machine
has neither; this command's trials then fit what they cannot see, and its entry, where there is one, is used
instead of theirs (``core.perf.device.measured_numbers``).

What the profile leaves null is measured here, from two micro-benchmarks and real trials of ``model=small``
(global batch 8 x 64 tokens, jit, AdamW, 12 steps: the project's layout benchmark), each a ``python -m core.train``
process like any trial; one layout of more than one rank is fitted (tp=2), every other is held out:

    memory_bandwidth_gbps      an element-wise add of 2^24 floats under MindSpore, the fastest of 20 rounds
                               (two arrays read, one written)
    host_cores                 how many processes the host runs at full speed at once: a 1-process trial with one
                               thread per core this process may use, all at once, against one alone (copies x alone
                               / side by side; the 2-vCPU machines this project runs on measure 1.0-1.3: their vCPUs
                               share about one core's work)
    intra_node_bandwidth_gbps  all-reduces of 4 KiB to 16 MiB between two ranks (``core.perf.collectives``), the
                               ring model fitted to their times, as one rank with a core of its own would reach it
    matmul_efficiency          the 1-process trial: the efficiency at which core.perf predicts its median step
    launch_overhead_us         the 1-process trial in micro-batches of one sequence (8 micro-batches of 64 tokens:
                               mostly kernel launches), fitted jointly with the efficiency
    pynative_overhead_us       the 1-process trial under training.mode=pynative (each op dispatched from Python),
                               with the numbers above held
    intra_node_latency_us      the tp=2 trial (four all-reduces of a micro-batch's activations per block): what a
                               collective costs per ring step *inside a trial*, waits for its peer included. The
                               micro-benchmark's own (kept in the entry, ``all_reduce``) is ~0.2 ms; a
                               trial's is ~15 times that, because a peer that shares the cores arrives late

The four numbers are fitted together (``core.perf.fit``, the fit a study runs on its own runs as they land), each
layout identifying one. A number that stops at its bound leaves its layout unreproduced: the entry lists it
(``not_reproduced``) and a warning names it. The 1-process trial beating the
reference rate at full efficiency means the rate was measured under load (the fastest of its runs, and load only
slows a run): it is measured again, the higher kept, up to twice; then the calibration stops without caching,
saying to measure on an idle machine, since every prediction scales with that number.

The trials run ``--rounds`` times, alternating, and each layout's median step counts: one trial's median step
moved by up to 45% between runs minutes apart on this shared machine (benchmarks/RESULTS.md, "Step-time model").
Every other layout is held out (``benchmarks/perf_cpu.py`` checks them). The reference rate is measured
first when this machine has none. MindSpore runs only in the child processes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core.config import TrainConfig
from core.perf import collectives, micro
from core.perf import fit as perf_fit
from core.perf.device import CALIBRATION_METHOD, GBPS, US, calibration, calibration_path, store
from core.perf.step import estimate_step, planned_config
from core.runtime.reference_rate import cache_path as reference_cache
from core.runtime.reference_rate import machine_key, reference_flops_per_sec

# The calibration trials: the layout benchmark's setting (benchmarks/layouts.py).
BASE = [
    "model=small",
    "training.global_batch_size=8",
    "training.seq_len=64",
    "trial.max_steps=12",
    "training.eval_batches=1",
]
ALONE, TOGETHER = "1 process, 1 thread", "a process per core at once, 1 thread each"
LAYOUTS = {
    "1 process": [],
    "1 process, micro 1": ["training.micro_batch_size=1"],
    "1 process, pynative": ["training.mode=pynative"],
    "tp=2": ["parallel.tp=2", "cluster.devices_per_node=2"],
    ALONE: ["execution.kernel_threads=1"],  # a rank's share when ranks are as many as cores (core.runtime.settings)
    TOGETHER: ["execution.kernel_threads=1"],  # as many independent trials at once as copies() says
}
# The layouts whose steps the fit reproduces, each named for the number it identifies (core.perf.fit); the others
# measure host_cores.
PREDICTED = {
    "1 process": "matmul_efficiency",
    "1 process, micro 1": "launch_overhead_us",
    "1 process, pynative": "pynative_overhead_us",
    "tp=2": "intra_node_latency_us",
}
LINK_RANKS = 2  # the collective micro-benchmark's ranks
# A fitted layout whose prediction misses its measured step by more than this share is not reproduced.
REPRODUCED = 0.01
REMEASURES = 2
# Where the fitted numbers start (any positive value: the fit is linear in their scales): about this machine's.
START = {
    "matmul_efficiency": 1.0,
    "launch_overhead_us": 1000.0,
    "pynative_overhead_us": 10000.0,
    "intra_node_latency_us": 1000.0,
}


def run_trial(overrides: list[str], out: Path) -> dict:
    """One real trial through the CLI; its summary (a trial that did not end ok stops the calibration)."""
    return run_trials(overrides, [out])[0]


def run_trials(overrides: list[str], outs: list[Path]) -> list[dict]:
    """One real trial per directory of ``outs``, all at once; their summaries."""
    command = [sys.executable, "-m", "core.train", *overrides]
    procs = [
        subprocess.Popen([*command, f"trial.dir={out}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for out in outs
    ]
    for proc in procs:
        proc.wait()
    summaries = [json.loads((out / "trial_summary.json").read_text()) for out in outs]
    for summary in summaries:
        if summary["exit_code"] != 0:  # 0: the trial contract's ok (core.trial.contract, a layer above this one)
            raise SystemExit(f"calibration trial {overrides} ended {summary['status']}: {summary['reason']}")
    return summaries


def _config(name: str, profile: dict[str, float]) -> TrainConfig:
    return planned_config([*BASE, *LAYOUTS[name], *(f"cluster.{k}={v}" for k, v in profile.items())])


def fit(measured: dict[str, float], profile: dict[str, float]) -> dict[str, float]:
    """The profile with its fitted numbers (``core.perf.fit``, started at ``profile``'s) from the calibration
    runs' measured median steps (seconds; ``LAYOUTS``). A number that stops at its bound holds there and its layout
    is set aside, the others fitted again without it: a layout the model cannot reach (a tp=2 trial faster than
    predicted with no latency at all, as on a host with two real cores) would otherwise pull every other number
    off its own layout."""
    names, profile = list(PREDICTED), dict(profile)
    while True:
        runs = [(perf_fit.shares(_config(name, profile)), measured[name]) for name in names]
        held = tuple(key for name, key in PREDICTED.items() if name not in names)
        fitted = {**profile, **perf_fit.fit(runs, profile, held)}
        stopped = {n: b for n in names if (b := perf_fit.bound_at(PREDICTED[n], fitted[PREDICTED[n]])) is not None}
        if not stopped or len(stopped) == len(names):
            return fitted
        for name, bound in stopped.items():
            names.remove(name)
            profile[PREDICTED[name]] = bound


def not_reproduced(measured: dict[str, float], profile: dict[str, float]) -> dict[str, str]:
    """The fitted layouts whose prediction through ``profile`` misses their measured step, each with why."""
    missed = {}
    for name, key in PREDICTED.items():
        predicted = estimate_step(_config(name, profile)).step_time_sec
        if abs(predicted - measured[name]) > REPRODUCED * measured[name]:
            where = "at its bound " if perf_fit.bound_at(key, profile[key]) is not None else ""
            missed[name] = (
                f"cluster.{key} stopped {where}{profile[key]:g}: predicted {predicted * 1000:.1f} ms per step, "
                f"measured {measured[name] * 1000:.1f} ms"
            )
    return missed


def copies(name: str) -> int:
    """How many trials of calibration layout ``name`` run at once: for TOGETHER one per core this process may use
    (their median step counts), else one."""
    return len(os.sched_getaffinity(0)) if name == TOGETHER else 1


def host_cores(measured: dict[str, float]) -> float:
    """Processes the host runs at full speed at once (``cluster.host_cores``), from the side-by-side trials:
    copies x alone / side by side, at least 1 and at most the copies."""
    n = copies(TOGETHER)
    return min(max(n * measured[ALONE] / measured[TOGETHER], 1.0), n)


def measure_link(cores: float, rounds: int = 3) -> dict:
    """The all-reduce micro-benchmark on LINK_RANKS ranks, each size's median over ``rounds`` runs (kept): the
    ring's bandwidth as a rank with ``cores`` to itself reaches it (``core.perf.device`` shares it when ranks
    outnumber the cores), and its own latency per step (recorded, not the profile's: see the module docstring).
    One run is not enough: two runs minutes apart fitted 0.63 and 0.56 GB/s."""
    runs = [collectives.measure(LINK_RANKS) for _ in range(rounds)]
    times = {size: statistics.median(run[size] for run in runs) for size in runs[0]}
    latency, bandwidth = collectives.ring_fit(times, LINK_RANKS)
    return {
        "intra_node_bandwidth_gbps": bandwidth * max(1.0, LINK_RANKS / cores) / GBPS,
        "all_reduce": {"latency_us": latency / US, "seconds": {str(k): v for k, v in times.items()}},
    }


def measure_layouts(layouts: dict[str, list[str]], base: list[str], rounds: int) -> dict[str, float]:
    """Each layout's median step (seconds) over ``rounds`` real trials, the layouts alternating within a round so
    that load on a shared machine hits them alike (``copies`` of a layout at once: their median)."""
    steps: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for i, (name, overrides) in enumerate(layouts.items()):
                trial = [o for o in overrides if not o.startswith("cluster.")]
                outs = [Path(tmp) / f"{i}_{r}_{c}" for c in range(copies(name))]
                medians = [s["metrics"]["step_time_ms_median"] / 1000 for s in run_trials([*base, *trial], outs)]
                steps.setdefault(name, []).append(statistics.median(medians))
                print(f"  {name} #{r + 1}: {steps[name][-1] * 1000:.0f} ms per step", file=sys.stderr)
    return {name: statistics.median(values) for name, values in steps.items()}


def calibrate(force: bool = False, rounds: int = 3) -> dict:
    entry = calibration()
    if entry and not force:
        return entry
    reference_flops_per_sec("CPU")  # measured (in child processes) when this machine has none
    measured = measure_layouts(LAYOUTS, BASE, rounds)
    cores = host_cores(measured)
    link = measure_link(cores, rounds)
    all_reduce = link.pop("all_reduce")
    profile = {"memory_bandwidth_gbps": micro.memory_bandwidth_gbps(), "host_cores": cores, **link, **START}
    for attempt in range(REMEASURES + 1):
        fitted = fit(measured, dict(profile))
        missed = not_reproduced(measured, fitted)
        if "1 process" not in missed:
            break
        why = f"calibration not cached: the 1-process trial is not reproduced ({missed['1 process']})"
        if not math.isclose(fitted["matmul_efficiency"], 1.0, rel_tol=1e-6):  # not the reference rate's doing:
            # nothing to measure again
            raise SystemExit(why)
        if attempt == REMEASURES:
            raise SystemExit(
                f"{why}. At full efficiency it beats this machine's reference rate ({reference_cache()}), which "
                "was measured under load: on an idle machine run `python -m core.reference_rate --force`, then "
                "calibrate again"
            )
        print("the 1-process trial beats the reference rate: measuring the rate again", file=sys.stderr)
        reference_flops_per_sec("CPU", force=True, keep_higher=True)
    for name, why in missed.items():
        print(f"warning: the calibration does not reproduce {name!r}: {why}", file=sys.stderr)
    entry = {
        **fitted,
        "measured_step_sec": measured,
        "all_reduce": all_reduce,
        "not_reproduced": missed,
        "method": CALIBRATION_METHOD,
        "date": time.strftime("%Y-%m-%d"),
    }
    store(calibration_path(), entry)
    return entry


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m core.perf calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="measure again even when this machine has an entry")
    ap.add_argument("--rounds", type=int, default=3, help="trials per layout; the median counts (default 3)")
    ap.add_argument(
        "--micro",
        action="store_true",
        help="the micro-benchmarks alone (core.perf.micro: under a minute, no trial), as a study runs them itself",
    )
    args = ap.parse_args(argv)
    if args.micro:
        entry, _ = micro.cached(args.force)
        print(json.dumps({machine_key("CPU"): entry}, indent=2))
        return 0
    entry = calibrate(args.force, args.rounds)
    print(json.dumps({machine_key("CPU"): entry}, indent=2))
    return 0
