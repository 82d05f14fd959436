"""What a trial measures about its steps beyond loss and time, recorded into the trial summary's metrics:

comm_time_share       with ``training.profile``: the share of step time in collectives (MindSpore's profiler)
pipeline_bubble       with a pipeline: the share of step time a rank spent blocked in receives (rank mean)
moe_dropped_fraction  MoE: (token, choice) pairs over capacity / routed, in each step's last micro-batch
max_attention_logit   with ``training.max_attention_logit``: the largest attention logit of the run (each step's
                      in its ``metrics.jsonl`` line), and the check that stops a trial whose logits pass it
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from mindspore import Tensor, ops

from core.config import TrainConfig
from core.model.layers import CausalAttention
from core.model.moe import moe_layers
from core.runtime.profiling import StepProfiler, comm_time_share
from core.training.ranks import Ranks
from core.trial.contract import NonFinite
from core.trial.recorder import TrialRecorder


class StepStats:
    def __init__(self, cfg: TrainConfig, *, model, profile_dir: Path, pipeline: bool):
        self.cfg, self.profile_dir, self.pipeline = cfg, profile_dir, pipeline
        self.moe = moe_layers(model)
        self.moe_pairs = [0.0, 0.0]  # (token, choice) pairs dropped / routed
        self.waits: list[tuple[float, float]] = []  # (seconds blocked in pipeline receives, step seconds)
        self.profiler: StepProfiler | None = None
        self.profiled_sec = 0.0
        self.logit_limit = cfg.training.max_attention_logit
        self.cores = [c for _, c in model.cells_and_names() if isinstance(c, CausalAttention) and c.track_max]
        m = cfg.model  # every block's label, the same list on every rank (a pipeline rank holds some of them)
        self.labels = [f"layers.{i}" for i in range(m.n_layers)] + [f"mtp.{k}.block" for k in range(m.mtp_layers)]
        self.max_logit: float | None = None  # the run's largest (every rank's)

    def attention_logit(self, step: int, ranks: Ranks) -> tuple[float, str] | None:
        """(the step's largest attention logit over every rank, the block it is in); every rank joins, the cells'
        maxima reset. Raises NonFinite past ``training.max_attention_logit``, naming the block. None when not
        tracked."""
        if self.logit_limit is None:
            return None
        mine = dict.fromkeys(self.labels, -math.inf)
        for core in self.cores:
            mine[core.label] = max(mine[core.label], float(core.max_logit.asnumpy()))
            ops.assign(core.max_logit, Tensor(-np.inf, core.max_logit.dtype))
        each = ranks.max_each(list(mine.values()))
        worst = max(range(len(each)), key=lambda i: each[i] if not math.isnan(each[i]) else math.inf)
        value, label = each[worst], self.labels[worst]
        self.max_logit = value if self.max_logit is None else max(self.max_logit, value)
        if not value <= self.logit_limit:  # NaN too
            raise NonFinite(
                f"nan: the largest attention logit reached {value:.4g} in {label} at step {step + 1}, past "
                f"training.max_attention_logit={self.logit_limit:g} (logits growing without bound come before "
                f"divergence); lower optim.lr (now {self.cfg.optim.lr:g}) or raise optim.warmup_steps"
            )
        return value, label

    def before_step(self, steps_run: int) -> None:
        """Start the profiler after compilation and warm-up (the steps after the first two)."""
        if self.cfg.training.profile and self.profiler is None and steps_run == 2:
            self.profiler = StepProfiler(self.profile_dir)
            self.profiler.start()

    def after_step(self, steps_run: int, seconds: float, wait_sec: float) -> None:
        """``steps_run``: steps this process ran before this one (the first compiles, so it has no bubble)."""
        if self.pipeline and steps_run > 0:
            self.waits.append((wait_sec, seconds))
        self.profiled_sec += seconds if self.profiler is not None else 0.0
        if self.moe:  # each MoE block keeps the count of its last forward (core.model.moe)
            self.moe_pairs[0] += sum(float(m.dropped.asnumpy()) for m in self.moe)
            tokens = self.cfg.training.micro_batch_size * self.cfg.training.seq_len  # whole sequences per rank
            self.moe_pairs[1] += sum(m.top_k * tokens for m in self.moe)

    def record(self, rec: TrialRecorder, ranks: Ranks) -> None:
        """Into the summary's metrics; every rank joins the reductions, with MoE blocks or not (pipeline stages)."""
        if self.profiler is not None:
            rec.comm_time_share = comm_time_share(self.profiler.stop(), self.profiled_sec)
        if self.cfg.model.n_experts:
            dropped, routed = ranks.sum(self.moe_pairs)
            rec.moe_dropped_fraction = dropped / routed if routed else None
        rec.max_attention_logit = self.max_logit
        if self.waits:
            share = sum(w for w, _ in self.waits) / sum(dt for _, dt in self.waits)
            rec.pipeline_bubble = ranks.mean(share, holders=ranks.world_size)
