"""A model built from a Hugging Face config runs as fast as the same shapes built from a preset (issue "Real
models", Measure: no overhead from the import path), side by side in one run.

    .venv/bin/python benchmarks/hf_import.py [--model small] [--steps 12] [--rounds 3]

Writes the preset's shapes as a transformers ``config.json`` (``core.config.hf.to_hf_config``, a Llama), checks
that ``model=hf:<dir>`` reads back the same model, then runs both as real trials (jit, global batch 8 x 64),
alternating within each round; reports the median step time of each and their ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.config import load_config  # noqa: E402
from core.config.hf import to_hf_config  # noqa: E402
from core.perf.calibrate import measure_layouts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    preset = load_config([f"model={args.model}"]).model
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / f"hf-{args.model}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(to_hf_config(preset)))
        read = load_config([f"model=hf:{folder}"]).model
        if dataclasses.replace(read, name=preset.name) != preset:
            raise SystemExit(f"hf:{folder} does not read back as model={args.model}")
        base = ["training.global_batch_size=8", "training.seq_len=64", f"trial.max_steps={args.steps}"]
        rows = {f"model={args.model}": [f"model={args.model}"], "model=hf:<its config.json>": [f"model=hf:{folder}"]}
        steps = measure_layouts(rows, base, args.rounds)
    (a, pa), (b, pb) = steps.items()
    print(
        f"# {args.model}: a preset against its Hugging Face config — {time.strftime('%Y-%m-%d')}, commit "
        f"{git_commit()}, {args.steps} steps, median of {args.rounds} alternating rounds\n\n"
        f"| model | median step (ms) |\n|---|---:|\n| {a} | {pa * 1000:.1f} |\n| {b} | {pb * 1000:.1f} |\n\n"
        f"ratio (hf / preset): {pb / pa:.3f}"
    )


if __name__ == "__main__":
    main()
