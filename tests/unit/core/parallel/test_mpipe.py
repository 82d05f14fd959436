"""MPipe Transpose's action lists without a model: over pp 2-4, micro-batches 1-12, virtual stages 1-3, T in
{0, 1, 2} and both overflow policies every list passes the simulator (complete, dependencies in order, messages
in order, no deadlock), taking the transposed steps out leaves the (interleaved) 1F1B body, and each micro-batch
is preprocessed once, by the rank the policy names."""

from __future__ import annotations

import itertools

import pytest

from core.parallel.pipeline.mpipe import STEPS, owner
from core.parallel.pipeline.schedules import Action, ScheduleError, build, compile_schedule, simulate

GRID = [
    (pp, m, v, t, overflow)
    for pp, m, v, t, overflow in itertools.product((2, 3, 4), range(1, 13), (1, 2, 3), (0, 1, 2), ("full", "min"))
    if v == 1 or m % pp == 0  # the interleaved body needs whole groups of pp micro-batches
]


@pytest.mark.parametrize("pp, m, v, t, overflow", GRID)
def test_every_mpipe_list_is_checked_and_strips_to_its_body(pp, m, v, t, overflow):
    trained = t > 0  # T = 0: the data loading alone is transposed, no weights to send, nothing to back-propagate
    actions = build("mpipe", pp, m, v, overflow=overflow, trained=trained)
    simulate(actions, m, v)  # raises on any violation
    body = build("interleaved" if v > 1 else "1f1b", pp, m, v)
    assert [[a for a in acts if a.op not in STEPS] for acts in actions] == body
    nt = min(pp, m)
    for mb in range(m):
        expect = mb if mb < nt else (mb % nt if overflow == "full" else 0)
        assert owner(mb, pp, m, overflow) == expect
        (where,) = [r for r, acts in enumerate(actions) if Action("P", mb, 0) in acts]
        assert where == expect
        assert (Action("recv_P", mb, 0, expect) in actions[0]) == (expect != 0)
        assert actions[0].count(Action("R", mb, 0)) == int(trained)
    weights = {a.stage for a in actions[0] if a.op == "send_W"}
    assert weights == ({owner(mb, pp, m, overflow) for mb in range(m)} - {0} if trained else set())


def test_the_warm_up_ranks_preprocess_first_and_rank_0_recomputes_after_each_backward():
    rank0, rank1 = build("mpipe", 2, 4, overflow="full")
    assert rank1[:3] == [Action("recv_W", -1, 1, 0), Action("P", 1, 0), Action("send_P", 1, 0, 0)]
    assert rank0[:3] == [Action("send_W", -1, 1, 1), Action("P", 0, 0), Action("F", 0, 0)]
    for mb in range(4):
        i = rank0.index(Action("B", mb, 0))
        assert rank0[i + 1] == Action("R", mb, 0)
    # overflow micro-batch 3 (rank 1's under full) goes after the gradient rank 0 receives before it needs it
    i = rank1.index(Action("P", 3, 0))
    assert rank1[i - 1] == Action("send_B", 1, 0, 0) and rank1[i + 1] == Action("send_P", 3, 0, 0)


def test_the_simulator_catches_a_misplaced_preprocess():
    rank0, rank1 = build("mpipe", 2, 4, overflow="full")
    late = [a for a in rank1 if a != Action("send_P", 1, 0, 0)] + [Action("send_P", 1, 0, 0)]
    with pytest.raises(ScheduleError, match="would receive|deadlock"):
        simulate([rank0, late], 4)
    early_r = [a for a in rank0 if a != Action("R", 0, 0)]
    early_r.insert(early_r.index(Action("F", 0, 0)) + 1, Action("R", 0, 0))
    with pytest.raises(ScheduleError, match="before the backward"):
        simulate([early_r, rank1], 4)
    unweighted = [a for a in rank1 if a.op != "recv_W"]
    with pytest.raises(ScheduleError, match="would receive \\('W'"):
        simulate([rank0, unweighted], 4)
    stale = unweighted[:2] + [Action("recv_W", -1, 1, 0)] + unweighted[2:]  # preprocesses with last step's weights
    with pytest.raises(ScheduleError, match="before the preprocess weights arrived"):
        simulate([rank0, stale], 4)


def test_transposing_an_expensive_preprocess_shortens_the_step():
    # Stage 0's forward is mostly preprocess (4 of its 5 units): 1F1B runs it all on rank 0; MPipe lets rank 1
    # run micro-batch 1's in its warm-up, and rank 0 pays R (the preprocess again, then its backward) instead.
    pp, m, pre, body, back = 2, 2, 4.0, 1.0, 2.0

    def plain(op, s):
        return {"F": pre + body if s == 0 else body, "B": back + (2 * pre if s == 0 else 0.0)}[op]

    def mpipe(op, s):
        return {"F": body, "B": back, "P": pre, "R": 2 * pre}[op]

    one = compile_schedule("1f1b", pp, m).time(plain)
    transposed = compile_schedule("mpipe", pp, m).time(mpipe)
    assert simulate(build("mpipe", pp, m), m, durations=mpipe).makespan == transposed.makespan
    # by hand: 1F1B 5 + 5 + (1 + 2) + ... ; MPipe: rank 0 F0 after P0 (4 + 1), F1 when P1 arrives (at 4) -> 6
    assert transposed.makespan < one.makespan
    assert sum(transposed.busy) == pytest.approx(sum(one.busy))  # the same work, moved
