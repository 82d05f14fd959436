"""The checkpoint policy of one rank: when it saves (every ``checkpoint.interval`` steps, and at the end with
``checkpoint.at_end``), what (model and optimizer tensors, with the metadata a resume needs), in which format
(one file from one process; from several, each rank of the first replica writes its shards), and how a trial
resumes (``checkpoint.resume``: any checkpoint of any layout, read as the 1-process arrays, this rank cutting its
own shards from them), and which weights a run that does not resume starts from (``checkpoint.load_weights``: a
Hugging Face directory, ``core.ckpt.hf``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
from mindspore import Tensor, ops

from core.ckpt import hf, sharded, store
from core.ckpt.reader import load
from core.ckpt.store import CheckpointError
from core.config import ConfigError, ModelConfig, TrainConfig, to_dict
from core.config import hf as hf_config

log = logging.getLogger("core.train")


class CheckpointManager:
    def __init__(self, cfg: TrainConfig, *, root: Path, par, params: list, optimizer, barrier: Callable[[], None]):
        """``root``: the trial's checkpoints directory; ``par``: the ``Parallelized`` model (its mesh, placements
        and mirrored copies); ``params``: this rank's trainable parameters; ``barrier``: meets every rank."""
        self.cfg, self.root, self.par, self.params, self.optimizer = cfg, root, par, params, optimizer
        self.barrier = barrier
        self.pending: _Pending | None = None

    def _due(self, step: int) -> bool:
        interval = self.cfg.checkpoint.interval
        return bool(interval) and step % interval == 0

    def after_step(self, step: int, tokens: int) -> None:
        self.publish()  # an asynchronous save of an earlier step: every rank gets here after the same step
        if self._due(step):
            self.save(step, tokens)

    def at_end(self, step: int, tokens: int) -> None:
        """The checkpoint of a trial that ended normally (``checkpoint.at_end``), unless the interval just saved
        this step; an asynchronous save still being written is waited for and published."""
        if self.cfg.checkpoint.at_end and not self._due(step):
            self.save(step, tokens)
        self.publish()

    def save(self, step: int, tokens: int) -> None:
        """A full checkpoint from one process; from several, each rank of the first replica writes its shards
        (``core.ckpt.sharded``), which consolidate into the full one. With ``checkpoint.async_save`` the files
        are written by a thread and the checkpoint published by ``publish`` (after the next step)."""
        self.publish()
        dims, world = self.par.dims, self.par.dims.world_size
        meta = {
            "step": step,
            "data_position": step,
            "seed": self.cfg.seed,
            "tokens": tokens,
            "rng": {"data": "numpy default_rng([seed, step])", "init": "numpy default_rng([seed, name])"},
            "config": to_dict(self.cfg),
            "layout": dims.describe(),
        }
        keep, write = self.cfg.checkpoint.keep, None
        if dims.coords()["dp_replicate"] == 0:  # replicas hold identical shards
            tensors = self._tensors()
            if world == 1:

                def write():
                    log.info("checkpoint: %s", store.save_checkpoint(self.root, step, tensors, meta, keep=keep))

            else:
                placements = {k: sharded.placement_of(k, self.par.placements, v.shape) for k, v in tensors.items()}

                def write():
                    sharded.write_shard(self.root, step, dims.rank, tensors, placements)

        self.pending = _Pending(step, meta, write, background=self.cfg.checkpoint.async_save)
        if not self.cfg.checkpoint.async_save:
            self.publish()

    def publish(self) -> None:
        """Finish the pending save: wait for this rank's writer, then (several ranks) meet, rank 0 writes the
        index and renames the step into place, and meet again. Every rank calls this at the same points (after
        each step, at a save, at the end), so the barriers pair."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        pending.wait()
        dims, world = self.par.dims, self.par.dims.world_size
        if world == 1:
            return
        self.barrier()
        if dims.rank == 0:
            writers = [r for r in range(world) if dims.coords(r)["dp_replicate"] == 0]
            path = sharded.publish(self.root, pending.step, writers, pending.meta, keep=self.cfg.checkpoint.keep)
            log.info("checkpoint: %s (%d shards)", path, len(writers))
        self.barrier()

    def _tensors(self) -> dict:
        """This rank's model and optimizer tensors, copied to host memory (``np.array``: on CPU ``asnumpy`` may
        share the parameter's memory, which the next step overwrites while a background writer reads it)."""
        mirrors = self.par.mirrors  # copies of another stage's weights, saved there
        tensors = {f"model.{p.name}": np.array(p.asnumpy()) for p in self.params if p.name not in mirrors}
        tensors.update(
            {
                f"optim.{k}": np.array(v)
                for k, v in self.optimizer.state_dict().items()
                if not any(k.endswith(f".{m}") for m in mirrors)
            }
        )
        return tensors

    def resume(self, trial_dir: Path) -> tuple[int, int]:
        """(step, tokens) to continue from: 0, 0 without ``checkpoint.resume`` (or with ``auto`` and nothing saved
        yet); else the checkpoint's, with this rank's parameters and optimizer states loaded from it."""
        resume = self.cfg.checkpoint.resume
        if resume is None:
            return self._load_weights()
        path = store.latest_checkpoint(self.root) if resume == "auto" else Path(resume)
        if path is None:
            log.info("checkpoint.resume=auto: no checkpoint in %s yet, starting from step 0", trial_dir)
            return self._load_weights()
        tensors, meta = load(path)
        placements = self.par.placements
        for p in self.params:
            key = f"model.{p.name}"
            if key not in tensors or tuple(tensors[key].shape) != tuple(placements[p.name].full_shape):
                raise ConfigError(
                    "checkpoint.resume",
                    f"{path} does not match this model at {p.name}; resume with the model config it was written with",
                )
            ops.assign(p, Tensor(placements[p.name].shard(tensors[key])))  # not set_data: compiled graphs keep p
        state = {
            k[len("optim.") :]: sharded.placement_of(k, placements, v.shape).shard(v)
            for k, v in tensors.items()
            if k.startswith("optim.")
        }
        self.optimizer.load_state_dict(state)
        log.info("resumed from %s at step %d (written by %s)", path, meta["step"], meta.get("layout", "?"))
        return int(meta["step"]), int(meta.get("tokens", 0))

    def _load_weights(self) -> tuple[int, int]:
        """Step 0, with ``checkpoint.load_weights``'s weights when it names some: this rank's shards of each
        parameter, cut from the full tensor read one at a time."""
        spec = self.cfg.checkpoint.load_weights
        if spec is None:
            return 0, 0
        path, placements = hf_config.config_path(spec).parent, self.par.placements
        try:
            check_same_model(spec, self.cfg.model)
            hf.check_complete(path, self.cfg.model)
            by_name: dict[str, list] = {}  # a pipeline's mirrored copy shares its origin's name
            for p in self.params:
                by_name.setdefault(p.name, []).append(p)
            shapes = {name: placements[name].full_shape for name in by_name}
            for name, full in hf.read_params(path, list(shapes), self.cfg.model, shapes):
                for p in by_name[name]:
                    ops.assign(p, Tensor(placements[name].shard(full), p.dtype))
        except CheckpointError as e:
            raise ConfigError("checkpoint.load_weights", str(e)) from None
        log.info("weights from %s (%d tensors on this rank)", path, len(self.params))
        return 0, 0


class _Pending:
    """A save whose files are being written (by a thread with ``background``, else right here) and that is not
    published yet. ``write`` is None on a rank that writes nothing (a replica)."""

    def __init__(self, step: int, meta: dict, write: Callable[[], None] | None, *, background: bool):
        self.step, self.meta, self.error = step, meta, None
        self.thread = None
        if write is not None and background:
            self.thread = threading.Thread(target=self._run, args=(write,), name=f"ckpt-{step}", daemon=True)
            self.thread.start()
        elif write is not None:
            write()

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as e:  # noqa: BLE001 — re-raised on the main thread by wait()
            self.error = e

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise self.error


# What the weights do not fix: a run may change these and still start from a checkpoint's weights.
_FREE = {"name", "max_seq_len", "init_std", "moe_aux_loss_weight", "moe_capacity_factor"}


def check_same_model(spec: str, model: ModelConfig) -> None:
    """A ConfigError naming the first field in which ``model`` differs from the model of ``hf:<dir>``'s
    config."""
    for key, value in hf_config.read(spec).items():
        if key not in _FREE and getattr(model, key) != value:
            raise ConfigError(
                f"model.{key}",
                f"is {getattr(model, key)!r} but checkpoint.load_weights={spec} holds a model with {value!r}; "
                f"start from model={spec}",
            )
