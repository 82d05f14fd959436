"""Pipeline schedules and stage splits against the 1-process run, side by side in one run (issue "Mesh
parallelism II", Measure).

    .venv/bin/python benchmarks/pipeline.py [--model small] [--steps 12] [--rounds 2]

Each row is a real trial through the CLI (AdamW, jit, global batch 8 x 64 tokens; ``micro`` sequences per
micro-batch, so 8 / micro micro-batches stream through 2 stages). Rows alternate within each round so that load
on this shared machine hits them alike; medians over rounds. Reported: median step time, tokens/s, the measured
bubble (``metrics.pipeline_bubble``: the share of step time the ranks spent blocked in receives, averaged over
ranks; it includes the messages' transfer) beside the theoretical (p - 1) / (v m + p - 1) with equal stage
times, each rank's peak memory and the memory estimate's error for the largest rank (pipelines were not in the
estimate's fit: held out).

A stage re-runs its forward in backward (core/parallel/pipeline/), which the theoretical bubble ignores.
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

PP = ["parallel.pp=2"]
ROWS = {  # name -> (overrides, micro-batch size, virtual stages)
    "1 process, micro 1": ([], 1, 1),
    "gpipe, micro 1": ([*PP, "parallel.pp_schedule=gpipe"], 1, 1),
    "1f1b, micro 1": ([*PP, "parallel.pp_schedule=1f1b"], 1, 1),
    "interleaved v=2, micro 1": ([*PP, "parallel.pp_schedule=interleaved", "parallel.pp_virtual=2"], 1, 2),
    "1f1b, micro 1, offset +1 (3/1)": ([*PP, "parallel.pp_offset=1"], 1, 1),
    "1f1b, micro 1, offset -1 (1/3)": ([*PP, "parallel.pp_offset=-1"], 1, 1),
    "1 process, micro 4": ([], 4, 1),
    "1f1b, micro 4": ([*PP, "parallel.pp_schedule=1f1b"], 4, 1),
}


def main() -> None:
    from core.config import load_config
    from core.memory import estimate_memory_bytes

    args = bench_args(__doc__, "small")
    base = [
        f"model={args.model}",
        "training.global_batch_size=8",
        "training.seq_len=64",
        f"trial.max_steps={args.steps}",
        "training.eval_batches=1",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        results = run_rounds(
            {
                name: [*base, f"training.micro_batch_size={micro}", *overrides]
                for name, (overrides, micro, _) in ROWS.items()
            },
            args.rounds,
            Path(tmp),
        )
    print(
        f"\n### Pipelines — {time.strftime('%Y-%m-%d')}, commit {git_commit()}, model={args.model}, {args.rounds} "
        f"alternating rounds of {args.steps} steps, AdamW, jit, global batch 8 x 64, pp=2\n"
    )
    print(
        "| schedule | step (ms) | vs 1 process | tokens/s | bubble measured | bubble (p-1)/(vm+p-1) | "
        "peak MiB per rank | estimate error (held out) |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for name, (overrides, micro, v) in ROWS.items():
        runs = results[name]
        ms = statistics.median(s["metrics"]["step_time_ms_median"] for s in runs)
        ref = results[f"1 process, micro {micro}"]
        ref_ms = statistics.median(s["metrics"]["step_time_ms_median"] for s in ref)
        tps = statistics.median(s["metrics"]["tokens_per_sec"] for s in runs)
        peaks = [
            max(p or 0 for p in col)
            for col in zip(*(s["metrics"]["peak_memory_bytes_per_rank"] for s in runs), strict=True)
        ]
        est = estimate_memory_bytes(load_config([*base, f"training.micro_batch_size={micro}", *overrides]))
        bubbles = [s["metrics"].get("pipeline_bubble") for s in runs]
        measured = statistics.median(bubbles) if None not in bubbles else None
        m, p = 8 // micro, 2 if overrides else 1
        theory = (p - 1) / (v * m + p - 1)
        print(
            f"| {name} | {ms:.0f} | {ms / ref_ms:.2f}x | {tps:.0f} | "
            f"{'-' if measured is None else f'{100 * measured:.0f}%'} | {100 * theory:.0f}% | "
            f"{' / '.join(f'{q / MiB:.0f}' for q in peaks)} | {100 * (est - max(peaks)) / max(peaks):+.1f}% |"
        )


if __name__ == "__main__":
    main()
