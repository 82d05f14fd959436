"""A cheap stand-in for ``python -m core.train``: same key=value overrides, same summary and exit codes.

Outcomes follow fixed rules so that tests can reason about them:
- memory: ``estimate_memory_bytes`` (also the agent's estimator in tests) = (64 MiB + micro_batch_size *
  seq_len * 128 KiB * (0.35 with recompute, else 1)) / tp; the measured peak is 1.1x that. A peak above
  ``memory.limit_gb`` (default 1 GiB) ends the trial with exit 10 (oom).
- ``optim.lr`` above 0.05 gives NaN (exit 12); the loss is lowest around lr = 3e-3.
- throughput grows with the micro-batch and drops with recompute, so the best configs sit at the OOM boundary.
- an unknown key exits 2 (invalid), like the core.
- ``fake.*`` keys steer the process itself: ``fake.sleep`` (seconds of "training"), ``fake.error=true`` (a
  traceback, exit 1), ``fake.compile_error=true`` (exit 11), ``fake.crash=true`` (SIGKILL itself, no summary),
  ``fake.hang=true`` (ignore SIGTERM and never end), ``fake.marker=<path>`` (append "start <pid> <dir> cpus=<its
  CPU affinity>" to a file), ``fake.hold=<path>`` (wait while that file exists, within the wall budget),
  ``fake.noise=<relative sigma>`` (run-to-run noise: tokens/s and losses times 1 + sigma * N(0, 1), drawn from the
  trial dir's name and the seed, so that a test's study is reproducible while its repeats differ).
- start-up phases: with ``fake.sleep`` > 0 the summary's ``startup_phases_sec`` splits the seconds slept as
  launch 10%, imports 20%, cluster 5%, build 15%, first_step 30% (``startup_sec`` = their sum): a nominal split
  of one sleep, not a measurement, for the cost ledger's tests. Without a sleep (or for an invalid config, which
  never starts) it is null, like a trial that reports no phases.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from pathlib import Path

MiB, GiB = 1024**2, 1024**3
KNOWN_PREFIXES = (
    "model",
    "optim",
    "parallel.",
    "training.",
    "memory.",
    "trial.",
    "data.",
    "seed",
    "device",
    "cluster",
    "fake.",
)


def parse(argv: list[str]) -> dict[str, str]:
    out = {}
    for item in argv:
        key, sep, value = item.lstrip("+").partition("=")
        if not sep:
            raise ValueError(f"expected key=value, got {item!r}")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]  # Hydra's quoting of a string that would read as something else
        out[key] = value
    return out


def _num(cfg: dict, key: str, default: float) -> float:
    value = cfg.get(key)
    return default if value in (None, "null", "None") else float(value)


def estimate_memory_bytes(overrides: list[str]) -> int:
    cfg = parse(list(overrides))
    mbs, seq = _num(cfg, "training.micro_batch_size", 8), _num(cfg, "training.seq_len", 256)
    tp = _num(cfg, "parallel.tp", 1)
    factor = 0.35 if cfg.get("memory.recompute", "none") not in ("none", "false") else 1.0
    return int((64 * MiB + mbs * seq * 128 * 1024 * factor) / tp)


def outcome(cfg: dict) -> tuple[int, str, dict]:
    """(exit code, reason, metrics) by the rules in the module docstring."""
    mbs, seq = _num(cfg, "training.micro_batch_size", 8), _num(cfg, "training.seq_len", 256)
    tp, lr = _num(cfg, "parallel.tp", 1), _num(cfg, "optim.lr", 3e-3)
    recompute = cfg.get("memory.recompute", "none") not in ("none", "false")
    estimate = estimate_memory_bytes([f"{k}={v}" for k, v in cfg.items()])
    peak = int(estimate * 1.1)
    limit = _num(cfg, "memory.limit_gb", 1.0) * GiB
    step_ms = (5.0 + 0.02 * mbs * seq / tp) * (1.33 if recompute else 1.0)
    loss = 3.0 + (math.log10(lr) + 2.5) ** 2
    metrics = {
        "tokens_per_sec": mbs * seq / step_ms * 1000.0,
        "step_time_ms_median": step_ms,
        "mfu": None,
        "first_loss": 6.0,
        "final_loss": loss,
        "min_loss": loss,
        "val_loss": loss + 0.05,
        "grad_norm_last": 1.0,
        "peak_memory_bytes": peak,
        "peak_memory_bytes_per_rank": [peak] * int(tp),
        "estimated_memory_bytes": estimate,
    }
    if cfg.get("fake.error") == "true":
        return 1, "RuntimeError: fake failure", {}
    if cfg.get("fake.compile_error") == "true":
        return 11, "graph compilation failed (fake)", {}
    if peak > limit:
        return (
            10,
            f"rank 0 peak {peak / MiB:.0f} MiB exceeded memory.limit_gb={limit / GiB:g}",
            {**{k: None for k in metrics}, "peak_memory_bytes": peak, "estimated_memory_bytes": estimate},
        )
    if lr > 0.05:
        return (
            12,
            "loss became NaN at step 3",
            {**{k: None for k in metrics}, "peak_memory_bytes": peak, "estimated_memory_bytes": estimate},
        )
    return 0, "reached max_steps", metrics


def add_noise(metrics: dict, sigma: float, draw: str) -> None:
    import random

    rng = random.Random(draw)  # a str seed is hashed with SHA-512: the same on every machine and run
    speed = 1.0 + sigma * rng.gauss(0.0, 1.0)
    metrics["tokens_per_sec"] *= speed
    metrics["step_time_ms_median"] /= speed
    loss = 1.0 + sigma * rng.gauss(0.0, 1.0)
    for key in ("final_loss", "min_loss", "val_loss"):
        metrics[key] *= loss


PHASE_SHARES = {"launch": 0.1, "imports": 0.2, "cluster": 0.05, "build": 0.15, "first_step": 0.3}


def startup_phases(cfg: dict, code: int) -> dict | None:
    """The nominal start-up phases of the module docstring (None without a sleep or when the config is invalid)."""
    slept = min(_num(cfg, "fake.sleep", 0.0), _num(cfg, "trial.max_wall_time_sec", math.inf))
    if slept <= 0 or code == 2:
        return None
    return {phase: round(share * slept, 6) for phase, share in PHASE_SHARES.items()}


METRICS = (
    "tokens_per_sec",
    "step_time_ms_median",
    "mfu",
    "first_loss",
    "final_loss",
    "min_loss",
    "val_loss",
    "grad_norm_last",
    "peak_memory_bytes",
    "peak_memory_bytes_per_rank",
    "estimated_memory_bytes",
)


def write_summary(
    trial_dir: Path, cfg: dict, argv: list[str], code: int, reason: str, metrics: dict, wall: float
) -> None:
    status = {0: "ok", 1: "error", 2: "invalid", 10: "oom", 11: "compile_error", 12: "nan", 13: "timeout"}[code]
    steps = int(_num(cfg, "trial.max_steps", 20)) if code == 0 else 3
    phases = startup_phases(cfg, code)
    summary = {
        "schema": "mindspore-autoresearch/trial_summary/v1",
        "status": status,
        "exit_code": code,
        "reason": reason,
        "error": None if code == 0 else {"type": status, "message": reason, "rank": 0},
        "steps": steps,
        "max_steps": int(_num(cfg, "trial.max_steps", 20)),
        "tokens": steps * 256,
        "wall_time_sec": wall,
        "startup_sec": round(sum(phases.values()), 6) if phases else 0.01,
        "startup_phases_sec": phases,
        "metrics": {k: metrics.get(k) for k in METRICS},
        "layout": {
            "world_size": int(_num(cfg, "parallel.tp", 1)),
            "dp_replicate": 1,
            "dp_shard": 1,
            "tp": int(_num(cfg, "parallel.tp", 1)),
            "pp": 1,
            "cp": 1,
            "ep": 1,
        },
        "config": cfg,
        "overrides": argv,
        "seed": int(_num(cfg, "seed", 0)),
        "versions": {"mindspore": None, "python": sys.version.split()[0], "project": "fake"},
        "started_at": "1970-01-01T00:00:00Z",
        "ended_at": "1970-01-01T00:00:01Z",
    }
    tmp = trial_dir / "trial_summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, trial_dir / "trial_summary.json")


def main(argv: list[str]) -> int:
    start = time.monotonic()
    cfg = parse(argv)
    trial_dir = Path(cfg.get("trial.dir") or "trials/manual/fake")
    trial_dir.mkdir(parents=True, exist_ok=True)
    if cfg.get("fake.marker"):
        with open(cfg["fake.marker"], "a") as f:
            cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))))
            f.write(f"start {os.getpid()} {trial_dir} cpus={cpus}\n")
    unknown = [k for k in cfg if not k.startswith(KNOWN_PREFIXES)]
    if unknown:
        write_summary(trial_dir, cfg, argv, 2, f"unknown key {unknown[0]!r}", {}, 0.0)
        return 2
    if cfg.get("fake.hang") == "true":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends it: the watchdog must escalate
        print("hanging (fake)", file=sys.stderr, flush=True)
        while True:
            time.sleep(1)
    if cfg.get("fake.crash") == "true":
        print("Fatal Python error: Segmentation fault (fake)", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    code, reason, metrics = outcome(cfg)
    if code == 0 and _num(cfg, "fake.noise", 0.0) > 0:
        add_noise(metrics, _num(cfg, "fake.noise", 0.0), f"{trial_dir.name}/{cfg.get('seed', 0)}")
    sleep = _num(cfg, "fake.sleep", 0.0)
    wall_budget = _num(cfg, "trial.max_wall_time_sec", math.inf)
    if sleep > wall_budget:  # the run's own clock ends it first, as in the core
        time.sleep(wall_budget)
        code, reason, metrics = 13, f"wall budget {wall_budget:g}s ended before max_steps", {}
    else:
        time.sleep(sleep)
    hold = cfg.get("fake.hold")
    while hold and os.path.exists(hold) and time.monotonic() - start < wall_budget:
        time.sleep(0.05)
    if code == 1:
        print("Traceback (most recent call last):\nRuntimeError: fake failure", file=sys.stderr)
    write_summary(trial_dir, cfg, argv, code, reason, metrics, time.monotonic() - start)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
