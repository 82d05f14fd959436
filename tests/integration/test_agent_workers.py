"""--workers K: trials run side by side, each pinned to its own cores, and the study counts each one once."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autoresearch import storage
from tests.integration.test_agent_resume import wait_for

ROOT = Path(__file__).resolve().parents[2]
FAKE = shlex.join([sys.executable, str(ROOT / "tests" / "fake_trial.py")])
pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2,
                                 reason="needs taskset and two cores")]


def test_two_workers_run_two_trials_at_once_on_disjoint_cores(tmp_path):
    hold, marker = tmp_path / "hold", tmp_path / "started"
    space = tmp_path / "workers.yaml"
    space.write_text(yaml.safe_dump({
        "name": "workers", "objective": {"metric": "tokens_per_sec", "direction": "maximize"},
        "fixed": {"training.seq_len": 64, "fake.hold": str(hold), "fake.marker": str(marker),
                  "trial.max_wall_time_sec": 120},
        "params": {"training.micro_batch_size": {"type": "choice", "values": [2, 4, 8, 16, 32]}}}))
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    hold.touch()  # every trial waits for this file to go: both slots fill before anything ends
    agent = subprocess.Popen(
        [sys.executable, "-m", "autoresearch.agent", "--space", str(space), "--trials-dir", str(tmp_path / "trials"),
         "--command", FAKE, "--estimator", "none", "--proposer", "grid", "--trials", "5", "--workers", "2"],
        cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    started = lambda: marker.read_text().splitlines() if marker.exists() else []  # noqa: E731
    wait_for(lambda: len(started()) == 2, what="two trials running at once")
    cores = sorted(os.sched_getaffinity(0))
    half = len(cores) // 2
    pinned = [line.split()[3] for line in started()]
    assert sorted(pinned) == sorted(f"cpus={','.join(map(str, c))}" for c in (cores[:half], cores[half:2 * half]))
    hold.unlink()
    out, _ = agent.communicate(timeout=120)
    assert agent.returncode == 0, out

    study = optuna.load_study(study_name="workers", storage=f"sqlite:///{tmp_path / 'trials/workers/study.db'}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 5  # 5 finished, none started beyond --trials
    assert storage.finished_count(study) == 5
    assert sorted(t.params["training.micro_batch_size"] for t in study.trials) == [2, 4, 8, 16, 32]  # no repeats
    assert len(started()) == 5 and "stopped: the study holds 5 finished trials (--trials 5)" in out
    assert "[cores " in out  # each trial's line names its slot
