"""The step-time model on this machine (issue "Scale I"): ``cpu-local`` fitted on four fresh trials, every other
layout of the project's layout, pipeline and MoE benchmarks predicted and run, side by side in one run.

    .venv/bin/python benchmarks/perf_cpu.py [--steps 12] [--rounds 3]

The fit is ``core.perf.calibrate``'s (1-process runs in one micro-batch and in eight for the matmul efficiency
and the kernel launches; dp_replicate=2 and tp=2 for the collective bandwidth and latency) on trials run here, not
the cached calibration, so that fit and check share the machine's state. Each layout runs ``--rounds`` times, alternating, and its median step counts. Held out:
everything else. Reported: each layout's measured median step, the prediction, the
error; the median |error| and the Spearman rank correlation over the held-out layouts. A 4-rank layout runs two
ranks per core (``cluster.devices_per_node=4``: the host's rate shared four ways). Writes
``benchmarks/data/perf_cpu.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scipy.stats import spearmanr  # noqa: E402

from core.perf import estimate_step, planned_config  # noqa: E402
from core.perf.calibrate import BASE, LAYOUTS, START, fit, measure_layouts  # noqa: E402
from core.perf.device import calibration  # noqa: E402

HELD_OUT = {  # name -> (trial overrides, the cluster's devices per node)
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
    args = ap.parse_args()
    base = [o for o in BASE if not o.startswith("trial.max_steps")] + [f"trial.max_steps={args.steps}"]
    rows = {name: ([o for o in ov if not o.startswith("cluster.")], ov) for name, ov in LAYOUTS.items()}
    rows |= {name: (ov, [*ov, f"cluster.devices_per_node={n}"]) for name, (ov, n) in HELD_OUT.items()}
    measured = measure_layouts({name: trial for name, (trial, _) in rows.items()}, base, args.rounds)
    cached = calibration() or {}
    profile = fit(
        {k: measured[k] for k in LAYOUTS},
        {"memory_bandwidth_gbps": cached["memory_bandwidth_gbps"], **START},
    )
    sets = [f"cluster.{k}={v}" for k, v in profile.items()]
    lines = ["| layout | fitted? | measured step (ms) | predicted (ms) | error |", "|---|---|---:|---:|---:|"]
    errors, pairs = [], []
    for name, (_, planned) in rows.items():
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
    rho = spearmanr([m for m, _ in pairs], [p for _, p in pairs]).statistic
    summary = (
        f"fitted: {', '.join(f'{k} {v:.4g}' for k, v in profile.items())}\n\n"
        f"held-out layouts: {len(errors)}; median |error| {statistics.median(abs(e) for e in errors):.1%}, "
        f"worst {max(errors, key=abs):+.1%}; Spearman rank correlation {rho:.3f}"
    )
    head = (
        f"# Step-time model on this machine — {time.strftime('%Y-%m-%d')}, commit {git_commit()}, "
        f"{args.steps} steps per trial, median of {args.rounds} alternating rounds, model=small (MoE rows moe-small), global batch 8 x 64, jit (one fitted row pynative)\n"
    )
    text = "\n".join([head, summary, "", *lines]) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
