"""What every rank must agree on, reduced on the host: the step's loss (so that every rank takes the same NaN
decision), the validation loss, statistics summed over ranks, and a barrier before a rank leaves its peers.
"""

from __future__ import annotations

import numpy as np
from mindspore import Tensor, ops


class Ranks:
    def __init__(self, world_size: int, pp: int = 1):
        self.world_size, self.pp = world_size, pp

    def mean(self, value: float | None, holders: int | None = None) -> float:
        """A value averaged over the ranks that have one (``None``: a pipeline stage without the loss; by default
        the last stage's ranks have one). Ranks that repeat a value (tensor-parallel peers) repeat it equally
        often, so this is the mean over the ranks that hold it."""
        if self.world_size == 1:
            return value
        holders = holders or self.world_size // self.pp
        return self.sum([0.0 if value is None else value])[0] / holders

    def sum(self, values: list[float]) -> list[float]:
        if self.world_size == 1:
            return values
        return [float(v) for v in ops.AllReduce()(Tensor(np.asarray(values, np.float32))).asnumpy()]

    def barrier(self) -> None:
        self.sum([0.0])
