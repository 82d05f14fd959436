"""The training loop of one rank: data -> GPT -> fused linear cross-entropy -> grads -> sync and clip ->
optimizer, with the trial's budgets, NaN checks, validation and checkpoints.

``Trainer(cfg, rec)`` builds everything: the cluster, the datasets, ``parallelize(model, dims, cfg)`` (the one
call that makes the model this rank's part of the mesh), the optimizer, the step (``core.training.step``), the
gradient sync and the checkpoint manager. ``run()`` is the loop; it never branches on a degree.

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

import mindspore as ms
from mindspore import Tensor

from core.ckpt.manager import CheckpointManager
from core.config import TrainConfig
from core.data import datasets_for
from core.memory.estimate import estimate_memory_bytes
from core.memory.probe import peak_rss_bytes
from core.model.flops import flops_per_token
from core.model.gpt import GPT
from core.optim import build_optimizer, lr_at
from core.parallel.block_norms import BlockNorms
from core.parallel.comm import init_distributed
from core.parallel.dims import ParallelDims
from core.parallel.grads import GradientSync
from core.runtime.cluster import node_ranks
from core.runtime.reference_rate import reference_flops_per_sec
from core.runtime.settings import configure, cpu_kernels
from core.training.balance import ExpertBalance
from core.training.parallelize import parallelize
from core.training.ranks import Ranks
from core.training.stats import StepStats
from core.training.step import build_step
from core.trial.contract import Exit, NonFinite, OutOfMemory, OutOfTime, oom_reason
from core.trial.recorder import TrialRecorder

log = logging.getLogger("core.train")


class Trainer:
    def __init__(self, cfg: TrainConfig, rec: TrialRecorder, *, limit_bytes: int | None = None):
        """Build this rank's part of the trial (marks the start-up phases ``cluster`` and ``build`` on ``rec``);
        ``limit_bytes``: the memory budget this process enforces itself (CPU), None where the device does."""
        self.cfg, self.rec, self.limit_bytes, self.trial_dir = cfg, rec, limit_bytes, rec.trial_dir
        ms.set_device(cfg.device)
        ms.set_seed(cfg.seed)
        self.dist = init_distributed()
        rec.mark("cluster")
        self.dims = ParallelDims.from_config(cfg.parallel, self.dist.rank, self.dist.world_size)
        self.ranks = Ranks(self.dist.world_size, self.dims.pp)
        configure(cfg, node_ranks(self.dist.world_size)[1])
        self.train_data, self.val_data = datasets_for(cfg)
        if cfg.compute_precision != cfg.training.precision:  # bf16 on CPU
            log.info(
                "training.precision=%s runs %s here (TrainConfig.compute_precision): its values, "
                "about fp32's speed and memory",
                cfg.training.precision,
                cfg.compute_precision,
            )
        self.par = parallelize(GPT(cfg.model, seed=cfg.seed), self.dims, cfg)
        self.positions = Tensor(self.par.positions)
        self.weights = list(self.par.model.trainable_params())  # differentiated; the frozen are not among them
        self.masters = self.par.masters(self.weights)  # ZeRO-1's shards, else the weights themselves
        self.params = self.masters.params  # what the optimizer updates, clipping reads and checkpoints save
        fused = cpu_kernels()
        self.optimizer = build_optimizer(
            [(p.name, p) for p in self.params],
            cfg.optim,
            placements=self.par.placements,
            group=self.par.groups["shard"],
            fused=fused,
        )
        self.step = build_step(self.par, cfg, self.weights, swap_dir=self.trial_dir / "swap" / f"rank_{self.dist.rank}")
        self.sync = GradientSync(
            self.params,
            placements=self.par.placements,
            dims=self.dims,
            groups=self.par.groups,
            micro_batches=cfg.grad_accum_steps,
            max_norm=cfg.optim.grad_clip,
            tied=self.par.tied,
            mirrors=self.par.mirrors,
            fused=fused,
        )
        self.block_norms = None
        if cfg.training.health_interval:
            self.block_norms = BlockNorms(
                self.params,
                placements=self.par.placements,
                dims=self.dims,
                groups=self.par.groups,
                n_layers=cfg.model.n_layers,
                tied_embeddings=cfg.model.tie_embeddings,
                mtp_layers=cfg.model.mtp_layers,
                mirrors=self.par.mirrors,
            )
        self.balance = ExpertBalance(cfg, self.par.model, self.ranks)
        self.checkpoints = CheckpointManager(
            cfg,
            root=self.trial_dir / "checkpoints",
            par=self.par,
            params=self.params + self.balance.biases + self._frozen(),
            optimizer=self.optimizer,
            barrier=self.ranks.barrier,
        )
        self.stats = StepStats(
            cfg,
            model=self.par.model,
            profile_dir=self.trial_dir / "profile" / f"rank_{self.dist.rank}",
            pipeline=self.par.stages is not None,
        )
        self.metrics = open(self.trial_dir / "metrics.jsonl", "a") if self.dist.rank == 0 else None
        self.attention_logit: tuple[float, str] | None = None  # the last step's and its block (max_attention_logit)
        rec.flops_per_token = flops_per_token(cfg.model, cfg.training.seq_len)
        rec.estimated_memory_bytes = estimate_memory_bytes(cfg)
        rec.state_bytes = self._state_bytes()
        rec.mark("build")

    def run(self) -> tuple[Exit, str]:
        """Steps until the budget ends, then validation, the final checkpoint and MFU's reference rate."""
        start = step = self._resume()
        try:
            while self._budget_left(step):
                self.stats.before_step(step - start)
                t0 = time.perf_counter()
                loss, grad_norm, lr = self._train_step(step)
                dt = time.perf_counter() - t0
                self.stats.after_step(step - start, dt, getattr(self.step, "wait_sec", 0.0))
                step += 1
                self._after_step(step, loss, grad_norm, lr, dt)
            self.stats.record(self.rec, self.ranks)
            self._evaluate(step)
            self.checkpoints.at_end(step, self.rec.tokens)
            self._reference_rate()
            self.ranks.leave()  # nobody leaves a peer mid-collective
        finally:
            if self.metrics:
                self.metrics.close()
        losses = self.rec.losses
        return Exit.OK, f"ok: {step} steps, final loss {losses[-1]:.4f}" if losses else "ok"

    def _budget_left(self, step: int) -> bool:
        """Whether step ``step`` runs; raises OutOfTime when the wall budget ends before the step budget."""
        max_steps, wall = self.cfg.trial.max_steps, self.cfg.trial.max_wall_time_sec
        if max_steps is not None and step >= max_steps:
            return False
        if wall is None or time.time() - self.rec.started < wall:
            return True
        if max_steps is None:
            return False  # a wall-only budget, used in full: that is success
        raise OutOfTime(
            f"timeout: wall budget trial.max_wall_time_sec={wall:g} ended at step {step}/{max_steps}; raise it or "
            "lower trial.max_steps"
        )

    def _after_step(self, step: int, loss: float, grad_norm: float, lr: float, seconds: float) -> None:
        """Record, check memory, log; validate and checkpoint when their interval comes. ``step``: steps done."""
        t = self.cfg.training
        self.rec.record_step(loss, grad_norm, t.global_batch_size * t.seq_len, seconds)
        self._check_memory()
        self._log_step(step, loss, grad_norm, lr, seconds)
        if t.eval_interval and step % t.eval_interval == 0:
            self._evaluate(step)
        self.checkpoints.after_step(step, self.rec.tokens)

    def _resume(self) -> int:
        step, tokens = self.checkpoints.resume(self.trial_dir)
        if step:
            self.rec.steps, self.rec.tokens = step, tokens
        self.masters.publish()  # the weights from the masters loaded (or initialised from them: the same)
        return step

    def _train_step(self, step: int) -> tuple[float, float, float]:
        cfg, t, dims = self.cfg, self.cfg.training, self.dims
        window = t.seq_len + cfg.model.mtp_layers  # MTP's targets reach D tokens further (core.model.mtp)
        rows = self.train_data.batch(
            step, t.global_batch_size, window, cfg.seed, rank=dims.index("batch"), world_size=dims.size("batch")
        )  # (G / batch ranks, S + 1 + D)
        loss_value, grads = self.step.run(*self.par.local_tokens(rows, training=True), self.positions)
        grads, norm, scale = self.sync(self.masters.reduce(grads))
        loss_value = self.ranks.mean(loss_value)  # every rank must take the same decision on NaN
        norm_value = float(norm.asnumpy())
        if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
            raise NonFinite(
                f"nan: loss {loss_value} / grad norm {norm_value} at step {step + 1}; lower optim.lr "
                f"(now {cfg.optim.lr:g}), raise optim.warmup_steps or keep optim.grad_clip on"
            )
        self.attention_logit = self.stats.attention_logit(step, self.ranks)  # every rank; may stop the trial
        lr = lr_at(step, cfg.optim, cfg.trial.max_steps)
        health = self.block_norms is not None and (step + 1) % t.health_interval == 0
        grad_blocks = self.block_norms(grads, self.sync.scale) if health else None
        self.optimizer.step(grads, lr, scale)
        self.masters.publish()
        if self.balance.active:  # every rank: a collective
            self.balance.after_step()
        if health:  # every rank: a collective
            param_blocks = self.block_norms(self.params)
            self._write({"step": step + 1, "grad_norm_blocks": grad_blocks, "param_norm_blocks": param_blocks})
        return loss_value, norm_value, lr

    def _evaluate(self, step: int) -> None:
        """Mean loss over fixed validation windows: eval_batches global batches, whatever the layout, so that
        runs with different layouts or micro-batch sizes report comparable numbers."""
        t, dims = self.cfg.training, self.dims
        rows = self.val_data.eval_batches(
            t.eval_batches, t.global_batch_size, t.seq_len, rank=dims.index("batch"), world_size=dims.size("batch")
        ).reshape(-1, t.seq_len + 1)
        inputs, targets = self.par.local_tokens(rows)  # (n * G / batch ranks, S / cp)
        self.rec.val_loss = self.ranks.mean(self.step.evaluate(inputs, targets, self.positions))
        self._write({"step": step, "val_loss": self.rec.val_loss})

    def _check_memory(self) -> None:
        """A peak that came and went between two watchdog polls still counts (VmHWM is a high-water mark)."""
        peak = peak_rss_bytes()
        if self.limit_bytes is not None and peak is not None and peak > self.limit_bytes:
            raise OutOfMemory(oom_reason("rank peak", peak, self.limit_bytes))

    def _reference_rate(self) -> None:
        """MFU's fixed denominator (``core.runtime.reference_rate``): per host on CPU, whose cores its ranks share."""
        try:
            self.rec.reference_flops_per_sec = reference_flops_per_sec(self.cfg.device)
        except (OSError, subprocess.CalledProcessError, ValueError) as e:  # mfu stays null, and says why
            log.warning("mfu: no reference rate for this machine (%s); mfu is null", e)
        world, local = self.dist.world_size, node_ranks(self.dist.world_size)[1]
        self.rec.compute_units = world // local if self.cfg.device == "CPU" else world

    def _frozen(self) -> list:
        """This rank's frozen weights (``Parallelized.frozen``): saved and loaded with the rest."""
        return [p for p in self.par.model.get_parameters() if p.name in self.par.frozen]

    def _state_bytes(self) -> dict:
        """Bytes this rank holds for parameters, their gradients and the optimizer states (counted, not measured:
        what sharding divides)."""
        grads = sum(p.size * p.itemsize for p in self.weights)
        masters = sum(self.params[i].size * self.params[i].itemsize for i in self.masters.sharded)
        params = grads + masters + sum(p.size * p.itemsize for p in self._frozen())
        optim = sum(v.nbytes for v in self.optimizer.state_dict().values())
        return {"params": int(params), "grads": int(grads), "optimizer": int(optim)}

    def _log_step(self, step: int, loss: float, grad_norm: float, lr: float, seconds: float) -> None:
        t = self.cfg.training
        if step % t.log_interval == 0 or step == self.cfg.trial.max_steps:
            self._write(
                {
                    "step": step,
                    "loss": loss,
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "step_time_ms": seconds * 1000,
                    "tokens": self.rec.tokens,
                    "elapsed_sec": time.time() - self.rec.started,
                    "peak_memory_bytes": peak_rss_bytes(),
                }
                | (
                    dict(zip(("max_attention_logit", "max_attention_logit_block"), self.attention_logit, strict=True))
                    if self.attention_logit is not None
                    else {}
                )
            )

    def _write(self, row: dict) -> None:
        """One line of ``metrics.jsonl`` and of the log (rank 0 only)."""
        if not self.metrics:
            return
        self.metrics.write(json.dumps(row) + "\n")
        self.metrics.flush()
        if "loss" in row:
            log.info(
                "step %d  loss %.4f  lr %.2e  grad_norm %.3f  %.0f ms",
                row["step"],
                row["loss"],
                row["lr"],
                row["grad_norm"],
                row["step_time_ms"],
            )
        elif "val_loss" in row:
            log.info("step %d  val_loss %.4f", row["step"], row["val_loss"])
        else:  # run health: the block whose gradient is largest says where to look first
            worst = max(row["grad_norm_blocks"], key=row["grad_norm_blocks"].get)
            log.info(
                "step %d  largest block gradient norm: %s %.3g", row["step"], worst, row["grad_norm_blocks"][worst]
            )
