"""--executor slurm against a real Slurm (slurmctld, slurmd, munged from Debian's packages, started by the test:
tests/slurm_cluster.py): a study completes with the table the local executor gives, an agent killed -9 adopts its
jobs, and what only Slurm knows (its time limit, a person's scancel, a failed node) becomes the trial's status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autoresearch.execute import Resources, SlurmExecutor, TrialSpec, wait
from autoresearch.execute.slots import Slot
from autoresearch.execute.slurm import SlurmJob
from autoresearch.records import Attr, Status
from autoresearch.run.runner import run_trial
from tests import netns
from tests.integration.agent_helpers import FAKE, space_file, wait_for
from tests.integration.conftest import TrialRun, assert_same_run
from tests.slurm_cluster import SlurmCluster, missing

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.timeout(600), pytest.mark.skipif(bool(missing()), reason=missing() or "ok")]


@pytest.fixture(scope="module")
def slurm():
    cluster = SlurmCluster().start()
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # sbatch, squeue, scontrol of this process and its agents
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        cluster.stop()


def _fake_spec(tmp_path: Path, *overrides: str, limit: float = 60.0, name: str = "msar.test.0") -> TrialSpec:
    trial_dir = tmp_path / name
    trial_dir.mkdir(parents=True)
    argv = (sys.executable, str(ROOT / "tests" / "fake_trial.py"), *overrides)
    return TrialSpec(
        argv=(*argv, f"trial.dir={trial_dir}"), trial_dir=trial_dir, name=name, resources=Resources(), limit=limit
    )


def _agent(space: Path, trials: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "autoresearch.agent", "--space", str(space), "--trials-dir", str(trials),
         "--command", FAKE, "--estimator", "tests.fake_trial:estimate_memory_bytes", "--no-progress",
         "--confirm", "0", "--proposer", "grid", *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _table(trials: Path, study: str) -> dict:
    s = optuna.load_study(study_name=study, storage=f"sqlite:///{trials / study / 'study.db'}")
    return {
        tuple(sorted(t.params.items())): (t.user_attrs.get(Attr.STATUS), t.user_attrs.get(Attr.OBJECTIVE))
        for t in s.get_trials()
    }


def test_a_study_through_slurm_gives_the_table_the_local_executor_gives(tmp_path, slurm):
    # micro-batch 64 x 256 tokens is over the fake's 1 GiB (an OOM whatever the lr); lr 0.5 is a NaN
    params = {"training.micro_batch_size": [4, 64], "optim.lr": [0.003, 0.5]}
    space = space_file(tmp_path, "same", params, {"training.seq_len": 256})
    tables = {}
    for executor in ("local", "slurm"):
        trials = tmp_path / executor
        agent = _agent(space, trials, "--executor", executor, "--workers", "2", "--trials", "4", "--no-learn")
        out, _ = agent.communicate(timeout=300)
        assert agent.returncode == 0, out
        tables[executor] = _table(trials, "same")
    assert tables["slurm"] == tables["local"]
    assert sorted(s for s, _ in tables["slurm"].values()) == ["nan", "ok", "oom", "oom"]
    names = sorted(j["name"] for j in slurm.jobs() if j["name"].startswith("msar.same."))
    assert names == [f"msar.same.{i}" for i in range(4)]  # one job per trial, named by study and trial
    assert (tmp_path / "slurm" / "same" / "0000" / "job.sh").exists()


def test_an_agent_killed_9_adopts_its_jobs_and_records_the_one_that_ended_meanwhile(tmp_path, slurm):
    holds = [tmp_path / "hold_a", tmp_path / "hold_b"]
    for h in holds:
        h.touch()
    marker = tmp_path / "started"
    space = space_file(tmp_path, "adopt", {"fake.hold": [str(h) for h in holds]}, {"fake.marker": str(marker)})
    trials = tmp_path / "trials"
    first = _agent(space, trials, "--executor", "slurm", "--workers", "2", "--trials", "2")
    wait_for(lambda: marker.exists() and len(marker.read_text().splitlines()) == 2, 120, "both jobs to run")
    first.kill()
    first.wait()
    holds[0].unlink()  # trial a ends while no agent watches it
    wait_for(lambda: any(j["state"] == "COMPLETED" for j in slurm.jobs() if j["name"].startswith("msar.adopt.")), 60)
    second = _agent(space, trials, "--executor", "slurm", "--workers", "2", "--trials", "2")
    wait_for(lambda: (trials / "adopt" / "0000" / "trial_summary.json").exists(), 30)
    time.sleep(3)
    holds[1].unlink()
    out, _ = second.communicate(timeout=120)
    assert second.returncode == 0, out
    assert out.count("adopted its job") == 2, out
    assert sorted(s for s, _ in _table(trials, "adopt").values()) == ["ok", "ok"]
    assert len(marker.read_text().splitlines()) == 2  # neither trial ran twice
    assert len([j for j in slurm.jobs() if j["name"].startswith("msar.adopt.")]) == 2  # no duplicate job


def test_slurms_time_limit_becomes_timeout(tmp_path, slurm):
    # the fake ignores SIGTERM and never ends; its own budget is past Slurm's one minute
    spec = _fake_spec(tmp_path, "fake.hang=true", limit=50.0)
    job = SlurmExecutor().start(spec, Slot(0, ""))
    result = wait(job, spec)
    assert result.status == Status.TIMEOUT
    assert "time limit" in result.reason and job.job_id in result.reason


def _held_job(tmp_path: Path) -> tuple[SlurmJob, TrialSpec]:
    """A fake trial that waits (up to 300 s) for a file that stays, once Slurm runs it."""
    hold = tmp_path / "hold"
    hold.touch()
    spec = _fake_spec(tmp_path, f"fake.hold={hold}", "trial.max_wall_time_sec=300", limit=400)
    job = SlurmExecutor().start(spec, Slot(0, ""))
    wait_for(lambda: job.poll(0.5) is None and job.started is not None, 60, "the job to run")
    return job, spec


def test_a_persons_scancel_is_recorded_as_cancelled(tmp_path, slurm):
    job, spec = _held_job(tmp_path)
    subprocess.run(["scancel", job.job_id], check=True)
    result = wait(job, spec)
    assert result.status == Status.CANCELLED and "cancelled outside the agent" in result.reason


def test_a_failed_node_is_classified_never_a_hang(tmp_path, slurm):
    job, spec = _held_job(tmp_path)
    slurm.stop_slurmd()  # the node is gone: its daemon and the job's processes
    try:
        start = time.monotonic()
        result = wait(job, spec)
        assert result.status == Status.NODE_FAIL, result.reason
        assert slurm.node in result.reason
        assert time.monotonic() - start < 5 * slurm.slurmd_timeout + 60  # Slurm's timeout, not the trial's 400 s
    finally:
        slurm.start_slurmd()


def test_a_real_two_rank_trial_under_srun_equals_the_local_run(tmp_path, slurm):
    overrides = ("model=tiny", "parallel.dp_replicate=2", "trial.max_steps=3", "training.log_interval=1")
    local = run_trial(list(overrides), tmp_path / "local", timeout=600)
    trial_dir = tmp_path / "slurm"
    trial_dir.mkdir()
    spec = TrialSpec(
        argv=(sys.executable, "-m", "core.train", *overrides, f"trial.dir={trial_dir}"),
        trial_dir=trial_dir,
        name="msar.core.0",
        resources=Resources(devices_per_node=2, cores_per_node=2),
        limit=600,
        cwd=ROOT,
    )
    remote = wait(SlurmExecutor().start(spec, Slot(0, "")), spec)
    assert (local.status, remote.status) == (Status.OK, Status.OK), remote.reason
    assert len(remote.summary["ranks"]) == 2
    losses = [[row["loss"] for row in map(json.loads, (d / "metrics.jsonl").read_text().splitlines()) if "loss" in row]
              for d in (tmp_path / "local", trial_dir)]  # fmt: skip
    assert len(losses[1]) == 3 and losses[0] == pytest.approx(losses[1], rel=1e-6, abs=0)


@pytest.mark.skipif(bool(netns.missing()), reason=netns.missing() or "ok")
def test_a_two_node_job_equals_one_process(tmp_path, monkeypatch):
    """Two Slurm nodes, a slurmd in each of two network namespaces: srun starts one supervisor per node, node 0's
    writes the summary; data parallelism across them reproduces one process."""
    base = ("model=tiny", "seed=5", "trial.max_steps=10", "checkpoint.interval=5")
    reference = TrialRun(0, tmp_path / "one", "")
    assert run_trial(list(base), reference.dir, timeout=600).status == Status.OK
    trial_dir = tmp_path / "two"
    trial_dir.mkdir()
    spec = TrialSpec(
        argv=(sys.executable, "-m", "core.train", *base, "parallel.dp_replicate=2", f"trial.dir={trial_dir}"),
        trial_dir=trial_dir,
        name="msar.nodes.0",
        resources=Resources(nodes=2, devices_per_node=1),
        limit=600,
        cwd=ROOT,
    )
    with netns.hosts(2) as hosts:
        cluster = SlurmCluster(hosts=hosts).start()
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        try:
            result = wait(SlurmExecutor().start(spec, Slot(0, "")), spec)
        finally:
            cluster.stop()
    assert result.status == Status.OK, result.reason
    assert [(r["rank"], r["node"]) for r in result.summary["ranks"]] == [(0, 0), (1, 1)]
    assert_same_run(TrialRun(0, trial_dir, ""), reference, 10)
