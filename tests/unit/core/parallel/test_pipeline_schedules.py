"""Pipeline schedules without a model: every rank's action list is complete, runs its dependencies in order,
receives every message in the order it was sent, never deadlocks, and has the bubble and the in-flight
micro-batches the papers derive."""

from __future__ import annotations

import itertools

import pytest

from core.parallel.pipeline.schedules import Action, ScheduleError, build, compute_order, simulate, stage_layers

GRID = [
    (s, p, m, v)
    for s, p, m, v in itertools.product(("gpipe", "1f1b", "interleaved"), (2, 3, 4), (1, 2, 3, 4, 6, 8, 12), (1, 2, 3))
    if not (s != "interleaved" and v > 1) and not (s == "interleaved" and m % p)
]


@pytest.mark.parametrize("schedule, pp, m, v", GRID)
def test_every_schedule_is_complete_ordered_and_free_of_deadlock(schedule, pp, m, v):
    actions = build(schedule, pp, m, v)
    timing = simulate(actions, m, v)  # raises on any violation
    for rank, acts in enumerate(actions):
        compute = [(a.op, a.mb, a.stage) for a in acts if a.op in ("F", "B")]
        # each of this rank's stages runs F and B once per micro-batch, and nothing else
        assert sorted(compute) == sorted((op, mb, s) for op in "FB" for mb in range(m) for s in range(rank, pp * v, pp))
    # the bubble (idle share) is (p - 1) / (v m + p - 1): GPipe and 1F1B with v = 1 (Huang et al. 2019; Narayanan
    # et al. 2021), the interleaved schedule's divided by v (Narayanan et al. 2021, section 2.2)
    assert timing.bubble == pytest.approx((pp - 1) / (v * m + pp - 1))


@pytest.mark.parametrize("pp, m", [(2, 4), (4, 8), (4, 3), (3, 12)])
def test_1f1b_bounds_the_micro_batches_in_flight_and_gpipe_does_not(pp, m):
    assert simulate(build("gpipe", pp, m), m).in_flight == [m] * pp
    assert simulate(build("1f1b", pp, m), m).in_flight == [min(pp - r, m) for r in range(pp)]


def test_1f1b_order_on_two_stages():
    # rank 0: one warm-up forward, then alternate; rank 1 (last): forward, backward, ...
    assert compute_order("1f1b", 2, 3, 1, 0) == [
        ("F", 0, 0),
        ("F", 1, 0),
        ("B", 0, 0),
        ("F", 2, 0),
        ("B", 1, 0),
        ("B", 2, 0),
    ]
    assert compute_order("1f1b", 2, 3, 1, 1) == [
        ("F", 0, 1),
        ("B", 0, 1),
        ("F", 1, 1),
        ("B", 1, 1),
        ("F", 2, 1),
        ("B", 2, 1),
    ]


def test_interleaved_places_stage_s_on_rank_s_mod_pp():
    for rank, acts in enumerate(build("interleaved", 2, 4, 3)):
        assert {a.stage % 2 for a in acts if a.op in ("F", "B")} == {rank}
        assert {a.stage for a in acts if a.op == "F"} == {rank, rank + 2, rank + 4}


def test_simulator_catches_a_deadlock_and_a_message_out_of_order():
    good = build("1f1b", 2, 2)
    # rank 1 waits for a gradient that only it could send: nobody sends it
    stuck = [good[0], [Action("recv_B", 0, 1, 0), *good[1]]]
    with pytest.raises(ScheduleError, match="deadlock|order"):
        simulate(stuck, 2)
    # rank 1 receives micro-batch 1's activation first: same shape, silently wrong in a real run
    swapped = list(good[1])
    i, j = [k for k, a in enumerate(swapped) if a.op == "recv_F"]
    swapped[i], swapped[j] = swapped[j], swapped[i]
    with pytest.raises(ScheduleError):
        simulate([good[0], swapped], 2)
    # a backward before its forward
    with pytest.raises(ScheduleError, match="before its forward"):
        simulate([[Action("B", 0, 0)], []], 1)


def test_missing_and_repeated_actions_are_caught():
    good = build("gpipe", 2, 2)
    with pytest.raises(ScheduleError, match="missing|deadlock"):
        simulate([good[0][:-1], good[1]], 2)
    with pytest.raises(ScheduleError):
        simulate([good[0] + [good[0][0]], good[1]], 2)


def test_stage_layers_even_and_uneven():
    assert stage_layers(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_layers(4, 2, [1, 3]) == [range(0, 1), range(1, 4)]
    assert stage_layers(6, 3, [1, 2, 3]) == [range(0, 1), range(1, 3), range(3, 6)]
    with pytest.raises(ValueError):
        stage_layers(3, 2)
    with pytest.raises(ValueError):
        stage_layers(4, 2, [2, 1])
    # the first and last stages may hold none (the embedding, or the head, alone); a stage between may not
    assert stage_layers(4, 4, [0, 2, 2, 0]) == [range(0, 0), range(0, 2), range(2, 4), range(4, 4)]
    with pytest.raises(ValueError):
        stage_layers(4, 3, [2, 0, 2])
    with pytest.raises(ValueError):
        stage_layers(4, 2, [-1, 5])


def test_schedule_arguments_are_checked():
    with pytest.raises(ValueError, match="multiple of pp"):
        build("interleaved", 2, 3, 2)
    with pytest.raises(ValueError, match="interleaved"):
        build("1f1b", 2, 4, 2)
    with pytest.raises(ValueError, match="pp >= 2"):
        build("1f1b", 1, 4)
