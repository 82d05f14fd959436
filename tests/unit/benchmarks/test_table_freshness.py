"""A search table says when it is stale (issue "Agent IV"): today's memory estimate of its configs against the one it
was collected with, measured against that estimate's own error on the table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from table_freshness import NOISE, freshness, memory_profile  # noqa: E402

MiB = 2**20


def table(profile=None) -> dict:
    """Four rows: three measured (estimate off by +10%, -5%, +2%), one OOM (its peak is where it was stopped)."""
    rows = []
    for i, (est, peak, status) in enumerate(
        [(700, 636.4, "ok"), (800, 842.1, "ok"), (900, 882.4, "nan"), (1400, 1300, "oom")]
    ):
        rows.append(
            {
                "index": i,
                "params": {"training.global_batch_size": 8 * (i + 1)},
                "status": status,
                "estimated_memory_bytes": est * MiB,
                "peak_memory_bytes": peak * MiB,
            }
        )
    out = {"fixed": {"model": "tiny", "memory.limit_gb": 1.25}, "rows": rows}
    if profile is not None:
        out["memory_profile"] = profile
    return out


def estimator(scale: float):
    """Today's estimate: the recorded one times ``scale``, looked up by the batch override the row spells."""
    recorded = {
        f"training.global_batch_size={r['params']['training.global_batch_size']}": r["estimated_memory_bytes"]
        for r in table()["rows"]
    }
    seen = []

    def estimate(overrides):
        seen.append(list(overrides))
        return int(recorded[overrides[-1]] * scale)

    return estimate, seen


def test_the_own_error_is_the_median_over_measured_rows_and_the_overrides_are_the_configs():
    estimate, seen = estimator(1.0)
    f = freshness(table(), estimate)
    # |700/636.4 - 1| = 10.0%, |800/842.1 - 1| = 5.0%, |900/882.4 - 1| = 2.0%: the OOM row is not a measurement
    assert f.own_error == pytest.approx(0.05, abs=2e-4)
    assert f.rows == 4 and f.drift == 0.0 and not f.stale and f.profile_changed is None
    assert seen[0] == ["model=tiny", "memory.limit_gb=1.25", "training.global_batch_size=8"]


@pytest.mark.parametrize(("scale", "stale"), [(1.04, False), (1.06, True), (0.9, True), (1 + NOISE / 2, False)])
def test_a_drift_beyond_the_own_error_is_stale(scale, stale):
    f = freshness(table(), estimator(scale)[0])
    assert f.drift == pytest.approx(abs(scale - 1), abs=1e-6)
    assert f.stale is stale
    assert f.text().startswith("STALE: " if stale else "fresh: ")


def test_the_recorded_profile_is_compared_with_todays():
    assert freshness(table(memory_profile()), estimator(1.0)[0]).profile_changed is False
    changed = {**memory_profile(), "CPU/jit": {"baseline": 0}}
    f = freshness(table(changed), estimator(1.0)[0])
    assert f.profile_changed is True and "profile changed" in f.text()


def test_an_estimate_that_moved_toward_the_tables_peaks_leaves_it_fresh():
    """A refit that makes the estimate better moves it as much as a change of the core would; the difference is
    the direction: toward the table's measured peaks, the table still agrees with today's estimate."""
    rows = {f"training.global_batch_size={r['params']['training.global_batch_size']}": r for r in table()["rows"]}
    closer = {k: 1.01 * r["peak_memory_bytes"] for k, r in rows.items()}  # (the OOM row's too: 1313 against 1400)
    away = {k: 3 * r["estimated_memory_bytes"] - 2 * r["peak_memory_bytes"] for k, r in rows.items()}  # 3x the error
    f = freshness(table(), lambda o: int(closer[o[-1]]))
    # drifts 8.2%, 6.3%, 1.0%, 6.2%: moved beyond the 5% own error; the measured rows' error now 1%, the OOM's unread
    assert f.drift == pytest.approx(0.0625, abs=1e-3) and f.moved
    assert f.now_error == pytest.approx(0.01, abs=1e-4) and f.improved and not f.stale
    assert "toward the table's measured peaks" in f.text() and f.text().startswith("fresh: ")
    f = freshness(table(), lambda o: int(away[o[-1]]))
    assert f.moved and f.now_error == pytest.approx(3 * f.own_error, rel=1e-3) and f.stale
