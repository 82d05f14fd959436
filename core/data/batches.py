"""A rank's batch rows, split into the micro-batches of one step: what every step (gradient accumulation, the
segmented recompute step, a pipeline) iterates over.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def micro_batches(inputs: np.ndarray, targets: np.ndarray, size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(inputs, targets) of each micro-batch of ``size`` rows, in order: (b, S) -> (size, S) each."""
    for start in range(0, len(inputs), size):
        yield inputs[start : start + size], targets[start : start + size]
