"""What every rank must agree on, reduced on the host: the step's loss (so that every rank takes the same NaN
decision), the validation loss, statistics summed over ranks, and a barrier before a rank leaves its peers.
"""

from __future__ import annotations

import time

import numpy as np
from mindspore import Tensor, ops
from mindspore.communication import get_rank


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

    def max_each(self, values: list[float]) -> list[float]:
        """Each position's largest value over the ranks: every rank writes its own row of a table that a sum then
        gathers (MindSpore's CPU AllReduce sums only; -inf stays -inf, NaN stays NaN)."""
        if self.world_size == 1:
            return values
        table = np.zeros((self.world_size, len(values)), np.float32)
        table[get_rank()] = values
        return np.asarray(self.sum(table.reshape(-1).tolist())).reshape(table.shape).max(axis=0).tolist()

    def barrier(self) -> None:
        self.sum([0.0])

    def leave(self) -> None:
        """The last collective of a rank that is about to ``os._exit``: a barrier, then ``EXIT_LINGER_SEC`` for the
        collective library to deliver what this rank still owes its peers (``linger``)."""
        if self.world_size > 1:
            self.barrier()
            linger()


# Seconds a rank stays after its last collective before it exits.
EXIT_LINGER_SEC = 0.3


def linger() -> None:
    """A rank's last collective returns once it has received what it needs, while its own last message to a peer
    may still wait in the library's send queue (MindSpore's collectives send from a background thread); a rank
    that then ``os._exit``s (core.train does: MindSpore's atexit teardown was seen to abort) takes that message
    with it, and the peer waits until the cluster's heartbeat declares it lost and MindSpore kills it with SIGTERM
    (measured: 4 ranks on 2 busy cores, one run in two; the peers' ``rank_*.log`` end "Kill this process with
    SIGTERM" 30 s after the others left). A short sleep lets the send thread run first."""
    time.sleep(EXIT_LINGER_SEC)
