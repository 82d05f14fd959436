"""The micro-batch schedule of one optimizer step: what the trainer's step calls to get a loss and gradients.

``GradientAccumulation`` runs forward and backward on each micro-batch in turn and sums the gradients; full
recompute under jit runs each micro-batch as a chain of compiled segments (``core.recompute.SegmentedStep``); with a
pipeline, ``PipelineSchedule`` (core.parallel.pipeline) interleaves micro-batches across stages (GPipe, 1F1B,
interleaved 1F1B) behind the same two calls:

    run(inputs, targets, positions)      -> (mean loss of the micro-batches, or None on a rank without the loss;
                                             the sum of their gradients for this rank's parameters)
    evaluate(inputs, targets, positions) -> mean loss without gradients (None on a rank without the loss)
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from core import execution


class GradientAccumulation:
    def __init__(self, grad_fn, eval_fn, micro_batch_size: int, swap=None):
        """``grad_fn(inputs, targets, positions) -> (loss, grads)`` and ``eval_fn(...) -> loss`` of one
        micro-batch; ``swap``: a ``core.swap.ActivationSwap`` that each forward+backward runs under."""
        self.grad_fn, self.eval_fn, self.micro_batch_size, self.swap = grad_fn, eval_fn, micro_batch_size, swap
        self._add = execution.jit(_add, source=True)

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
        return float(np.mean([float(self.eval_fn(x, y, positions).asnumpy())
                              for x, y in self._micro_batches(inputs, targets)]))

    def _micro_batches(self, inputs, targets):
        m = self.micro_batch_size
        for s in range(0, len(inputs), m):
            yield Tensor(inputs[s:s + m]), Tensor(targets[s:s + m])


def _add(acc, grads):
    return execution.each(ops.add, acc, grads)


def build_schedule(par, cfg, params: list, loss_fn, eval_fn, swap_dir=None):
    """The schedule of this rank: a pipeline's over ``par.stages``; full recompute's segments under jit
    (core.recompute); else gradient accumulation over ``loss_fn(inputs, targets, positions)`` (differentiated
    here) and ``eval_fn``, with activation SWAP of ``par.model`` into ``swap_dir`` if ``memory.swap``."""
    from core.config_rules import eval_compiled, segmented_recompute
    from core.recompute import SegmentedStep, recomputed_blocks

    jit = cfg.training.mode == "jit"
    jit_eval = eval_compiled(cfg.training.mode, cfg.execution.eval_mode, cfg.training.eval_interval,
                             cfg.trial.max_steps)
    if par.stages is None:
        n = len(par.model.layers)
        blocks = recomputed_blocks(n, cfg.memory.recompute_layers)
        if cfg.memory.recompute == "full" and segmented_recompute(cfg.training.mode, False) and min(len(blocks), n - 1) >= 1:
            return SegmentedStep(par.model, par.loss, par.eval_loss, params, blocks, cfg.training.micro_batch_size,
                                 jit, jit_eval)
        grad_fn = ms.value_and_grad(loss_fn, None, params)
        swap = None
        if cfg.memory.swap:
            from core.swap import ActivationSwap

            mem = cfg.memory
            swap = ActivationSwap(par.model, swap_dir, cfg.device, mem.swap_layers, mem.swap_ops, mem.swap_prefetch)
        owners = (par.model, par.loss, par.eval_loss)
        return GradientAccumulation(execution.compiled_if(jit, owners=owners)(grad_fn),
                                    execution.compiled_if(jit_eval, owners=owners)(eval_fn),
                                    cfg.training.micro_batch_size, swap)
    from core.parallel.pipeline import PipelineSchedule

    p, dims = cfg.parallel, par.dims
    return PipelineSchedule(par.stages, par.loss, par.eval_loss, params, dims.group_ranks("pp"), p.pp_schedule,
                            cfg.grad_accum_steps, cfg.training.micro_batch_size, p.pp_virtual, jit,
                            jit_eval, seq_split=dims.tp if dims.sp else 1)
