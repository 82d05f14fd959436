"""This process's place in a multi-rank trial, read from the environment it was started with: what ``msrun``
sets, and what the supervisor (``core.trial.supervisor``) sets in its place.

    MS_ROLE=MS_WORKER, MS_NODE_ID / RANK_ID, MS_WORKER_NUM    MindSpore's dynamic-cluster variables
    MSAR_NODE_RANK, MSAR_NNODES                                this host's place on a multi-node run (a
                                                               scheduler's node id and node count: ranks split
                                                               evenly, node k holding k*R ... k*R+R-1)
    MSAR_NODE_RANKS=first:count                                or this host's ranks, given outright
    MSAR_TRIAL_START, MSAR_CONFIG                              the trial's start and validated config (JSON)

No MindSpore here: the supervisor and the agent read this without loading it.
"""

from __future__ import annotations

import os

# What a supervisor hands its workers: the trial's start time (the wall budget covers cluster start-up too) and its
# validated config as JSON (core.config.to_dict), so that no worker composes it again.
START_ENV, CONFIG_ENV = "MSAR_TRIAL_START", "MSAR_CONFIG"
NODE_RANKS_ENV, NODE_RANK_ENV, NNODES_ENV = "MSAR_NODE_RANKS", "MSAR_NODE_RANK", "MSAR_NNODES"


def is_worker_process() -> bool:
    """True inside a rank started by a supervisor or msrun (not the CLI that starts them)."""
    return os.environ.get("MS_ROLE") == "MS_WORKER"


def rank_from_env() -> tuple[int, int]:
    """(rank, world size) as the supervisor (or msrun) assigned them; (0, 1) outside a cluster."""
    if not is_worker_process():
        return 0, 1
    rank = int(os.environ.get("RANK_ID", os.environ.get("MS_NODE_ID", "0")))
    return rank, int(os.environ["MS_WORKER_NUM"])


def nodes() -> tuple[int, int]:
    """(this node's rank, node count): (0, 1) on one host."""
    return int(os.environ.get(NODE_RANK_ENV) or 0), int(os.environ.get(NNODES_ENV) or 1)


def node_ranks(world_size: int) -> tuple[int, int]:
    """(first rank, count) on this host: all of them on one host, MSAR_NODE_RANKS=first:count when given, else
    this node's even share (``nodes()``; ``core.config`` refuses a world the nodes do not divide)."""
    spec = os.environ.get(NODE_RANKS_ENV)
    if spec:
        first, count = spec.split(":")
        return int(first), int(count)
    node, n = nodes()
    per = world_size // n
    return node * per, per


def wait_for_slow_peers() -> None:
    """CPU workaround: MindSpore's CPU collectives and send/recv give up after 30 s (``MS_CPU_COMM_OP_TIMEOUT``,
    read when the cluster is joined), but a rank may wait longer for a peer that is still compiling: a pipeline
    stage receiving from a stage with a larger graph, any rank on a loaded machine ("Recv failed" 30 s into a
    4-rank pipeline trial run beside another trial). A rank that dies ends the trial through its supervisor, not
    through this timeout, so it can be long. Other devices ignore it; a value already set wins."""
    os.environ.setdefault("MS_CPU_COMM_OP_TIMEOUT", "900")
