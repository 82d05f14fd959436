"""Process groups and the layouts built on them. The model knows nothing of this package.

A rank is a worker process started by ``core.launch`` (or msrun) with MindSpore's dynamic-cluster environment
(MS_ROLE=MS_WORKER, MS_NODE_ID, MS_WORKER_NUM, MS_SCHED_HOST/PORT). ``init_distributed`` joins the cluster.

    dims.py               ParallelDims: the mesh (pp, dp_replicate, dp_shard, cp, tp), coordinates, group ranks
    comm.py               collectives on named groups, each paired with its backward; CPU compositions
    placement.py          how one parameter is split over tp and fsdp (shared by FSDP, optimizer, checkpoints)
    parallelize.py        parallelize(model, dims, cfg): the one place that applies the techniques below
    tensor_parallel.py    column/row-parallel linears, vocab-parallel embedding, sequence parallelism
    vocab_parallel_loss.py  the fused linear cross-entropy over a vocabulary split across tp
    context_parallel.py   the sequence over cp ranks (load-balanced chunks), attention over gathered K/V
    fsdp.py               FSDP/HSDP: flat shards gathered per op, gradients reduce-scattered
    grads.py              GradientSync: the gradient of the global mean loss, clipped by the global norm
    schedule.py           the micro-batch schedule of a step: gradient accumulation, or a pipeline's
    pipeline_schedules.py GPipe, 1F1B, interleaved 1F1B as per-rank action lists, and a simulator that checks them
    pipeline.py           pipeline stages (GPT-shaped cells) and the runtime that runs a schedule over them
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    world_size: int = 1

    @property
    def is_worker(self) -> bool:
        return self.world_size > 1


def is_worker_process() -> bool:
    """True inside a rank started by a supervisor or msrun (not the CLI that starts them)."""
    return os.environ.get("MS_ROLE") == "MS_WORKER"


def init_distributed() -> RankInfo:
    """Join the cluster when this process is a worker; a single process needs no communication at all."""
    if not is_worker_process():
        return RankInfo()
    from mindspore.communication import get_group_size, get_rank, init

    _wait_for_slow_peers()
    init()
    return RankInfo(rank=get_rank(), world_size=get_group_size())


def _wait_for_slow_peers() -> None:
    """CPU workaround: MindSpore's CPU collectives and send/recv give up after 30 s (``MS_CPU_COMM_OP_TIMEOUT``,
    read when the cluster is joined), but a rank may wait longer for a peer that is still compiling: a pipeline
    stage receiving from a stage with a larger graph, any rank on a loaded machine (measured: "Recv failed" 30 s
    into a 4-rank pipeline trial run beside another trial). A rank that dies ends the trial through its
    supervisor, not through this timeout, so it can be long. Other devices ignore it; a value already set wins."""
    os.environ.setdefault("MS_CPU_COMM_OP_TIMEOUT", "900")


def node_ranks(world_size: int) -> tuple[int, int]:
    """(first rank, count) on this host: all of them, or MSAR_NODE_RANKS=first:count on a multi-node run."""
    spec = os.environ.get("MSAR_NODE_RANKS")
    if not spec:
        return 0, world_size
    first, count = spec.split(":")
    return int(first), int(count)
