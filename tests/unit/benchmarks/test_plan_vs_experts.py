"""How ``benchmarks/plan_vs_experts.py`` places the published layout among the plan's fitting points, and how it
writes an uneven published split."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
from plan_vs_experts import rank_of, runs_text  # noqa: E402

from autoresearch.search.planner import PlanRow  # noqa: E402


def _ranked() -> list[PlanRow]:
    return [
        PlanRow(params={"parallel.tp": tp}, tokens_per_sec_per_device=s) for tp, s in ((8, 30.0), (4, 20.0), (2, 10.0))
    ]


def test_an_even_published_layout_is_placed_by_its_own_point():
    assert rank_of(_ranked(), {"parallel.tp": 4}) == 1
    assert rank_of(_ranked(), {"parallel.tp": 1}) is None  # not among the fitting points


def test_an_uneven_split_is_placed_by_how_many_points_are_faster():
    mine = {"parallel.tp": 4}  # its even twin's place does not count: the split is predicted apart
    assert [rank_of(_ranked(), mine, speed) for speed in (35.0, 25.0, 20.0, 5.0)] == [0, 1, 1, 3]


def test_a_published_split_reads_as_runs():
    assert runs_text([1, 2, 2, 2, 1]) == "1, 2 x 3, 1"
    assert runs_text([4]) == "4" and runs_text([3, 3]) == "3 x 2" and runs_text([]) == ""
