"""AdamW: Adam with decoupled weight decay (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization").

The rule, with bias-corrected moments (Kingma & Ba 2015) at update number t = 1, 2, ...:

    m <- beta1 * m + (1 - beta1) * g
    v <- beta2 * v + (1 - beta2) * g^2
    p <- p - lr * wd * p - lr * (m / bc1) / (sqrt(v / bc2) + eps),     bc_i = 1 - beta_i^t

The decay is multiplied by the scheduled lr (as in PyTorch's ``AdamW``), so it follows warmup and decay, and acts
on the weights directly, never through the gradient (that would be L2 regularisation, which Adam's per-coordinate
scaling distorts: the point of the paper).

How it runs: two in-place MindSpore kernels per parameter, the decay then Adam. MindSpore's fused
``ops.AdamWeightDecay`` kernel does both in one pass but is slow on CPU: slower than the two passes of
``ApplyGradientDescent(p, lr * wd, p)``, the decoupled decay ``p <- p - lr * wd * p`` in place, then ``ops.Adam``
(ApplyAdam, no decay); the same rule as element-wise ops under jit was slower still (benchmarks/RESULTS.md,
"core/optim/adamw.py"; on model=medium's parameters, "Before: the AVX-512 machine of 2026-12-01 morning").
ApplyAdam computes

    p <- p - lr' * m / (sqrt(v) + eps'),    lr' = lr * sqrt(1 - beta2_power) / (1 - beta1_power)

given the powers; passing them as 0 makes lr' the learning rate it is given. With s = sqrt(bc2) the rule above is
exactly (multiply numerator and denominator of the Adam term by s)

    lr' = lr * s / bc1,   eps' = eps * s,   and the decay applied first with lr * wd

(decaying first is the same update: both use the weights before the step). ``fold_bias_correction`` computes
these on the host in float64 each step; they enter the compiled graph as inputs, so nothing recompiles.
``mint.optim.AdamW`` has no CPU kernel.

Which parameters decay: every parameter with two or more dimensions, embeddings included; 1-D parameters (RMSNorm
gains, biases) do not. This is the GPT-2 / nanoGPT / Llama-recipe convention: shrinking a norm's gain towards 0
fights the normalisation it scales, while embeddings are ordinary weight matrices (and, with tied embeddings, the
output head as well).
"""

from __future__ import annotations

import math

from mindspore import ops

from core.config import OptimConfig

_ADAM = ops.Adam()  # ApplyAdam: p, m, v in place
_DECAY = ops.ApplyGradientDescent()  # p <- p - alpha * delta in place; delta = p is the decoupled decay


def decays(shape: tuple[int, ...]) -> bool:
    """Whether a parameter of this shape gets weight decay: matrices yes, vectors (norm gains, biases) no."""
    return len(shape) >= 2


def fold_bias_correction(lr: float, step: int, cfg: OptimConfig) -> tuple[float, float, float]:
    """(lr', eps', lr * wd): what makes the bias-free Adam kernel plus the decay compute bias-corrected AdamW at
    update ``step`` >= 1."""
    bc1 = 1.0 - cfg.beta1**step
    s = math.sqrt(1.0 - cfg.beta2**step)
    return lr * s / bc1, cfg.eps * s, lr * cfg.weight_decay


def adamw_update(p, g, m, v, lr, eps, decay, beta1: float, beta2: float) -> None:
    """Update ``p``, ``m`` and ``v`` in place; traceable by ``mindspore.jit``.

    ``lr``, ``eps`` and ``decay`` (lr * wd) are the float32 scalar Tensors of ``fold_bias_correction``; ``decay``
    None for parameters that do not decay (a constant to jit); the betas are Python floats fixed per run.
    """
    if decay is not None:
        _DECAY(p, decay, p)
    _ADAM(p, m, v, 0.0, 0.0, lr, beta1, beta2, eps, g)
