"""``python -m core.perf <overrides> [--json]``: one config's predicted step on a cluster, without running it.

    python -m core.perf model=llama3-70b cluster=h100-sxm cluster.nodes=32 cluster.devices_per_node=8 \\
        parallel.dp_shard=32 parallel.tp=8 parallel.sp=true training.seq_len=8192 training.global_batch_size=512 \\
        training.micro_batch_size=1 training.precision=bf16 memory.recompute=full

Prints step time, global tokens/s, tokens/s per device, MFU (against the profile's peak at the precision; fp8:
bf16's), peak memory per rank and the breakdown (compute, recompute, exposed communication by kind, pipeline idle,
optimizer); ``--json`` prints the same as one JSON object. An invalid config exits 2 naming the field, by the rules
of ``core.train``, and so does a layout whose ranks are not the cluster's devices. Nothing is allocated.

    python -m core.perf calibrate [--force]     # measure cpu-local on this machine (core.perf.calibrate)
    python -m core.perf calibrate --micro       # its micro-benchmarks alone, under a minute (core.perf.micro)
"""

from __future__ import annotations

import json
import sys

from core.config import ConfigError, TrainConfig
from core.perf.step import StepEstimate, estimate_step, planned_config

INVALID = 2  # core.trial.contract.Exit.INVALID (the trial layer sits above this one)


def as_dict(est: StepEstimate) -> dict:
    return {
        "step_time_sec": est.step_time_sec,
        "tokens_per_sec": est.tokens_per_sec,
        "tokens_per_sec_per_device": est.tokens_per_sec_per_device,
        "mfu": est.mfu,
        "peak_memory_bytes_per_rank": est.peak_memory_bytes_per_rank,
        "memory_bytes_per_device": est.memory_bytes_per_device,
        "fits": est.fits,
        "breakdown": est.breakdown,
    }


def text(cfg: TrainConfig, est: StepEstimate) -> str:
    c, par = cfg.cluster, cfg.parallel
    layout = " ".join(f"{k}={getattr(par, k)}" for k in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep"))
    layout += f" etp={par.etp}" if par.etp is not None else ""
    layout += " (experts folded: estimated, not trained)" if par.experts_folded else ""
    layout += " ZeRO-1 (dp_shard_strategy=optim)" if not par.shards_weights else ""
    memory = f"{est.peak_memory_bytes_per_rank / 2**30:.1f} GiB per rank"
    if est.memory_bytes_per_device is not None:
        memory += f" of {est.memory_bytes_per_device / 2**30:.0f} GiB" + ("" if est.fits else "  DOES NOT FIT")
    lines = [
        f"{cfg.model.name} on {c.name}: {c.nodes} x {c.devices_per_node} devices, {layout}, {cfg.training.precision}",
        f"step            {est.step_time_sec:.3f} s",
        f"tokens/s        {est.tokens_per_sec:,.0f} ({est.tokens_per_sec_per_device:,.0f} per device)",
        f"MFU             {est.mfu:.1%}",
        f"peak memory     {memory}",
        "breakdown (s)   " + ", ".join(f"{k} {v:.3f}" for k, v in est.breakdown.items() if v > 0),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    overrides = [a for a in args if a != "--json"]
    if overrides[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if overrides[:1] == ["calibrate"]:
        from core.perf.calibrate import main as calibrate  # function-level: the calibration's command only

        return calibrate(overrides[1:])
    try:
        cfg = planned_config(overrides)
        est = estimate_step(cfg)
    except ConfigError as e:
        message = f"invalid config: {e}"
        print(json.dumps({"error": message, "field": e.field}) if as_json else message, file=sys.stderr)
        return INVALID
    print(json.dumps(as_dict(est), indent=1) if as_json else text(cfg, est))
    return 0


if __name__ == "__main__":
    sys.exit(main())
