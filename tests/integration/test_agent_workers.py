"""--workers K: trials run side by side, each pinned to its own cores, and the study counts each one once."""

from __future__ import annotations

import os
import shutil
import signal

import optuna
import pytest
from optuna.trial import TrialState

from autoresearch.study import storage
from tests.integration.agent_helpers import dead, held_space, start_agent, started, wait_for

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2, reason="needs taskset and two cores"
    ),
]


def test_two_workers_run_two_trials_at_once_on_disjoint_cores(tmp_path):
    space, hold, marker = held_space(tmp_path, "workers", {"training.micro_batch_size": [2, 4, 8, 16, 32]})
    hold.touch()  # every trial waits for this file to go: both slots fill before anything ends
    agent = start_agent(tmp_path, space, "--proposer", "grid", "--trials", "5", "--workers", "2")
    wait_for(lambda: len(started(marker)) == 2, what="two trials running at once")
    cores = sorted(os.sched_getaffinity(0))
    half = len(cores) // 2
    pinned = [line.split()[3] for line in started(marker)]
    assert sorted(pinned) == sorted(f"cpus={','.join(map(str, c))}" for c in (cores[:half], cores[half : 2 * half]))
    hold.unlink()
    out, _ = agent.communicate(timeout=120)
    assert agent.returncode == 0, out

    study = optuna.load_study(study_name="workers", storage=f"sqlite:///{tmp_path / 'trials/workers/study.db'}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 5  # 5 finished, none started beyond --trials
    assert storage.finished_count(study) == 5
    assert sorted(t.params["training.micro_batch_size"] for t in study.trials) == [2, 4, 8, 16, 32]  # no repeats
    assert len(started(marker)) == 5 and "stopped: the study holds 5 finished trials (--trials 5)" in out
    assert "[cores " in out  # each trial's line names its slot


def test_sigterm_ends_every_running_trial_and_queues_each_again(tmp_path):
    space, hold, marker = held_space(tmp_path, "term", {"training.micro_batch_size": [2, 4, 8]})
    hold.touch()
    agent = start_agent(tmp_path, space, "--proposer", "grid", "--trials", "3", "--workers", "2")
    wait_for(lambda: len(started(marker)) == 2, what="two trials running at once")
    children = [int(line.split()[1]) for line in started(marker)]
    agent.send_signal(signal.SIGTERM)
    out, _ = agent.communicate(timeout=60)
    assert agent.returncode == 130 and "stopped: interrupted" in out, out
    wait_for(lambda: all(dead(pid) for pid in children), timeout=15, what="both trials to end with their agent")
    study = optuna.load_study(study_name="term", storage=f"sqlite:///{tmp_path / 'trials/term/study.db'}")
    states = sorted((t.state.name, t.user_attrs.get("status"), t.user_attrs.get("retry_of")) for t in study.trials)
    assert states == [("FAIL", "interrupted", None)] * 2 + [("WAITING", None, 0), ("WAITING", None, 1)]
