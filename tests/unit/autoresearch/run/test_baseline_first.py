"""A study runs its baseline first and states every result after it against it (fake trials)."""

import pytest

from autoresearch.records import BASELINE_PROPOSER, RAN, Status
from autoresearch.study.storage import trial_rows
from tests.agent_support import MBS, REC, load, run_agent, space_file

BASELINE = {MBS: 16, REC: "full", "optim.lr": 0.001}
PARAMS = {  # every config runs: no OOM (the fake's 1 GiB), no NaN (lr <= 0.05)
    MBS: {"type": "choice", "values": [8, 16, 24]},
    REC: {"type": "choice", "values": ["full", "none"]},
    "optim.lr": {"type": "choice", "values": [0.001, 0.003]},
}


def _ok(rows):
    return [r for r in rows if r.status == Status.OK]


def test_the_baseline_runs_first_and_anchors_every_ratio(tmp_path):
    space = space_file(tmp_path, params=PARAMS, baseline=BASELINE)
    assert run_agent(tmp_path, space, "--proposer", "random", "--trials", "5") == 0
    study = load(tmp_path)
    first = study.trials[0]
    assert first.params == BASELINE and first.user_attrs["proposer"] == BASELINE_PROPOSER
    rows = trial_rows(study)
    base = rows[0]
    assert base.baseline and base.gain == pytest.approx(1.0) and base.memory_ratio == pytest.approx(1.0)
    # the fake trial's rules (tests/fake_trial.py): tokens/s = mbs * seq / step, step = (5 + 0.02 mbs seq) * 1.33
    # with recompute; peak = 1.1 * (64 MiB + mbs * seq * 128 KiB * (0.35 with recompute))
    assert base.objective == pytest.approx(16 * 256 / ((5 + 0.02 * 16 * 256) * 1.33) * 1000)
    others = [r for r in _ok(rows) if not r.baseline]
    assert others, "the random proposer ran configs other than the baseline"
    for r in others:
        assert r.gain == pytest.approx(r.objective / base.objective)
        assert r.memory_ratio == pytest.approx(r.peak_memory_bytes / base.peak_memory_bytes)


def test_a_minimised_objective_s_gain_is_the_baseline_over_the_value(tmp_path):
    space = space_file(tmp_path, params=PARAMS, baseline=BASELINE, direction="minimize", metric="step_time_ms_median")
    assert run_agent(tmp_path, space, "--proposer", "random", "--trials", "3") == 0
    rows = _ok(trial_rows(load(tmp_path)))
    base = next(r for r in rows if r.baseline)
    for r in rows:
        assert r.gain == pytest.approx(base.objective / r.objective)


def test_a_resumed_study_does_not_run_its_baseline_again(tmp_path):
    space = space_file(tmp_path, params=PARAMS, baseline=BASELINE)
    assert run_agent(tmp_path, space, "--proposer", "random", "--trials", "2") == 0
    assert run_agent(tmp_path, space, "--proposer", "random", "--trials", "4") == 0
    runs = [t for t in load(tmp_path).trials if t.params == BASELINE and t.user_attrs["status"] in RAN]
    assert len(runs) == 1 and runs[0].number == 0


def test_a_study_without_a_baseline_has_no_ratios(tmp_path):
    assert run_agent(tmp_path, space_file(tmp_path), "--proposer", "random", "--trials", "2") == 0
    rows = trial_rows(load(tmp_path))
    assert all(r.gain is None and r.memory_ratio is None and not r.baseline for r in rows)
