"""Does a short trial's step time predict the steady state? (issue "Performance I", item 6)

    .venv/bin/python benchmarks/steady_state.py [--steps 100] [--configs NAME ...]

Each config runs as a real trial through the CLI for ``--steps`` steps; from its ``metrics.jsonl`` (every step's
wall time) this prints the median step time over steps 2-10 and 2-20 (what a 10- or 20-step trial's summary
reports: every step after the first), 11-20 (the second half of a 20-step trial), what separate 10- and 20-step
trials reported (``step_time_ms_median``: the spread between processes), and the steady state (steps 50-100),
with each one's difference from the steady state. MindSpore's CPU runtime searches thread counts during a
kernel's or graph's first ~50 launches (docs/mindspore-cpu.md, "Threads and speed"): the agent ranks configs by ``tokens_per_sec``, so a
short trial must measure what a long run would get. Configs marked held out were not looked at when choosing
what a trial measures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from layouts import run
from provenance import cpu_info, git_commit

CONFIGS = {  # name -> (overrides, held out of the choice of the measurement window)
    "small": (["model=small"], False),
    "small muon": (["model=small", "optim=muon"], False),
    "medium": (["model=medium"], False),
    "small seq256 mb4": (["model=small", "training.seq_len=256", "training.global_batch_size=4"], False),
    "small dp_replicate=2": (["model=small", "parallel.dp_replicate=2"], False),
    "tiny": (["model=tiny"], True),
    "small tp=2": (["model=small", "parallel.tp=2"], True),
    "small pynative": (["model=small", "training.mode=pynative"], True),
}


def window(times: list[float], lo: int, hi: int) -> float | None:
    """Median of steps lo..hi (1-based, inclusive) of a trial's per-step times."""
    part = times[lo - 1 : hi]
    return statistics.median(part) if part else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(args.configs):
            overrides, held_out = CONFIGS[name]
            short = {}
            for n in (10, 20):  # the trial's own figure at the budgets the agent uses
                s = run([*overrides, f"trial.max_steps={n}", "training.eval_batches=1"], Path(tmp) / f"{i}_{n}")
                short[n] = s["metrics"]["step_time_ms_median"]
            out = Path(tmp) / f"{i}_long"
            run([*overrides, f"trial.max_steps={args.steps}", "training.eval_batches=1"], out)
            times = [
                r["step_time_ms"]
                for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
                if "step_time_ms" in r
            ]
            rows.append(
                (
                    name,
                    held_out,
                    window(times, 2, 10),
                    window(times, 2, 20),
                    window(times, 11, 20),
                    short[10],
                    short[20],
                    window(times, 50, args.steps),
                )
            )
            print(f"  {name}: {rows[-1][2:]}", file=sys.stderr)
    print(
        f"\n**Steady state** — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {git_commit()}, "
        f"{cpu_info()}; jit, AdamW unless named, global batch 8 x 64 unless named; one trial of {args.steps} "
        "steps and one each of 10 and 20 steps per config\n"
    )
    print(
        "| config | steps 2-10 (ms) | steps 2-20 | steps 11-20 | 10-step trial reports | 20-step trial reports | "
        f"steady, steps 50-{args.steps} |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")

    def cell(v, ref):
        return "—" if v is None else f"{v:.0f} ({v / ref - 1:+.0%})"

    for name, held_out, w10, w20, late, t10, t20, steady in rows:
        label = f"{name}{' (held out)' if held_out else ''}"
        print(
            f"| {label} | {cell(w10, steady)} | {cell(w20, steady)} | {cell(late, steady)} | {cell(t10, steady)} "
            f"| {cell(t20, steady)} | {steady:.0f} |"
        )


if __name__ == "__main__":
    main()
