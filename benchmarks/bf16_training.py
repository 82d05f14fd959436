"""bf16 training on this CPU against fp32, beside PyTorch's CPU bf16 (issue "Real models", bf16 mixed precision).

    .venv/bin/python benchmarks/bf16_training.py [--models tiny small] [--steps 50] [--rounds 1]

Needs the optional extra ``pip install -e '.[bench]'`` (PyTorch). Rows per model, alternating within a round
(``layouts.run_rounds``), each a fresh process on the same batches: the core in fp32 and with
``training.precision=bf16`` (emulated here: bf16's values in fp32 storage, ``TrainConfig.compute_precision``), and
PyTorch eager in fp32 and under ``torch.autocast("cpu", bfloat16)`` (real bf16 matmuls through oneDNN; norms,
softmax and the loss in fp32), the peer a user would run bf16 on this CPU with. Per row: median step time, the
core's peak memory, and the loss curve against the same framework's fp32 run (median, mean and largest |difference|
over the steps, at the last step; the largest reads the first spike either run takes alone): does the core's
emulated bf16 move the curve as much as PyTorch's real bf16 does? The figures go to benchmarks/RESULTS.md, "bf16
training on CPU".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from layouts import run_rounds
from peer_torch import require_torch, run_row
from provenance import cpu_info, git_commit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ROWS = {  # row -> (framework, its fp32 row, overrides)
    "core fp32": ("core", "core fp32", []),
    "core bf16 (emulated)": ("core", "core fp32", ["training.precision=bf16"]),
    "torch eager fp32": ("torch", "torch eager fp32", ["peer=eager"]),
    "torch eager bf16 (autocast)": ("torch", "torch eager fp32", ["peer=eager-bf16"]),
}


def runner(overrides: list[str], out: Path) -> dict:
    """A row's trial summary, with its per-step losses (the core's from its metrics.jsonl)."""
    s = run_row(overrides, out)
    if "losses" not in s:
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        s["losses"] = [r["loss"] for r in rows if "loss" in r]
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "small"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    require_torch()
    from core.config import load_config
    from core.model import GPT, count_params  # MindSpore in this waiting process only, for the count

    base = [f"trial.max_steps={args.steps}", "training.eval_batches=1", "training.eval_interval=0"]
    rows = {}
    for model in args.models:
        n = count_params(GPT(load_config([f"model={model}"]).model))
        for row, (framework, _, extra) in ROWS.items():
            params = [extra[0], f"params={n}"] if framework == "torch" else extra
            rows[f"{model} {row}"] = [*params, f"model={model}", *base]
    with tempfile.TemporaryDirectory() as tmp:
        results = run_rounds(rows, args.rounds, Path(tmp), runner=runner)
    print(
        f"\n### bf16 training — {time.strftime('%Y-%m-%d %H:%M %Z')}, commit {git_commit()}, {cpu_info()}; "
        f"{args.rounds} round(s) of {args.steps} steps, 1 rank, the core's default batch\n"
    )
    print(
        "| model | row | step (ms) | vs its fp32 | peak memory (MiB) | loss first → last | |Δ loss| median / mean / max / last |"
    )
    print("|---|---|---:|---:|---:|---|---|")
    for model in args.models:
        for row, (_, ref, _) in ROWS.items():
            runs, base_runs = results[f"{model} {row}"], results[f"{model} {ref}"]
            if runs[0]["status"] != "ok":
                print(f"| {model} | {row} | failed: {runs[0]['reason'].replace('|', '/')} | | | | |")
                continue
            step = statistics.median(s["metrics"]["step_time_ms_median"] for s in runs)
            step_ref = statistics.median(s["metrics"]["step_time_ms_median"] for s in base_runs)
            peak = runs[0]["metrics"].get("peak_memory_bytes")
            a, b = np.array(runs[0]["losses"]), np.array(base_runs[0]["losses"])
            d = np.abs(a - b)
            print(
                f"| {model} | {row} | {step:.0f} | {step / step_ref:.2f}x | "
                f"{'n/a' if peak is None else f'{peak / 2**20:.0f}'} | {a[0]:.3f} → {a[-1]:.3f} | "
                f"{np.median(d):.4f} / {d.mean():.4f} / {d.max():.4f} / {d[-1]:.4f} |"
            )


if __name__ == "__main__":
    main()
