"""The step-time model on this machine (issue "Scale I"): ``cpu-local`` fitted on fresh 1-process trials, one
layout (tp=2) and the all-reduce micro-benchmark, every other layout of the project's layout, pipeline and MoE
benchmarks predicted and run, side by side in one run.

    .venv/bin/python benchmarks/perf_cpu.py [--steps 12] [--rounds 3]

The fit is ``core.perf.calibrate``'s (1-process runs in one micro-batch and in eight for the matmul efficiency
and the kernel launches, under PyNative for its dispatch, alone and two side by side for the host's cores;
all-reduces between two ranks for the link's bandwidth; tp=2 for a collective's cost per step in a trial) on trials
run here, not the cached calibration, so that fit and check share the machine's state. The rule for ranks that
outnumber the cores (``cluster.host_cores``) is checked on its own too: the micro-benchmark on four ranks against
the ring model at the 2-rank fit with the bandwidth shared. Each layout runs ``--rounds`` times, alternating, and its median step counts. Held out:
everything else. Reported: each layout's measured median step, the prediction, the
error; the median |error| and the Spearman rank correlation over the held-out layouts. A 4-rank layout runs two
ranks per core (``cluster.devices_per_node=4``: the host's rate shared four ways). Writes
``benchmarks/data/perf_cpu.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

from provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scipy.stats import spearmanr  # noqa: E402

from core.perf import collectives, estimate_step, links, planned_config  # noqa: E402
from core.perf.calibrate import (  # noqa: E402
    ALONE,
    BASE,
    LAYOUTS,
    LINK_RANKS,
    START,
    TOGETHER,
    copies,
    fit,
    host_cores,
    measure_layouts,
    measure_link,
)
from core.perf.device import device  # noqa: E402
from core.perf.micro import memory_bandwidth_gbps  # noqa: E402

STEPS_FILE = ROOT / "benchmarks" / "data" / "perf_cpu_steps.json"  # the last run's measured steps (--steps-from)
HELD_OUT = {  # name -> (trial overrides, the cluster's devices per node)
    "dp_replicate=2": (["parallel.dp_replicate=2"], 2),
    "dp_shard=2": (["parallel.dp_shard=2"], 2),
    "tp=2 sp": (["parallel.tp=2", "parallel.sp=true"], 2),
    "cp=2": (["parallel.cp=2"], 2),
    "pp=2 1f1b": (["parallel.pp=2", "training.micro_batch_size=2"], 2),
    "pp=2 gpipe": (["parallel.pp=2", "parallel.pp_schedule=gpipe", "training.micro_batch_size=2"], 2),
    "pp=2 interleaved v=2": (
        ["parallel.pp=2", "parallel.pp_schedule=interleaved", "parallel.pp_virtual=2", "training.micro_batch_size=2"],
        2,
    ),
    "hsdp 2x2": (["parallel.dp_replicate=2", "parallel.dp_shard=2"], 4),
    "tp=2 dp_shard=2": (["parallel.tp=2", "parallel.dp_shard=2"], 4),
    "cp=2 tp=2": (["parallel.cp=2", "parallel.tp=2"], 4),
    "moe-small 1 process": (["model=moe-small"], 1),
    "moe-small ep=2": (["model=moe-small", "parallel.ep=2", "parallel.dp_shard=2"], 2),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3, help="trials per layout, alternating; the median counts")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "data" / "perf_cpu.md")
    ap.add_argument(
        "--steps-from",
        type=Path,
        help="fit and predict from the measured steps a run saved (STEPS_FILE) instead of running the trials",
    )
    args = ap.parse_args()
    base = [o for o in BASE if not o.startswith("trial.max_steps")] + [f"trial.max_steps={args.steps}"]
    rows = {name: ([o for o in ov if not o.startswith("cluster.")], ov) for name, ov in LAYOUTS.items()}
    rows |= {name: (ov, [*ov, f"cluster.devices_per_node={n}"]) for name, (ov, n) in HELD_OUT.items()}
    if args.steps_from:
        measured = json.loads(args.steps_from.read_text())["median_step_sec"]
    else:  # saved before anything is fitted: a run's trials are its cost
        measured = measure_layouts({name: trial for name, (trial, _) in rows.items()}, base, args.rounds)
        saved = {"date": time.strftime("%Y-%m-%d %H:%M"), "commit": git_commit(), "median_step_sec": measured}
        STEPS_FILE.write_text(json.dumps(saved, indent=1) + "\n")
    cores = host_cores(measured)
    link = measure_link(cores, args.rounds)
    micro = link.pop("all_reduce")
    profile = fit(
        {k: measured[k] for k in LAYOUTS},
        {"memory_bandwidth_gbps": memory_bandwidth_gbps(), "host_cores": cores, **link, **START},
    )
    sets = [f"cluster.{k}={v}" for k, v in profile.items()]
    lines = [
        f"host_cores: {copies(TOGETHER)} x {measured[ALONE] * 1000:.0f} ms ({ALONE}) / "
        f"{measured[TOGETHER] * 1000:.0f} ms ({TOGETHER}) = {cores:.2f}",
        "",
        "| layout | fitted? | measured step (ms) | predicted (ms) | error |",
        "|---|---|---:|---:|---:|",
    ]
    errors, pairs = [], []
    for name, (_, planned) in rows.items():
        if name in (ALONE, TOGETHER):
            continue
        predicted = estimate_step(planned_config([*base, *planned, *sets])).step_time_sec
        error = predicted / measured[name] - 1
        fitted = name in LAYOUTS
        if not fitted:
            errors.append(error)
            pairs.append((measured[name], predicted))
        lines.append(
            f"| {name} | {'fitted' if fitted else 'held out'} | {measured[name] * 1000:.0f} | "
            f"{predicted * 1000:.0f} | {error:+.1%} |"
        )
    lines += ["", *_oversubscribed(base, sets, micro)]
    rho = spearmanr([m for m, _ in pairs], [p for _, p in pairs]).statistic
    summary = (
        f"fitted: {', '.join(f'{k} {v:.4g}' for k, v in profile.items())}\n\n"
        f"held-out layouts: {len(errors)}; median |error| {statistics.median(abs(e) for e in errors):.1%}, "
        f"worst {max(errors, key=abs):+.1%}; Spearman rank correlation {rho:.3f}"
    )
    head = (
        f"# Step-time model on this machine — {time.strftime('%Y-%m-%d')}, commit {git_commit()}, "
        f"{args.steps} steps per trial, median of {args.rounds} alternating rounds, model=small (MoE rows moe-small), global batch 8 x 64, jit (one fitted row PyNative)\n"
    )
    text = "\n".join([head, summary, "", *lines]) + "\n"
    args.out.write_text(text)
    print(text)


def _oversubscribed(base: list[str], sets: list[str], micro: dict) -> list[str]:
    """The all-reduce on 4 ranks measured against the ring model on the link ``core.perf.device`` builds for 4 ranks
    of this host from the fitted profile (``sets``) with the micro-benchmark's own latency: the device's host rule
    (``_host_share``, ``_host_run``) is what moves the 2-rank fit to 4 ranks, not a copy of it here."""
    n = 4
    four = collectives.measure(n)
    cfg = planned_config([*base, *sets])
    cores = cfg.cluster.host_cores
    # the micro-benchmark's latency per ring step was measured at 2 ranks; a profile's is one rank per core's
    latency = micro["latency_us"] / max(1.0, LINK_RANKS / cores)
    four_ranks = dataclasses.replace(cfg.cluster, devices_per_node=n, intra_node_latency_us=latency)
    link = device(four_ranks, cfg.training.precision).intra
    timings = micro["seconds"]
    out = [
        f"All-reduce micro-benchmark (host_cores {cores:.2f}): 4 ranks predicted from the 2-rank fit (held out); "
        f"ring latency {micro['latency_us']:.0f} us per step",
        "",
        "| bytes | 2 ranks (ms) | 4 ranks (ms) | 4 ranks predicted (ms) | error |",
        "|---:|---:|---:|---:|---:|",
    ]
    for nbytes, seconds in four.items():
        predicted = links.all_reduce(nbytes, n, link)
        out.append(
            f"| {nbytes} | {timings[str(nbytes)] * 1000:.2f} | {seconds * 1000:.2f} | {predicted * 1000:.2f} | "
            f"{predicted / seconds - 1:+.1%} |"
        )
    return out


if __name__ == "__main__":
    main()
