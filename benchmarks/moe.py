"""Mixture-of-experts layouts against the 1-process run, side by side in one run (issue "Mesh parallelism II",
Measure).

    .venv/bin/python benchmarks/moe.py [--model moe-small] [--steps 12] [--rounds 2]

Each row is a real trial through the CLI (AdamW, jit, global batch 8 x 64 tokens, micro-batch 2). Rows alternate
within each round; medians over rounds. Reported: median step time, tokens/s, the share of (token, choice) pairs
dropped by capacity (each rank's last micro-batch of each step), the share of rank 0's step time in collectives
from one more profiled run per row (``training.profile=true``: with expert parallelism that is the dispatch and
combine all-to-alls, composed from all-reduce on CPU, plus FSDP's gathers), each rank's peak memory and the memory
estimate's error (MoE was not in the estimate's fit: held out).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from layouts import MiB, bench_args, run, run_rounds
from provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ROWS = {
    "1 process": [],
    "dp_replicate=2": ["parallel.dp_replicate=2"],
    "ep=2 (dp_shard=2)": ["parallel.dp_shard=2", "parallel.ep=2"],
    "pp=2 1f1b": ["parallel.pp=2"],
}


def main() -> None:
    from core.config import load_config
    from core.memory import estimate_memory_bytes

    args = bench_args(__doc__, "moe-small")
    base = [
        f"model={args.model}",
        "training.global_batch_size=8",
        "training.micro_batch_size=2",
        "training.seq_len=64",
        f"trial.max_steps={args.steps}",
        "training.eval_batches=1",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        results = run_rounds({name: [*base, *overrides] for name, overrides in ROWS.items()}, args.rounds, Path(tmp))
        for i, (name, overrides) in enumerate(ROWS.items()):
            results[(name, "profiled")] = run([*base, *overrides, "training.profile=true"], Path(tmp) / f"{i}_p")
    print(
        f"\n### MoE layouts — {time.strftime('%Y-%m-%d')}, commit {git_commit()}, model={args.model}, "
        f"{args.rounds} alternating rounds of {args.steps} steps, AdamW, jit, global batch 8 x 64, micro-batch 2\n"
    )
    print(
        "| layout | step (ms) | vs 1 process | tokens/s | pairs dropped | time in collectives | peak MiB per rank | "
        "estimate error (held out) |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    ref_ms = statistics.median(s["metrics"]["step_time_ms_median"] for s in results["1 process"])
    for name, overrides in ROWS.items():
        runs = results[name]
        ms = statistics.median(s["metrics"]["step_time_ms_median"] for s in runs)
        tps = statistics.median(s["metrics"]["tokens_per_sec"] for s in runs)
        dropped = statistics.median(s["metrics"]["moe_dropped_fraction"] for s in runs)
        comm = results[(name, "profiled")]["metrics"]["comm_time_share"]
        peaks = [
            max(p or 0 for p in col)
            for col in zip(*(s["metrics"]["peak_memory_bytes_per_rank"] for s in runs), strict=True)
        ]
        est = estimate_memory_bytes(load_config([*base, *overrides]))
        print(
            f"| {name} | {ms:.0f} | {ms / ref_ms:.2f}x | {tps:.0f} | {100 * dropped:.0f}% | "
            f"{'-' if comm is None else f'{100 * comm:.0f}%'} | {' / '.join(f'{q / MiB:.0f}' for q in peaks)} | "
            f"{100 * (est - max(peaks)) / max(peaks):+.1f}% |"
        )


if __name__ == "__main__":
    main()
