"""The training loop of one rank: data -> GPT -> fused linear cross-entropy -> grads -> sync and clip ->
optimizer, with the trial's budgets, NaN checks, validation and checkpoints.

Parallelism is set up in one call, ``parallelize(model, dims, cfg)``; the loop never branches on a degree. It
asks the ``Parallelized`` model for this rank's tokens, a schedule (micro-batches, or a pipeline) for the loss and
gradients of a step, and ``GradientSync`` for the gradients of the global mean loss, clipped.

Determinism: the batch of step k is a pure function of (seed, k) and the weights of the seed, so the same seed
gives the same losses, a resumed run continues exactly (on any layout: checkpoints consolidate), and the ranks
of every layout together see the single-process global batch (rows by batch-axis rank, sequence positions by
context-parallel rank).
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import time
from pathlib import Path
from typing import Optional

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from core import checkpoint, execution, memory, rss, sharded_checkpoint
from core.config import ConfigError, TrainConfig, to_dict
from core.data import TokenDataset, default_corpus
from core.model import GPT, flops_per_token
from core.model.moe import moe_layers
from core.optim import build_optimizer, lr_at
from core.parallel import init_distributed, node_ranks
from core.parallel.dims import ParallelDims
from core.parallel.grads import GradientSync
from core.parallel.parallelize import parallelize
from core.parallel.schedule import build_schedule
from core.profiling import StepProfiler, comm_time_share
from core.reference_rate import reference_flops_per_sec
from core.trial import Exit, NonFinite, OutOfMemory, TrialRecorder

log = logging.getLogger("core.train")


class Trainer:
    def __init__(self, cfg: TrainConfig, rec: TrialRecorder, limit_bytes: Optional[int] = None):
        self.cfg, self.rec, self.limit_bytes = cfg, rec, limit_bytes
        self.trial_dir = rec.trial_dir

    # ---- setup -------------------------------------------------------------------------------------------
    def _setup(self) -> None:
        cfg = self.cfg
        ms.set_device(cfg.device)
        ms.set_seed(cfg.seed)
        self.dist = init_distributed()
        self.rec.mark("cluster")
        self.dims = ParallelDims.from_config(cfg.parallel, self.dist.rank, self.dist.world_size)
        execution.configure(cfg, node_ranks(self.dist.world_size)[1])
        self.train_data, self.val_data = self._datasets()
        self.par = parallelize(GPT(cfg.model, seed=cfg.seed), self.dims, cfg)
        self.model = self.par.model
        self.positions = Tensor(self.par.positions)
        self.params = list(self.model.trainable_params())
        names = [p.name for p in self.params]
        fused = execution.cpu_kernels()
        self.optimizer = build_optimizer([(p.name, p) for p in self.params], cfg.optim,
                                         placements=self.par.placements, group=self.par.groups["shard"], fused=fused)
        self.rec.flops_per_token = flops_per_token(cfg.model, cfg.training.seq_len)
        self.rec.estimated_memory_bytes = memory.estimate_memory_bytes(cfg)

        self.schedule = build_schedule(self.par, cfg, self.params, self._loss, self._eval_loss,
                                       swap_dir=self.trial_dir / "swap" / f"rank_{self.dist.rank}")
        self.sync = GradientSync(names, [tuple(p.shape) for p in self.params], self.par.placements, self.dims,
                                 self.par.groups, cfg.grad_accum_steps, cfg.optim.grad_clip, self.par.tied,
                                 self.par.mirrors, fused=fused)
        self.rec.state_bytes = self._state_bytes()
        self.moe = moe_layers(self.model)
        self.moe_pairs = [0.0, 0.0]  # (token, choice) pairs dropped / routed, in each step's last micro-batch
        self.rec.mark("build")

    def _state_bytes(self) -> dict:
        """Bytes this rank holds for parameters, their gradients and the optimizer states (counted, not measured:
        what sharding divides)."""
        params = sum(p.size * p.itemsize for p in self.params)
        optim = sum(v.nbytes for k, v in self.optimizer.state_dict().items())
        return {"params": int(params), "grads": int(params), "optimizer": int(optim)}

    def _datasets(self) -> tuple[TokenDataset, TokenDataset]:
        d = self.cfg.data
        if d.train_path is None:
            train_path, val_path = default_corpus()
        else:
            train_path, val_path = Path(d.train_path), Path(d.val_path) if d.val_path else None
        train = TokenDataset(train_path, dtype=d.token_dtype)
        val = TokenDataset(val_path, dtype=d.token_dtype) if val_path else train
        vocab = self.cfg.model.vocab_size
        for ds in {id(train): train, id(val): val}.values():
            if ds.max_token() >= vocab:
                raise ConfigError("model.vocab_size", f"{vocab} is too small for {ds.path} (max token id "
                                                      f"{ds.max_token()}); raise it or use a matching tokenizer")
        return train, val

    def _loss(self, inputs, targets, positions):
        hidden = self.model(inputs, positions)                           # (B, S, D)
        return self.par.loss(hidden, self.model.head_weight(), targets)

    def _eval_loss(self, inputs, targets, positions):
        hidden = self.model(inputs, positions)
        return self.par.eval_loss(hidden, self.model.head_weight(), targets)

    # ---- the loop ----------------------------------------------------------------------------------------
    def run(self) -> tuple[Exit, str]:
        self._setup()
        cfg, t = self.cfg, self.cfg.training
        start_step = self._maybe_resume()
        max_steps, wall = cfg.trial.max_steps, cfg.trial.max_wall_time_sec
        tokens_per_step = t.global_batch_size * t.seq_len
        metrics_file = open(self.trial_dir / "metrics.jsonl", "a") if self.dist.rank == 0 else None
        step = start_step
        profiler, profiled_sec = None, 0.0
        waits: list[tuple[float, float]] = []  # (seconds blocked in pipeline receives, step seconds)
        try:
            while max_steps is None or step < max_steps:
                if wall is not None and time.time() - self.rec.started >= wall:
                    if max_steps is None:
                        break  # a wall-only budget, used in full: that is success
                    return Exit.TIMEOUT, (f"timeout: wall budget trial.max_wall_time_sec={wall:g} ended at step "
                                          f"{step}/{max_steps}; raise it or lower trial.max_steps")
                if t.profile and profiler is None and step - start_step == 2:  # after compile and warm-up
                    profiler = StepProfiler(self.trial_dir / "profile" / f"rank_{self.dist.rank}")
                    profiler.start()
                t0 = time.perf_counter()
                loss, grad_norm, lr = self._train_step(step)
                dt = time.perf_counter() - t0
                if self.par.stages is not None and step > start_step:  # the first step compiles
                    waits.append((self.schedule.wait_sec, dt))
                profiled_sec += dt if profiler is not None else 0.0
                step += 1
                self.rec.record_step(loss, grad_norm, tokens_per_step, dt)
                self._check_memory()
                if metrics_file and (step % t.log_interval == 0 or step == max_steps):
                    self._log(metrics_file, {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                                             "step_time_ms": dt * 1000, "tokens": self.rec.tokens,
                                             "elapsed_sec": time.time() - self.rec.started,
                                             "peak_memory_bytes": rss.peak_rss_bytes()})
                if t.eval_interval and step % t.eval_interval == 0:
                    self._evaluate(step, metrics_file)
                if cfg.checkpoint.interval and step % cfg.checkpoint.interval == 0:
                    self._save(step)
            if profiler is not None:
                self.rec.comm_time_share = comm_time_share(profiler.stop(), profiled_sec)
            if cfg.model.n_experts:  # every rank joins the sum, with MoE blocks or not (pipeline stages)
                dropped, routed = self._sum_over_ranks(self.moe_pairs)
                self.rec.moe_dropped_fraction = dropped / routed if routed else None
            if waits:
                share = sum(w for w, _ in waits) / sum(dt for _, dt in waits)
                self.rec.pipeline_bubble = self._mean_over_ranks(share, holders=self.dist.world_size)
            self._evaluate(step, metrics_file)
            already_saved = cfg.checkpoint.interval and step % cfg.checkpoint.interval == 0
            if cfg.checkpoint.at_end and not already_saved:
                self._save(step)
            self._reference_rate()
            self._barrier()  # nobody leaves a peer mid-collective
        finally:
            if metrics_file:
                metrics_file.close()
        return Exit.OK, f"ok: {step} steps, final loss {self.rec.losses[-1]:.4f}" if self.rec.losses else "ok"

    def _train_step(self, step: int) -> tuple[float, float, float]:
        cfg, t, dims = self.cfg, self.cfg.training, self.dims
        rows = self.train_data.batch(step, t.global_batch_size, t.seq_len, cfg.seed, rank=dims.index("batch"),
                                     world_size=dims.size("batch"))            # (G / batch ranks, S + 1)
        loss_value, grads = self.schedule.run(*self.par.local_tokens(rows), self.positions)
        grads, norm, scale = self.sync(grads)
        loss_value = self._mean_over_ranks(loss_value)  # every rank must take the same decision on NaN
        norm_value = float(norm.asnumpy())
        if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
            raise NonFinite(f"nan: loss {loss_value} / grad norm {norm_value} at step {step + 1}; lower optim.lr "
                            f"(now {cfg.optim.lr:g}), raise optim.warmup_steps or keep optim.grad_clip on")
        if self.moe:  # each MoE block keeps the count of its last forward (core.model.moe)
            self.moe_pairs[0] += sum(float(m.dropped.asnumpy()) for m in self.moe)
            tokens = t.micro_batch_size * t.seq_len  # every rank routes whole sequences (core.parallel.expert_parallel)
            self.moe_pairs[1] += sum(m.top_k * tokens for m in self.moe)
        lr = lr_at(step, cfg.optim, cfg.trial.max_steps)
        self.optimizer.step(grads, lr, scale)
        return loss_value, norm_value, lr

    def _reference_rate(self) -> None:
        """MFU's fixed denominator (core.reference_rate): per host on CPU, whose cores its ranks share."""
        try:
            self.rec.reference_flops_per_sec = reference_flops_per_sec(self.cfg.device)
        except (OSError, subprocess.CalledProcessError, ValueError) as e:  # mfu stays null, and says why
            log.warning("mfu: no reference rate for this machine (%s); mfu is null", e)
        local = node_ranks(self.dist.world_size)[1]
        self.rec.compute_units = self.dist.world_size // local if self.cfg.device == "CPU" else self.dist.world_size

    def _mean_over_ranks(self, value: Optional[float], holders: Optional[int] = None) -> float:
        """A loss averaged over the ranks that have one (``None``: a pipeline stage without the loss; by default
        the last stage's ranks have one). Ranks that repeat a value (tensor-parallel peers) repeat it equally
        often, so this is the mean over the loss ranks."""
        if self.dist.world_size == 1:
            return value
        holders = holders or self.dist.world_size // self.dims.pp
        return self._sum_over_ranks([0.0 if value is None else value])[0] / holders

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        if self.dist.world_size == 1:
            return values
        return [float(v) for v in ops.AllReduce()(Tensor(np.asarray(values, np.float32))).asnumpy()]

    def _barrier(self) -> None:
        self._sum_over_ranks([0.0])

    def _check_memory(self) -> None:
        """A peak that came and went between two watchdog polls still counts (VmHWM is a high-water mark)."""
        peak = rss.peak_rss_bytes()
        if self.limit_bytes is not None and peak is not None and peak > self.limit_bytes:
            raise OutOfMemory(f"out of memory: rank peak {peak / 2**20:.0f} MiB passed memory.limit_gb="
                              f"{self.limit_bytes / memory.GiB:g}; lower training.micro_batch_size, enable "
                              "memory.recompute or raise the limit")

    def _evaluate(self, step: int, metrics_file) -> None:
        """Mean loss over fixed validation windows: eval_batches global batches, whatever the layout, so that
        runs with different layouts or micro-batch sizes report comparable numbers."""
        t, dims = self.cfg.training, self.dims
        rows = self.val_data.eval_batches(t.eval_batches, t.global_batch_size, t.seq_len, rank=dims.index("batch"),
                                          world_size=dims.size("batch")).reshape(-1, t.seq_len + 1)
        inputs, targets = self.par.local_tokens(rows)                    # (n * G / batch ranks, S / cp)
        value = self._mean_over_ranks(self.schedule.evaluate(inputs, targets, self.positions))
        self.rec.val_loss = value
        if metrics_file:
            self._log(metrics_file, {"step": step, "val_loss": value})

    @staticmethod
    def _log(metrics_file, row: dict) -> None:
        metrics_file.write(json.dumps(row) + "\n")
        metrics_file.flush()
        if "loss" in row:
            log.info("step %d  loss %.4f  lr %.2e  grad_norm %.3f  %.0f ms", row["step"], row["loss"], row["lr"],
                     row["grad_norm"], row["step_time_ms"])
        else:
            log.info("step %d  val_loss %.4f", row["step"], row["val_loss"])

    # ---- checkpoints -------------------------------------------------------------------------------------
    def _save(self, step: int) -> None:
        """A full checkpoint from one process; from several, each rank of the first replica writes its shards
        (core.sharded_checkpoint), which consolidate into the full one."""
        meta = {"step": step, "data_position": step, "seed": self.cfg.seed, "tokens": self.rec.tokens,
                "rng": {"data": "numpy default_rng([seed, step])", "init": "numpy default_rng([seed, name])"},
                "config": to_dict(self.cfg), "layout": self.dims.describe()}
        root = self.trial_dir / "checkpoints"
        writes = self.dims.coords()["dp_replicate"] == 0  # replicas hold identical shards
        if writes:
            mirrors = self.par.mirrors  # copies of another stage's weights, saved there
            tensors = {f"model.{p.name}": p.asnumpy() for p in self.params if p.name not in mirrors}
            tensors.update({f"optim.{k}": v for k, v in self.optimizer.state_dict().items()
                            if not any(k.endswith(f".{m}") for m in mirrors)})
            if self.dist.world_size == 1:
                path = checkpoint.save_checkpoint(root, step, tensors, meta, keep=self.cfg.checkpoint.keep)
                log.info("checkpoint: %s", path)
                return
            placements = {k: sharded_checkpoint.placement_of(k, self.par.placements, v.shape)
                          for k, v in tensors.items()}
            sharded_checkpoint.write_shard(root, step, self.dist.rank, tensors, placements)
        self._barrier()
        if self.dist.rank == 0:
            writers = [r for r in range(self.dist.world_size) if self.dims.coords(r)["dp_replicate"] == 0]
            path = sharded_checkpoint.publish(root, step, writers, meta, keep=self.cfg.checkpoint.keep)
            log.info("checkpoint: %s (%d shards)", path, len(writers))
        self._barrier()

    def _maybe_resume(self) -> int:
        """Resume from a checkpoint of any layout: it is read as the full arrays of the 1-process layout and
        this rank cuts its own shards from them."""
        resume = self.cfg.checkpoint.resume
        if resume is None:
            return 0
        path = checkpoint.latest_checkpoint(self.trial_dir / "checkpoints") if resume == "auto" else Path(resume)
        if path is None:
            log.info("checkpoint.resume=auto: no checkpoint in %s yet, starting from step 0", self.trial_dir)
            return 0
        tensors, meta = checkpoint.load_checkpoint(path)
        placements = self.par.placements
        for p in self.params:
            key = f"model.{p.name}"
            if key not in tensors or tuple(tensors[key].shape) != tuple(placements[p.name].full_shape):
                raise ConfigError("checkpoint.resume", f"{path} does not match this model at {p.name}; resume "
                                                       "with the model config it was written with")
            ops.assign(p, Tensor(placements[p.name].shard(tensors[key])))  # not set_data: compiled graphs keep p
        state = {k[len("optim."):]: sharded_checkpoint.placement_of(k, placements, v.shape).shard(v)
                 for k, v in tensors.items() if k.startswith("optim.")}
        self.optimizer.load_state_dict(state)
        self.rec.steps, self.rec.tokens = meta["step"], meta.get("tokens", 0)
        log.info("resumed from %s at step %d (written by %s)", path, meta["step"], meta.get("layout", "?"))
        return int(meta["step"])
