"""Point-to-point messages between global ranks (pipeline stages), outside graphs, through
``mindspore.mint.distributed``.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import mint, ops
from mindspore.communication import create_group, get_group_size

from core.parallel.comm.collectives import compose_from_all_reduce

_P2P_READY = False


def enable_p2p() -> None:
    """CPU workaround: ``mint.distributed.send``/``recv`` look up a group named "hccl_world_group", which the CPU
    backend never creates (docs/mindspore-cpu.md); creating it over every rank makes them work. Ascend has it.
    Every rank must call this at the same point (group creation is a rendezvous): pipelines call it at set-up."""
    global _P2P_READY
    if _P2P_READY:
        return
    if compose_from_all_reduce():
        create_group("hccl_world_group", list(range(get_group_size())))
    _P2P_READY = True


def send(x: ms.Tensor, dst: int) -> None:
    """Send ``x`` to global rank ``dst``. On CPU the send is buffered (it returns before the receiver posts its
    ``recv``, for every message size measured: benchmarks/RESULTS.md, "core/parallel/comm/p2p.py"); messages between
    two ranks arrive in the order they were sent."""
    enable_p2p()
    mint.distributed.send(x, dst)


def recv(shape: tuple[int, ...], dtype, src: int) -> ms.Tensor:
    """Receive a tensor of ``shape``/``dtype`` from global rank ``src`` (blocking)."""
    enable_p2p()
    out = ops.zeros(shape, dtype)
    mint.distributed.recv(out, src)
    return out
