"""MPipe Transpose (MindSpore hyper-parallel's ``mpipe_transpose.py``, from its published design) as a transform of
(interleaved) 1F1B's action lists.

In 1F1B the downstream ranks idle through the warm-up while rank 0 runs every micro-batch's first forward. MPipe
cuts stage 0's first chunk in two: the *preprocess* block (the embedding and the first ``T`` =
``parallel.pp_transpose_layers`` blocks), replicated on every rank, and the body (the rest). For the first
``NT = min(pp, m)`` micro-batches rank ``i`` preprocesses micro-batch ``i`` in its idle warm-up (P) and ships the
result to rank 0 (send_P: the block's output for the body's forward, and its input for the backward). Rank 0
runs the body on it and, after the body's backward has left the gradient of that output, recomputes the block
from the shipped input and back-propagates it (R): in MindSpore a step's captured gradient function covers only
the body's weights, so *every* micro-batch needs that explicit backward, the ones rank 0 preprocessed itself
included (hyper-parallel's ``nontransposed_connected = False``). The block's weights live on rank 0 (its
gradients and optimizer too); rank 0 sends them to every rank that preprocesses, once per step, before anything
else (W; hyper-parallel's ``MPIPE_PARAM_BROADCAST``). ``T = 0`` transposes the data loading alone: a rank loads
a micro-batch and ships its tokens; no weights, no R.

Micro-batches past ``NT`` (``parallel.pp_transpose_overflow``): ``full`` deals them round-robin (micro-batch
``mb`` to rank ``mb % NT``), ``min`` has rank 0 preprocess them inline.

Where rank ``j`` preprocesses: as early as its messages to rank 0 allow. Messages between two ranks arrive in the
order they were sent, and rank ``j`` also sends rank 0 body messages (a gradient from rank 1, an activation from
the last rank to rank 0's next chunk); so micro-batch ``mb`` goes right after the body message rank 0 receives
last before it needs ``mb`` (at the start of the step when none: the warm-up micro-batches).

Every transposed step is one of ``STEPS``; taking them out of a rank's list leaves the body, which
``tests/unit/core/parallel/test_mpipe.py`` checks with the simulator (``schedules.simulate``) over the grid.
"""

from __future__ import annotations

from core.parallel.pipeline.actions import Action

STEPS = ("P", "R", "send_P", "recv_P", "send_W", "recv_W")
OVERFLOWS = ("full", "min")


def owner(mb: int, pp: int, micro_batches: int, overflow: str) -> int:
    """The rank that preprocesses micro-batch ``mb``."""
    if overflow not in OVERFLOWS:
        raise ValueError(f"unknown overflow policy {overflow!r}; one of {OVERFLOWS}")
    transposed = min(pp, micro_batches)
    if mb < transposed:
        return mb
    return mb % transposed if overflow == "full" else 0


def transpose(body: list[list[Action]], overflow: str, trained: bool) -> list[list[Action]]:
    """``body`` (every rank's (interleaved) 1F1B actions) with the preprocess transposed; ``trained``: the block
    has weights that train (T > 0, not frozen), so they are sent each step and every micro-batch runs R."""
    pp, m = len(body), 1 + max(a.mb for a in body[0])
    owners = [owner(mb, pp, m, overflow) for mb in range(m)]
    first: list[Action] = []
    if trained:
        first += [Action("send_W", -1, j, j) for j in sorted(set(owners) - {0})]
    for a in body[0]:
        if a.op == "F" and a.stage == 0:
            first.append(Action("P", a.mb, 0) if owners[a.mb] == 0 else Action("recv_P", a.mb, 0, owners[a.mb]))
        first.append(a)
        if a.op == "B" and a.stage == 0 and trained:
            first.append(Action("R", a.mb, 0))
    out = [first]
    for rank, actions in enumerate(body[1:], start=1):
        # what rank 0 receives from this rank, in order: the body messages before each micro-batch it preprocesses
        due: dict[int, list[int]] = {}
        seen = 0
        for a in first:
            if a.op.startswith("recv") and a.peer == rank:
                if a.op == "recv_P":
                    due.setdefault(seen, []).append(a.mb)
                else:
                    seen += 1
        steps = [Action("recv_W", -1, rank, 0)] if trained and due else []
        steps += _preprocessed(due.get(0, ()))
        sent = 0
        for a in actions:
            steps.append(a)
            if a.op.startswith("send") and a.peer == 0:
                sent += 1
                steps += _preprocessed(due.get(sent, ()))
        out.append(steps)
    return out


def _preprocessed(micro_batches) -> list[Action]:
    return [step for mb in micro_batches for step in (Action("P", mb, 0), Action("send_P", mb, 0, 0))]
