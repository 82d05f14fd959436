"""The step: how one optimizer step's micro-batches become a loss and gradients on this rank. Three kinds, behind
the same two calls:

    run(inputs, targets, positions)      -> (mean loss of the micro-batches, or None on a rank without the loss;
                                             the sum of their gradients for this rank's parameters)
    evaluate(inputs, targets, positions) -> mean loss without gradients (None on a rank without the loss)

    AccumulationStep   forward and backward of each micro-batch in turn, gradients summed (here)
    SegmentedStep      full recompute under jit: each micro-batch as a chain of compiled segments
                       (``core.memory.segmented``)
    PipelineStep       the micro-batches interleaved across pipeline stages (``core.parallel.pipeline``)

``build_step`` picks one from the parallelized model and its recompute plan; the trainer never branches on it.
"""

from __future__ import annotations

from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from core.config import TrainConfig
from core.data import micro_batches
from core.memory.segmented import SegmentedStep
from core.memory.swap import ActivationSwap
from core.parallel.pipeline.runtime import PipelineStep
from core.runtime.graphs import compiled_if, each, jit
from core.training.parallelize import Parallelized


class AccumulationStep:
    def __init__(self, grad_fn, eval_fn, *, micro_batch_size: int, swap: ActivationSwap | None = None):
        """``grad_fn(inputs, targets, positions) -> (loss, grads)`` and ``eval_fn(...) -> loss`` of one
        micro-batch; ``swap``: the activation SWAP that each forward+backward runs under."""
        self.grad_fn, self.eval_fn, self.micro_batch_size, self.swap = grad_fn, eval_fn, micro_batch_size, swap
        self._add = jit(_add, source=True)

    def run(self, inputs: np.ndarray, targets: np.ndarray, positions: Tensor) -> tuple[float, tuple]:
        """inputs, targets (b, S) of this rank -> (mean of the micro-batches' losses, sum of their gradients)."""
        grads, losses = None, []
        for x, y in self._micro_batches(inputs, targets):
            if self.swap is None:
                loss, g = self.grad_fn(x, y, positions)
            else:
                with self.swap.step():
                    loss, g = self.grad_fn(x, y, positions)
            losses.append(float(loss.asnumpy()))
            grads = g if grads is None else self._add(ms.mutable(grads), ms.mutable(g))
        return float(np.mean(losses)), grads

    def evaluate(self, inputs: np.ndarray, targets: np.ndarray, positions: Tensor) -> float:
        return float(
            np.mean([float(self.eval_fn(x, y, positions).asnumpy()) for x, y in self._micro_batches(inputs, targets)])
        )

    def _micro_batches(self, inputs: np.ndarray, targets: np.ndarray):
        for x, y in micro_batches(inputs, targets, self.micro_batch_size):
            yield Tensor(x), Tensor(y)


def _add(acc, grads):
    return each(ops.add, acc, grads)


def build_step(par: Parallelized, cfg: TrainConfig, params: list, *, swap_dir: Path | None = None):
    """This rank's step: a pipeline's over ``par.stages``; full recompute's segments under jit; else gradient
    accumulation over ``par``'s loss (differentiated here), with activation SWAP of the model into ``swap_dir`` if
    ``memory.swap``."""
    jit_mode, mbs = cfg.training.mode == "jit", cfg.training.micro_batch_size
    if par.stages is not None:
        return PipelineStep(
            par.stages,
            preprocess=par.preprocess,
            losses=(par.loss, par.eval_loss),
            params=params,
            dims=par.dims,
            cfg=cfg,
        )
    blocks = par.recompute.blocks(len(par.model.layers))
    if par.recompute.segmented_full and min(len(blocks), len(par.model.layers) - 1) >= 1:
        return SegmentedStep(
            par.model,
            losses=(par.loss, par.eval_loss),
            params=params,
            recomputed=blocks,
            micro_batch_size=mbs,
            jit=jit_mode,
            jit_eval=cfg.eval_compiled,
        )
    swap = None
    if cfg.memory.swap:
        m = cfg.memory
        swap = ActivationSwap(
            par.model, swap_dir, device=cfg.device, layers=m.swap_layers, ops=m.swap_ops, prefetch=m.swap_prefetch
        )
    owners = (par.model, par.loss, par.eval_loss)
    grad_fn = ms.value_and_grad(par.train_loss, None, params)
    return AccumulationStep(
        compiled_if(jit_mode, owners=owners)(grad_fn),
        compiled_if(cfg.eval_compiled, owners=owners)(par.validation_loss),
        micro_batch_size=mbs,
        swap=swap,
    )
