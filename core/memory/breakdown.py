"""The memory estimate of every pipeline rank by component, and its text: what ``python -m core.memory`` prints and
the agent's HTML report shows beside a trial's measured peak.
"""

from __future__ import annotations

from core.config import TrainConfig
from core.memory.estimate import (
    PROFILES,
    MiB,
    apply_profile,
    block_activation_bytes,
    pipeline_rank,
    runtime_profile,
    terms,
)

_ROWS = (
    ("parameters", "params"),
    ("gradients", "grads"),
    ("optimizer state", "optimizer"),
    ("runtime copies of states", "state_copies"),
    ("saved activations", "activations"),
    ("logits and loss buffers", "logits"),
    ("pipeline stash", "stash"),
    ("communication buffers", "communication"),
    ("optimizer temporaries", "optimizer_temps"),
    ("graphs and kernels", "graphs"),
    ("runtime baseline", "baseline"),
    ("allocator margin", "allocator"),
)


def breakdown(cfg: TrainConfig) -> dict:
    """The estimate of every pipeline rank by component, with the textbook activations of each block it holds
    (before recompute or SWAP and before the runtime's copies): what ``python -m core.memory`` prints."""
    profile = runtime_profile(cfg.device, cfg.training.mode)
    m, t, par = cfg.model, cfg.training, cfg.parallel
    ranks = []
    for r in range(par.pp):
        est = apply_profile(terms(cfg, r), profile)
        blocks = [i for b in pipeline_rank(cfg, r)[1].values() for i in b]
        ranks.append(
            {
                "pp_rank": r,
                **{key: getattr(est, key) for _, key in _ROWS},
                "total": est.total,
                "blocks": {i: block_activation_bytes(cfg, m.is_moe_layer(i)) for i in blocks},
            }
        )
    return {
        "device": cfg.device,
        "mode": t.mode,
        "measured_profile": (cfg.device, t.mode) in PROFILES,
        "world_size": par.world_size,
        "recompute": cfg.memory.recompute_stages or cfg.memory.recompute,
        "recompute_layers": cfg.memory.recompute_layers,
        "recompute_stage_layers": cfg.memory.recompute_stage_layers,
        "swap": cfg.memory.swap,
        "ranks": ranks,
    }


def format_breakdown(b: dict) -> str:
    mib = lambda x: f"{x / MiB:10.1f}"  # noqa: E731
    profile = (
        "measured profile (benchmarks/RESULTS.md, 'Memory estimate')"
        if b["measured_profile"]
        else "no measured profile: textbook counts, no runtime overhead (the agent calibrates it from peaks)"
    )
    lines = [
        f"per-rank peak estimate, {b['device']} {b['mode']}: {profile}",
        f"{b['world_size']} rank(s); recompute {b['recompute']}"
        + (f" (first {b['recompute_layers']} blocks)" if b["recompute_layers"] else "")
        + (f" (first {b['recompute_stage_layers']} blocks of each stage)" if b["recompute_stage_layers"] else "")
        + f"; swap {'on' if b['swap'] else 'off'}",
        "",
    ]
    ranks = b["ranks"]
    names = [f"pp rank {r['pp_rank']}" for r in ranks] if len(ranks) > 1 else ["MiB"]
    head = "".join(f"{name:>11}" for name in names)
    lines.append(f"{'component':<26}{head}")
    for label, key in _ROWS:
        if any(r[key] for r in ranks):
            lines.append(f"{label:<26}" + "".join(" " + mib(r[key]) for r in ranks))
    lines.append(f"{'total':<26}" + "".join(" " + mib(r["total"]) for r in ranks))
    lines += ["", "textbook saved activations per block (before recompute/SWAP and the runtime's copies), MiB:"]
    for r in ranks:
        per = ", ".join(f"{i}: {v / MiB:.1f}" for i, v in r["blocks"].items())
        lines.append((f"  pp rank {r['pp_rank']}: " if len(ranks) > 1 else "  ") + per)
    return "\n".join(lines)
