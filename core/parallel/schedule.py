"""The micro-batch schedule of one optimizer step: what the trainer's step calls to get a loss and gradients.

``GradientAccumulation`` runs forward and backward on each micro-batch in turn and sums the gradients; the
pipeline schedules (GPipe, 1F1B, interleaved) replace it with the same interface, interleaving micro-batches
across stages.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor


class GradientAccumulation:
    def __init__(self, grad_fn, micro_batch_size: int):
        """``grad_fn(inputs, targets, positions) -> (loss, grads)`` for one micro-batch."""
        self.grad_fn, self.micro_batch_size = grad_fn, micro_batch_size
        self._add = ms.jit(_add)

    def run(self, inputs: np.ndarray, targets: np.ndarray, positions: Tensor) -> tuple[float, tuple]:
        """inputs, targets (b, S) of this rank -> (mean of the micro-batches' losses, sum of their gradients)."""
        m = self.micro_batch_size
        grads, losses = None, []
        for s in range(0, len(inputs), m):
            loss, g = self.grad_fn(Tensor(inputs[s:s + m]), Tensor(targets[s:s + m]), positions)
            losses.append(float(loss.asnumpy()))
            grads = g if grads is None else self._add(ms.mutable(grads), ms.mutable(g))
        return float(np.mean(losses)), grads


def _add(acc, grads):
    return tuple(a + g for a, g in zip(acc, grads))
