"""What one rank has done so far, and the summary it turns into: ``trial_summary.json`` (one process) or
``ranks/rank_<r>.json`` (a worker; the supervisor merges those). Written atomically, whatever the end: a trial that
started always leaves a summary, and a metric it did not reach is null, never invented.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from core.memory.probe import peak_rss_bytes
from core.runtime.files import write_atomic
from core.trial.contract import SCHEMA, STARTUP_PHASES, STATUS, Exit, TrialFailure


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=_json_default))


def _json_default(obj: Any):
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def _finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def versions() -> dict:
    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "mindspore": version("mindspore"),
        "python": sys.version.split()[0],
        "project": version("mindspore-autoresearch"),
    }


@dataclass(kw_only=True)
class TrialRecorder:
    """What one rank has done so far; turns into the summary at the end (or from the watchdog, mid-step)."""

    trial_dir: Path
    config: dict
    overrides: list[str]
    started: float  # wall-clock start of the trial (the supervisor's, for workers)
    rank: int = 0
    world_size: int = 1
    steps: int = 0
    tokens: int = 0
    losses: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    val_loss: float | None = None
    grad_norm_last: float | None = None
    startup_sec: float | None = None
    startup_marks: dict = field(default_factory=dict)  # phase -> wall-clock time it ended (STARTUP_PHASES)
    estimated_memory_bytes: int | None = None
    reference_flops_per_sec: float | None = None  # core.reference_rate: this machine's, fixed
    compute_units: int = 1  # what the reference rate is per: hosts on CPU, devices elsewhere
    flops_per_token: float | None = None
    state_bytes: dict | None = None  # {params, grads, optimizer} bytes this rank holds (what sharding divides)
    comm_time_share: float | None = None  # with training.profile: share of step time in collectives
    pipeline_bubble: float | None = None  # with a pipeline: share of step time blocked in receives (rank mean)
    moe_dropped_fraction: float | None = None  # MoE: pairs over capacity / routed (ranks' last micro-batches)
    max_attention_logit: float | None = None  # with training.max_attention_logit: the run's largest
    compile_cache: str | None = None  # "loaded" / "compiled" (core.runtime.compile_cache; rank 0's); None: off
    started_at: str = field(default_factory=utc_now)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _written: bool = False

    def record_step(self, loss: float, grad_norm: float, tokens: int, seconds: float) -> None:
        self.steps += 1
        self.tokens += tokens
        self.losses.append(loss)
        self.grad_norm_last = grad_norm
        self.step_times.append(seconds)
        if self.startup_sec is None:
            self.mark("first_step")
            self.startup_sec = time.time() - self.started

    def mark(self, phase: str, at: float | None = None) -> None:
        """Start-up ``phase`` (one of STARTUP_PHASES) ended now (or at ``at``); the first mark of each counts."""
        self.startup_marks.setdefault(phase, time.time() if at is None else at)

    def startup_phases(self) -> dict | None:
        """Seconds in each start-up phase that ended, from the trial's start (a worker's ``launch`` includes the
        supervisor's start and spawn): {launch, imports, cluster, build, first_step}; None before any."""
        out, last = {}, self.started
        for phase in STARTUP_PHASES:
            if phase in self.startup_marks:
                out[phase] = round(self.startup_marks[phase] - last, 3)
                last = self.startup_marks[phase]
        return out or None

    def metrics(self) -> dict:
        # The first step carries graph compilation; it is startup, not throughput.
        steady = self.step_times[1:] or self.step_times
        median = statistics.median(steady) if steady else None
        tokens_per_step = self.tokens / self.steps if self.steps else None
        tps = tokens_per_step / median if median and tokens_per_step else None
        mfu = None
        if tps and self.flops_per_token and self.reference_flops_per_sec:
            mfu = tps * self.flops_per_token / (self.reference_flops_per_sec * self.compute_units)
        finite = [x for x in self.losses if math.isfinite(x)]
        peak = peak_rss_bytes()
        return {
            "tokens_per_sec": tps,
            "step_time_ms_median": None if median is None else median * 1000,
            "mfu": mfu,
            "first_loss": _finite_or_none(self.losses[0]) if self.losses else None,  # with final_loss: diverged?
            "final_loss": _finite_or_none(self.losses[-1]) if self.losses else None,
            "min_loss": min(finite) if finite else None,
            "val_loss": _finite_or_none(self.val_loss),
            "grad_norm_last": _finite_or_none(self.grad_norm_last),
            "peak_memory_bytes": peak,
            "peak_memory_bytes_per_rank": [peak],
            "estimated_memory_bytes": self.estimated_memory_bytes,
            "reference_flops_per_sec": self.reference_flops_per_sec,
            "state_bytes": self.state_bytes,
            "comm_time_share": self.comm_time_share,
            "pipeline_bubble": self.pipeline_bubble,
            "moe_dropped_fraction": self.moe_dropped_fraction,
            "max_attention_logit": _finite_or_none(self.max_attention_logit),
        }

    def summary(self, code: Exit, reason: str, error: dict | None = None) -> dict:
        cfg = self.config
        par = cfg.get("parallel", {})
        trial = cfg.get("trial", {})
        layout = {"world_size": self.world_size}
        layout.update({k: par.get(k, 1) for k in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")})
        return {
            "schema": SCHEMA,
            "status": STATUS[Exit(code)],
            "exit_code": int(code),
            "reason": reason,
            "error": error,
            "steps": self.steps,
            "max_steps": trial.get("max_steps"),
            "tokens": self.tokens,
            "wall_time_sec": round(time.time() - self.started, 3),
            "startup_sec": None if self.startup_sec is None else round(self.startup_sec, 3),
            "startup_phases_sec": self.startup_phases(),
            "compile_cache": self.compile_cache,
            "metrics": self.metrics(),
            "layout": layout,
            "config": cfg,
            "overrides": self.overrides,
            "seed": cfg.get("seed"),
            "versions": versions(),
            "started_at": self.started_at,
            "ended_at": utc_now(),
        }

    @property
    def path(self) -> Path:
        if self.world_size > 1:
            return self.trial_dir / "ranks" / f"rank_{self.rank}.json"
        return self.trial_dir / "trial_summary.json"

    def finish(self, code: Exit, reason: str, exc: BaseException | None = None) -> dict:
        """Write this rank's summary once (the watchdog and the main thread may race to it)."""
        error = None
        if code != Exit.OK:
            error = {"type": type(exc).__name__ if exc else STATUS[Exit(code)], "message": reason, "rank": self.rank}
            if exc is not None and not isinstance(exc, TrialFailure):
                error["traceback"] = "".join(traceback.format_exception(exc))[-4000:]
        with self._lock:
            summary = self.summary(code, reason, error)
            if not self._written:
                write_json_atomic(self.path, summary)
                self._written = True
        return summary


def write_invalid_summary(trial_dir: Path, overrides: list[str], reason: str, field_name: str) -> dict:
    """An invalid config still leaves a summary: no compute spent, the field and the fix named."""
    rec = TrialRecorder(trial_dir=trial_dir, config={}, overrides=overrides, started=time.time())
    summary = rec.summary(
        Exit.INVALID, reason, {"type": "ConfigError", "message": reason, "rank": None, "field": field_name}
    )
    summary["metrics"]["peak_memory_bytes"] = None
    summary["metrics"]["peak_memory_bytes_per_rank"] = []
    write_json_atomic(trial_dir / "trial_summary.json", summary)
    return summary
