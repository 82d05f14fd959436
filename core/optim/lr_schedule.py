"""Learning-rate schedules: linear warmup, then cosine, linear, warmup-stable-decay (WSD) or constant.

``lr_at(step, cfg, total_steps)`` is a pure function of the 0-based step, so a resumed run recomputes the same lr.
Conventions (every kind):

- Warmup: for ``step < W`` (W = ``cfg.warmup_steps``) the lr is ``lr * (step + 1) / W``: step 0 already learns
  (lr / W) and step W - 1 reaches the peak. W = 0 means no warmup.
- Cosine / linear (Loshchilov & Hutter 2017, SGDR, for the cosine): from step W, the peak, down to
  ``lr * min_lr_ratio`` exactly at the last step ``total_steps - 1``.
- WSD (Hu et al. 2024, MiniCPM): after warmup the lr stays at the peak, then falls linearly over the last
  D = max(1, round(decay_ratio * total_steps)) steps (Python's round: halves go to even), reaching
  ``lr * min_lr_ratio`` at the last step; the first decay step is already below the peak (lr - (lr - floor) / D).
  The decay never overlaps warmup: if W > total_steps - D it starts at W.
- Constant: the peak after warmup.
- ``total_steps=None`` (a wall-clock budget, so the horizon is unknown): every kind holds the peak after warmup,
  i.e. behaves as constant. Decaying towards an unknown end would either stop too early or never arrive; WSD's
  stable phase is exactly this, and a later run with a known horizon can add the decay.
- Steps past ``total_steps - 1`` stay at the final value.
"""

from __future__ import annotations

import math

from core.config import OptimConfig


def _progress(step: int, start: int, end: int) -> float:
    """Fraction of the way from ``start`` (0) to ``end`` (1), clamped; a span of 0 or less counts as done."""
    if end <= start:
        return 1.0
    return min(1.0, (step - start) / (end - start))


def lr_at(step: int, cfg: OptimConfig, total_steps: int | None = None) -> float:
    """The learning rate of 0-based ``step`` in a run of ``total_steps`` optimizer steps (None: unknown)."""
    if step < 0:
        raise ValueError(f"step must be >= 0 (got {step})")
    if total_steps is not None and total_steps <= 0:
        raise ValueError(f"total_steps must be > 0 or None (got {total_steps})")
    peak, floor, warmup = cfg.lr, cfg.lr * cfg.min_lr_ratio, cfg.warmup_steps
    if step < warmup:
        return peak * (step + 1) / warmup
    if cfg.schedule == "constant" or total_steps is None:
        return peak
    last = total_steps - 1
    if cfg.schedule == "cosine":
        frac = _progress(step, warmup, last)
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * frac))
    if cfg.schedule == "linear":
        return peak - (peak - floor) * _progress(step, warmup, last)
    if cfg.schedule == "wsd":
        decay_steps = max(1, round(cfg.decay_ratio * total_steps))
        start = max(warmup, total_steps - decay_steps)  # first decay step
        if step < start:
            return peak
        # Steps start..last take fractions 1/n .. n/n of the way down, n = total_steps - start.
        return peak - (peak - floor) * _progress(step + 1, start, total_steps)
    raise ValueError(f"unknown schedule {cfg.schedule!r}")
