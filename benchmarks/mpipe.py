"""MPipe Transpose against 1F1B and interleaved 1F1B on 2 and 4 stages, side by side in one run (issue "MPipe
Transpose", Where it wins).

    .venv/bin/python benchmarks/mpipe.py [--model small] [--steps 12] [--rounds 2] [--seq 256]

Each row is a real trial through the CLI (AdamW, jit, global batch 8 sequences of ``--seq`` tokens, one sequence
per micro-batch: 8 micro-batches). 2 stages split ``model``'s 4 blocks 2 + 2; 4 stages run it with 8 blocks (2
per stage) so that stage 0 keeps a block beside a 1-block preprocess. The frozen rows freeze the embedding and
block 0 (an untied head), the preprocess of T = 1: nothing is sent each step and nothing recomputed; their 1F1B
row freezes the same, so that the comparison is of schedules. Rows alternate within each round; medians over
rounds. Reported: median step time and its ratio to the row's 1F1B, the measured bubble
(``metrics.pipeline_bubble``: the share of step time the ranks spent blocked in receives, their mean; transfers
included), and the bytes the schedule sends per step, counted from its action lists and the tensors' sizes (not
measured on the wire): weights (W), preprocessed micro-batches (P: the block's output, and the tokens when it
trains; T = 0 the tokens) and the activations and gradients between stages (F, B).
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from layouts import bench_args, run_rounds
from provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FROZEN = ["model.tie_embeddings=false", "model.freeze_embedding=true", "model.freeze_layers=1"]
MPIPE = ["parallel.pp_schedule=mpipe"]


def rows(pp: int) -> dict[str, list[str]]:
    base = [f"parallel.pp={pp}", *([] if pp == 2 else ["model.n_layers=8"])]
    return {
        f"pp={pp} 1f1b": [*base, "parallel.pp_schedule=1f1b"],
        f"pp={pp} interleaved v=2": [*base, "parallel.pp_schedule=interleaved", "parallel.pp_virtual=2"],
        f"pp={pp} mpipe T=0": [*base, *MPIPE],
        f"pp={pp} mpipe T=1 full": [*base, *MPIPE, "parallel.pp_transpose_layers=1"],
        f"pp={pp} mpipe T=1 min": [
            *base,
            *MPIPE,
            "parallel.pp_transpose_layers=1",
            "parallel.pp_transpose_overflow=min",
        ],
        f"pp={pp} 1f1b, frozen": [*base, "parallel.pp_schedule=1f1b", *FROZEN],
        f"pp={pp} mpipe T=1 full, frozen": [*base, *MPIPE, "parallel.pp_transpose_layers=1", *FROZEN],
    }


def bytes_sent(overrides: list[str]) -> dict[str, int]:
    """Bytes per step by message kind, from the schedule's action lists: F and B a (1, S, D) fp32 tensor, P the
    block's output and, when it trains, the (1, S) int32 tokens (T = 0: the tokens), W every parameter of the block."""
    from core.config import load_config
    from core.memory.estimate import preprocess_copy
    from core.model.flops import param_shapes
    from core.parallel.pipeline.schedules import build, schedule_of

    cfg = load_config(overrides)
    p, t, m = cfg.parallel, cfg.training, cfg.model
    actions = build(**schedule_of(cfg))
    hidden, tokens = 4 * t.micro_batch_size * t.seq_len * m.d_model, 4 * t.micro_batch_size * t.seq_len
    names = preprocess_copy(cfg, 1)  # what rank 1 holds a copy of, when it preprocesses
    weights = 4 * sum(math.prod(shape) for name, shape in param_shapes(m).items() if name in names)
    trains, shipped = cfg.preprocess_trains, hidden if p.pp_transpose_layers else 0
    size = {"F": hidden, "B": hidden, "P": shipped + (tokens if trains or not shipped else 0), "W": weights}
    out = {k: 0 for k in size}
    for rank in actions:
        for a in rank:
            if a.op.startswith("send"):
                out[a.op[-1]] += size[a.op[-1]]
    return out


def main() -> None:
    args = bench_args(__doc__, "small", seq=256)
    base = [
        f"model={args.model}",
        "training.global_batch_size=8",
        "training.micro_batch_size=1",
        f"training.seq_len={args.seq}",
        f"trial.max_steps={args.steps}",
        "training.eval_batches=1",
    ]
    table = {name: [*base, *o] for pp in (2, 4) for name, o in rows(pp).items()}
    with tempfile.TemporaryDirectory() as tmp:
        results = run_rounds(table, args.rounds, Path(tmp))
    print(
        f"\n### MPipe Transpose — {time.strftime('%Y-%m-%d')}, commit {git_commit()}, model={args.model}, "
        f"{args.rounds} alternating rounds of {args.steps} steps, AdamW, jit, 8 micro-batches of 1 x {args.seq}\n"
    )
    print("| schedule | step (ms) | vs its 1F1B | bubble measured | W KiB | P KiB | F+B KiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, overrides in table.items():
        runs = results[name]
        if any(s["exit_code"] != 0 for s in runs):
            print(f"| {name} | {runs[0]['status']}: {runs[0]['reason'][:80]} | | | | | |")
            continue
        ms = statistics.median(s["metrics"]["step_time_ms_median"] for s in runs)
        pp = name.split()[0]
        ref = f"{pp} 1f1b, frozen" if "frozen" in name else f"{pp} 1f1b"
        ref_ms = statistics.median(s["metrics"]["step_time_ms_median"] for s in results[ref])
        bubbles = [s["metrics"].get("pipeline_bubble") for s in runs]
        bubble = statistics.median(bubbles) if None not in bubbles else None
        sent = bytes_sent(overrides)
        print(
            f"| {name} | {ms:.0f} | {ms / ref_ms:.2f}x | {'-' if bubble is None else f'{100 * bubble:.0f}%'} | "
            f"{sent['W'] / 1024:.0f} | {sent['P'] / 1024:.0f} | {(sent['F'] + sent['B']) / 1024:.0f} |"
        )


if __name__ == "__main__":
    main()
