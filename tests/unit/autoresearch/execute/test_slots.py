"""Slots for --workers: disjoint cores (or devices) per concurrent trial, or a clear refusal."""

import pytest

from autoresearch.execute import slots
from autoresearch.execute.slots import Slot, make_slots


def test_one_worker_gets_the_whole_machine():
    assert make_slots(1) == [Slot(0, "")]


@pytest.mark.parametrize(
    "cores, workers, sets",
    [
        ([0, 1], 2, ["0", "1"]),
        ([0, 1, 2, 3, 4, 5, 6, 7], 2, ["0-3", "4-7"]),
        ([0, 1, 2, 3, 4, 5, 6], 3, ["0-1", "2-3", "4-5"]),  # the odd core stays unused: equal shares
        ([2, 3, 5, 8, 9], 2, ["2-3", "5,8"]),  # an affinity with holes
    ],
)
def test_cpu_slots_split_the_cores(monkeypatch, cores, workers, sets):
    monkeypatch.setattr(slots.shutil, "which", lambda name: f"/usr/bin/{name}")
    got = make_slots(workers, "CPU", cores=cores)
    assert [s.prefix for s in got] == [("/usr/bin/taskset", "-c", c) for c in sets]
    assert [s.label for s in got] == [f"cores {c}" for c in sets] and all(not s.env for s in got)


def test_more_workers_than_cores_is_refused():
    with pytest.raises(SystemExit, match="--workers 3: this agent may use 2 CPU core.*use --workers 2 or fewer"):
        make_slots(3, "CPU", cores=[0, 1])
    with pytest.raises(SystemExit, match="at least 1"):
        make_slots(0)


def test_without_taskset_it_says_so(monkeypatch):
    monkeypatch.setattr(slots.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="taskset, which is not on PATH"):
        make_slots(2, "CPU", cores=[0, 1])


def test_ascend_slots_get_their_own_devices():
    got = make_slots(3, "Ascend", world_size=2)
    assert [s.env for s in got] == [{"ASCEND_RT_VISIBLE_DEVICES": ids} for ids in ("0,1", "2,3", "4,5")]
    assert all(s.prefix == () for s in got)
    with pytest.raises(SystemExit, match="GPU resources"):
        make_slots(2, "GPU")
