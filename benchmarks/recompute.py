"""Activation recompute and SWAP against neither, in jit and PyNative, side by side in one run (issue "Memory II",
Measure).

    .venv/bin/python benchmarks/recompute.py [--model small] [--micro-batch 8] [--steps 12] [--rounds 2]

Each row is a real 1-process trial through the CLI (AdamW, one micro-batch of 8 sequences of 512 tokens per step,
where activations dominate the peak; ``--micro-batch`` for a larger model). ``swap half`` moves the saved tensors of
the first half of the blocks only (``memory.swap_layers``). Rows alternate within each round; medians over rounds.
Reported: median step time and its ratio to ``none`` in the same mode, the peak resident memory (VmHWM) and its ratio
to ``none``, and the memory estimate's error. Selective recompute and SWAP under jit are refused on CPU (core.config
says why): their rows say so instead of running.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from layouts import MiB, bench_args, run_rounds
from provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS = (
    "none",
    "selective",
    "full",
    "swap",
    "swap half",
)  # swap: memory.swap=true (core.memory.swap), PyNative only


def main() -> None:
    from core.config import ConfigError, load_config
    from core.memory import estimate_memory_bytes

    args = bench_args(__doc__, "small", micro_batch=8)
    b = args.micro_batch
    base = [
        f"model={args.model}",
        f"training.global_batch_size={b}",
        f"training.micro_batch_size={b}",
        "training.seq_len=512",
        f"trial.max_steps={args.steps}",
        "training.eval_batches=1",
    ]
    half = load_config(base).model.n_layers // 2
    setting = {"swap": ["memory.swap=true"], "swap half": ["memory.swap=true", f"memory.swap_layers={half}"]}
    rows, refused = {}, {}
    for mode in ("jit", "pynative"):
        for r in SETTINGS:
            overrides = [*base, f"training.mode={mode}", *setting.get(r, [f"memory.recompute={r}"])]
            try:
                load_config(overrides)
                rows[(mode, r)] = overrides
            except ConfigError as exc:
                refused[(mode, r)] = exc
    with tempfile.TemporaryDirectory() as tmp:
        results = run_rounds({f"{m} {r}": o for (m, r), o in rows.items()}, args.rounds, Path(tmp))
    print(
        f"\n**Recompute** — {time.strftime('%Y-%m-%d')}, commit {git_commit()}, model={args.model}, "
        f"seq 512, micro-batch {b}, {args.rounds} round(s) of {args.steps} steps, AdamW, 1 process\n"
    )
    print("| mode | recompute | step (ms) | vs none | peak MiB | vs none | estimate error |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for mode in ("jit", "pynative"):
        ref = results[f"{mode} none"]
        ref_ms = statistics.median(s["metrics"]["step_time_ms_median"] for s in ref)
        ref_peak = statistics.median(s["metrics"]["peak_memory_bytes"] for s in ref)
        for r in SETTINGS:
            if (mode, r) in refused:
                print(f"| {mode} | {r} | refused (exit 2): {refused[(mode, r)].field} | | | | |")
                continue
            runs = results[f"{mode} {r}"]
            ms = statistics.median(s["metrics"]["step_time_ms_median"] for s in runs)
            peak = statistics.median(s["metrics"]["peak_memory_bytes"] for s in runs)
            err = (estimate_memory_bytes(load_config(rows[(mode, r)])) - peak) / peak
            print(
                f"| {mode} | {r} | {ms:.0f} | {ms / ref_ms:.2f}x | {peak / MiB:.0f} | {peak / ref_peak:.2f}x | "
                f"{err:+.1%} |"
            )


if __name__ == "__main__":
    main()
