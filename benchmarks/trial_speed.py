"""Trial speed, measured through the real CLI, side by side in one run (issue "Training core v1", Measure).

    .venv/bin/python benchmarks/trial_speed.py [--steps 12] [--repeats 2]

1. ``model=small``: median step time and tokens/s with ``training.mode=jit`` vs ``pynative``, and MFU against
   MindSpore's own fp32 matmul rate, which every trial measures at its end (``metrics.matmul_flops_per_sec``).
2. Process start to the end of the first step (``startup_sec``), ``model=tiny`` on 1 and on 2 ranks.

Runs alternate between the variants so that load on this shared machine hits both alike; medians over repeats.
Prints a markdown table with date and commit, for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]

VARIANTS = {
    "small jit": ["model=small", "training.mode=jit"],
    "small pynative": ["model=small", "training.mode=pynative"],
    "tiny 1 rank": ["model=tiny"],
    "tiny 2 ranks (dp)": ["model=tiny", "parallel.dp_replicate=2"],
}


def run(overrides: list[str], steps: int, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "core.train", *overrides, f"trial.max_steps={steps}", f"trial.dir={out}"],
                   cwd=ROOT, capture_output=True)
    summary = json.loads((out / "trial_summary.json").read_text())
    if summary["status"] != "ok":
        raise SystemExit(f"{overrides}: trial ended {summary['status']}: {summary['reason']}")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, overrides in VARIANTS.items():
                out = Path(tmp) / f"v{list(VARIANTS).index(name)}_{r}"  # hydra overrides reject ( ) in values
                results[name].append(run(overrides, args.steps, out))
                print(f"  done: {name} #{r + 1}", file=sys.stderr)

    def med(name: str, key: str, metrics: bool = True):
        values = [(s["metrics"] if metrics else s)[key] for s in results[name]]
        return statistics.median(v for v in values if v is not None)

    commit = git_commit()
    print(f"\n### Trial speed — {time.strftime('%Y-%m-%d')}, commit {commit}, "
          f"{args.repeats} alternating repeats of {args.steps} steps\n")
    print("| variant | step median (ms) | tokens/s | MFU vs MindSpore fp32 matmul | matmul GFLOP/s | startup to "
          "first step (s) |")
    print("|---|---|---|---|---|---|")
    for name in VARIANTS:
        print(f"| {name} | {med(name, 'step_time_ms_median'):.0f} | {med(name, 'tokens_per_sec'):.0f} | "
              f"{med(name, 'mfu'):.3f} | {med(name, 'matmul_flops_per_sec') / 1e9:.0f} | "
              f"{med(name, 'startup_sec', metrics=False):.1f} |")
    speedup = med("small pynative", "step_time_ms_median") / med("small jit", "step_time_ms_median")
    startup = med("tiny 2 ranks (dp)", "startup_sec", False) / med("tiny 1 rank", "startup_sec", False)
    print(f"\njit speed-up over PyNative (model=small): **{speedup:.2f}x**; "
          f"start-up of 2 ranks vs 1: **{startup:.2f}x**")


if __name__ == "__main__":
    main()
