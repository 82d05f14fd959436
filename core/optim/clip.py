"""Global gradient-norm clipping (Pascanu et al. 2013), the form PyTorch's ``clip_grad_norm_`` uses.

The norm is the L2 norm of all gradients concatenated. Every gradient is multiplied by
``min(1, max_norm / (norm + 1e-6))`` (the 1e-6 guards a zero norm), so below the threshold the gradients are
multiplied by exactly 1.0 and stay bit-identical. Only ops with CPU kernels are used (``mint.norm`` has none in
MindSpore 2.10), and there is no Python branch on a Tensor value, so the function traces inside ``mindspore.jit``.
"""

from __future__ import annotations

from typing import Sequence

import mindspore as ms
from mindspore import Tensor, ops

from core import execution

NORM_EPS = 1e-6  # guards a zero norm (also core.parallel.grads)


def sum_of_squares(x: Tensor) -> Tensor:
    """sum(x^2) over every element, a float32 scalar: rows first, then their sums.

    MindSpore 2.10's CPU ReduceSum over all axes of a matrix takes its slow path: 96 ms for the 32 M gradients of
    model=medium, against 8 ms reducing the last axis first and then the rest (same value to the last bit there;
    float32 ``L2Loss`` took 17 ms but lost 1e-3 relative). Measured under jit, 2026-12-01."""
    return ops.sum(ops.sum(ops.square(x.reshape(-1, x.shape[-1])), -1))


def global_grad_norm(grads: Sequence[Tensor]) -> Tensor:
    """L2 norm over all gradients, a float32 scalar Tensor."""
    total = sum_of_squares(grads[0])
    for g in grads[1:]:
        total = total + sum_of_squares(g)
    return ops.sqrt(total)


def clip_grad_norm(grads: Sequence[Tensor], max_norm: float) -> tuple[tuple[Tensor, ...], Tensor]:
    """Scale ``grads`` so their global L2 norm is at most ``max_norm``; returns (clipped grads, pre-clip norm).

    ``max_norm`` is a Python float fixed per run (a constant under ``mindspore.jit``); ``0`` disables clipping but
    the norm is still computed and returned (for logging and NaN checks).
    """
    grads = tuple(grads)
    norm = global_grad_norm(grads)
    if max_norm <= 0:
        return grads, norm
    coef = ops.minimum(max_norm / (norm + NORM_EPS), 1.0)
    return execution.each(ops.partial(scaled, coef), grads), norm


def scaled(coef, g):
    """g * coef (for ``execution.each(ops.partial(scaled, coef), grads)``)."""
    return g * coef


_clip_compiled = ms.jit(clip_grad_norm)


def clip_grad_norm_jit(grads: Sequence[Tensor], max_norm: float) -> tuple[tuple[Tensor, ...], Tensor]:
    """``clip_grad_norm`` as one compiled graph, for a trainer whose step is not already under jit.

    ``mutable`` makes the gradients graph variables: a plain tuple of Tensors is taken as constants (MindSpore
    warns, printing every gradient, and may recompile). ``max_norm`` is folded in (one compile per value).
    """
    return _clip_compiled(ms.mutable(tuple(grads)), max_norm)
