"""MLA against GQA, side by side in one run (issue "Real models", Measure): the same model shape with grouped-query
attention and with DeepSeek's multi-head latent attention, each trained as a real trial on this machine; per-rank
peak memory measured and estimated, step time, parameters, and what each would cache per token at inference.

    .venv/bin/python benchmarks/mla_memory.py [--model small] [--seq 256] [--steps 8] [--rounds 3]

The rows: ``model=<model>`` as it is (GQA with its own KV heads), the same with 1 KV head per 4 query heads, and
MLA with DeepSeek-V3's proportions scaled to the model (``variants``). The KV cache per token and layer is counted from the config (keys and values of the KV heads for GQA,
the latent and the shared RoPE key for MLA), not measured: the core trains, it has no inference cache. Training
materialises every head's keys and values from the latent, so MLA saves no training memory; what it buys is the
inference cache, which the table shows beside the training cost.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.config import load_config  # noqa: E402
from core.memory.estimate import estimate_memory_bytes  # noqa: E402
from core.model.flops import param_shapes  # noqa: E402
from core.perf.calibrate import run_trial  # noqa: E402


def variants(model: str) -> dict[str, list[str]]:
    """GQA as the preset has it, GQA with a quarter of the KV heads, and MLA whose latent is DeepSeek-V3's share of
    the width (512 / 7168 of d for kv, 1536 / 7168 for q), heads of DeepSeek's split (nope 2, rope 1, value 2)."""
    m = load_config([f"model={model}"]).model
    E = m.head_size
    mla = [
        "model.attention=mla",
        f"model.n_kv_heads={m.n_heads}",
        f"model.q_lora_rank={max(16, round(m.d_model * 1536 / 7168))}",
        f"model.kv_lora_rank={max(16, round(m.d_model * 512 / 7168))}",
        f"model.qk_nope_head_dim={E}",
        f"model.qk_rope_head_dim={E // 2}",
        f"model.v_head_dim={E}",
    ]
    return {
        f"GQA, {m.n_kv_heads} KV heads": [],
        f"GQA, {max(1, m.n_heads // 4)} KV heads": [f"model.n_kv_heads={max(1, m.n_heads // 4)}"],
        "MLA": mla,
    }


def kv_cache_floats(cfg) -> int:
    """Numbers an inference cache holds per token and layer: 2 K E for GQA, L + R for MLA (DeepSeek-V2, section
    2.1.4)."""
    return cfg.kv_lora_rank + cfg.qk_rope_head_dim if cfg.mla else 2 * cfg.n_kv_heads * cfg.head_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    base = [f"model={args.model}", "training.global_batch_size=8", f"training.seq_len={args.seq}"]
    base += [f"trial.max_steps={args.steps}"]
    rows = variants(args.model)
    measured: dict[str, list[tuple[float, int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):  # alternating, so that load on a shared machine hits every row alike
            for i, (name, overrides) in enumerate(rows.items()):
                s = run_trial([*base, *overrides], Path(tmp) / f"{i}_{r}")
                measured.setdefault(name, []).append(
                    (s["metrics"]["step_time_ms_median"], s["metrics"]["peak_memory_bytes"])
                )
                print(f"  {name} #{r + 1}: {measured[name][-1][0]:.0f} ms", file=sys.stderr)
    print(
        f"# MLA against GQA: {args.model}, global batch 8 x {args.seq}, jit, {args.steps} steps — "
        f"{time.strftime('%Y-%m-%d')}, commit {git_commit()}, median of {args.rounds} alternating rounds\n\n"
        "| attention | parameters | KV cache per token and layer (computed) | peak memory (MiB) | estimated (MiB) "
        "| median step (ms) |\n|---|---:|---:|---:|---:|---:|"
    )
    for name, overrides in rows.items():
        cfg = load_config([*base, *overrides])
        params = sum(math.prod(s) for s in param_shapes(cfg.model).values())
        step = statistics.median(t for t, _ in measured[name])
        peak = statistics.median(p for _, p in measured[name])
        print(
            f"| {name} | {params:,} | {kv_cache_floats(cfg.model)} | {peak / 2**20:.0f} | "
            f"{estimate_memory_bytes(cfg) / 2**20:.0f} | {step:.1f} |"
        )


if __name__ == "__main__":
    main()
