"""kill -9 of the agent in the middle of a trial, then the same command again: nothing lost, nothing twice."""

from __future__ import annotations

import signal
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autoresearch.study import reaper, storage
from tests.integration.agent_helpers import dead, held_space, start_agent, started, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_kill_9_mid_trial_then_resume(tmp_path):
    space, hold, marker = held_space(
        tmp_path,
        "resume",
        {"training.micro_batch_size": [2, 4, 8, 16], "optim.lr": [0.001, 0.002, 0.004]},
        {"training.seq_len": 64},
    )

    def agent(n):
        return start_agent(tmp_path, space, "--proposer", "grid", "--trials", str(n))  # grid: a known order

    first = agent(1)  # one finished trial before the crash
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out

    hold.touch()  # the next trial blocks until the file goes
    doomed = agent(3)
    wait_for(lambda: len(started(marker)) == 2, what="the second trial to start")
    orphan = int(started(marker)[1].split()[1])
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate(timeout=30)
    assert not dead(orphan), "the trial outlives its agent (its own process group)"
    url = f"sqlite:///{tmp_path / 'trials' / 'resume' / 'study.db'}"
    study = optuna.load_study(study_name="resume", storage=url)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.RUNNING]

    resumed = agent(3)
    wait_for(lambda: dead(orphan), what="the restarted agent to end the orphaned trial")
    hold.unlink()
    out, _ = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, out
    assert "trial 1: agent died while running; reaped on resume; its config is queued to run again" in out

    study = optuna.load_study(study_name="resume", storage=url)
    trials = study.trials
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert storage.finished_count(study) == 3  # counted once: the reaped trial is not one of them
    reaped = trials[1]
    assert reaped.state == TrialState.FAIL and reaped.user_attrs["status"] == "reaped"
    assert reaped.user_attrs["reason"] == reaper.REAP_REASON
    rerun = trials[2]
    assert rerun.user_attrs["retry_of"] == 1 and rerun.params == reaped.params  # its config was not lost
    assert rerun.state == TrialState.COMPLETE and rerun.user_attrs["status"] == "ok"
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL] + [TrialState.COMPLETE] * 2
    assert trials[3].params not in (trials[0].params, trials[1].params)  # the grid goes on where it was
    # Every trial dir was started once, under its own number; the reaped one's number is not reused.
    dirs = [Path(line.split()[2]).name for line in started(marker)]
    assert dirs == ["0000", "0001", "0002", "0003"]
    assert not (tmp_path / "trials" / "resume" / "0001" / "trial_summary.json").exists()
    for t in trials:
        if t.state == TrialState.COMPLETE:
            assert (Path(t.user_attrs["trial_dir"]) / "trial_summary.json").exists()


def test_sigterm_mid_trial_records_it_and_queues_it_again(tmp_path):
    space, hold, marker = held_space(tmp_path, "term", {"training.micro_batch_size": [2, 4]})
    hold.touch()
    proc = start_agent(tmp_path, space, "--trials", "2")
    wait_for(lambda: marker.exists() and marker.read_text().strip(), what="the trial to start")
    child = int(marker.read_text().split()[1])
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "stopped: interrupted" in out
    wait_for(lambda: dead(child), timeout=10, what="the trial to be ended with its agent")
    study = optuna.load_study(study_name="term", storage=f"sqlite:///{tmp_path / 'trials' / 'term' / 'study.db'}")
    first, queued = study.trials
    assert first.state == TrialState.FAIL and first.user_attrs["status"] == "interrupted"
    assert queued.state == TrialState.WAITING and queued.user_attrs["retry_of"] == 0
