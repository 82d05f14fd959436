"""Muon: MomentUm Orthogonalized by Newton–Schulz (Jordan et al. 2024, "Muon: An optimizer for hidden layers in
neural networks"), with the update RMS matched to AdamW's (Liu et al. 2025, "Muon is Scalable for LLM Training").

For a hidden 2-D weight W of shape (A, B) with gradient G:

    buf <- mu * buf + G                     (momentum)
    N   <- G + mu * buf                     (Nesterov look-ahead)
    O   <- NewtonSchulz5(N)                 (~ U V^T, the orthogonal factor of N = U S V^T)
    W   <- W * (1 - lr * wd) - lr * 0.2 * sqrt(max(A, B)) * O

An orthogonal (A, B) matrix has RMS 1/sqrt(max(A, B)); AdamW's updates have RMS ~0.2-0.4 in practice, and Liu et
al. match 0.2, so the factor 0.2 * sqrt(max(A, B)) lets one learning rate (and weight decay, decoupled as in AdamW)
serve both optimizers.

Muon is only for hidden matrices (``core.optim.param_rules.uses_muon``).
"""

from __future__ import annotations

import math

from mindspore import ops

# Quintic Newton–Schulz coefficients (a, b, c) of Jordan et al. 2024: chosen to push every singular value in
# (0, 1] quickly into a band around 1 (roughly [0.7, 1.2]) rather than converge exactly, which 5 steps suffice for.
NS_COEFFS = (3.4445, -4.7750, 2.0315)
# Added to the Frobenius norm before dividing, so an all-zero gradient stays zero instead of becoming NaN.
NS_EPS = 1e-7


def rms_match_scale(shape: tuple[int, ...]) -> float:
    """0.2 * sqrt(max(A, B)): gives an orthogonalised (A, B) update the RMS of an AdamW update (Liu et al. 2025)."""
    return 0.2 * math.sqrt(max(shape))


def newton_schulz(g, steps: int):
    """Approximately orthogonalise a 2-D Tensor with the quintic Newton–Schulz iteration (Jordan et al. 2024).

    X is first divided by its Frobenius norm, which bounds its spectral norm by 1 (the iteration's basin). Each step
    maps every singular value s to a*s + b*s^3 + c*s^5 while keeping the singular vectors:
        A = X X^T,  X <- a X + (b A + c A A) X.
    A tall matrix is transposed first so that X X^T is the smaller Gram matrix (min(A, B) squared).
    """
    a, b, c = NS_COEFFS
    transposed = g.shape[0] > g.shape[1]
    x = g.T if transposed else g
    x = x / (ops.sqrt(ops.sum(ops.square(x))) + NS_EPS)
    for _ in range(steps):
        gram = ops.matmul(x, x.T)
        poly = gram * b + ops.matmul(gram, gram) * c
        x = x * a + ops.matmul(poly, x)
    return x.T if transposed else x


def muon_lookahead(g, buf, momentum: float):
    """Momentum (updated in place in ``buf``) and the Nesterov look-ahead g + mu * buf that Newton–Schulz takes."""
    buf_new = buf * momentum + g
    ops.assign(buf, buf_new)
    return g + buf_new * momentum


def muon_apply(p, orth, lr, wd: float, scale: float) -> None:
    """p <- p * (1 - lr * wd) - lr * scale * orth, in place (``wd=0.0``: no decay)."""
    if wd > 0.0:
        ops.assign(p, p * (1.0 - lr * wd) - (lr * scale) * orth)
    else:
        ops.assign(p, p - (lr * scale) * orth)


def muon_update(p, g, buf, lr, momentum: float, wd: float, scale: float, ns_steps: int) -> None:
    """Update ``p`` and its momentum ``buf`` in place (``ops.assign``); traceable by ``mindspore.jit``.

    ``lr`` is a scalar float32 Tensor; ``scale`` is ``rms_match_scale(p.shape)``; ``wd=0.0`` disables decay.
    """
    muon_apply(p, newton_schulz(muon_lookahead(g, buf, momentum), ns_steps), lr, wd, scale)
