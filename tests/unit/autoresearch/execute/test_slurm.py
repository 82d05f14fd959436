"""The Slurm executor's reading of Slurm, without a cluster: the sbatch line a trial becomes, scontrol's fields
mapped to statuses, adoption by name. tests/integration/test_slurm_executor.py runs it against a real Slurm."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoresearch.execute import Resources, TrialSpec
from autoresearch.execute import slurm as sl
from autoresearch.records import Status


def spec(tmp_path: Path, **resources) -> TrialSpec:
    return TrialSpec(
        argv=("python", "-m", "core.train", "optim.lr=0.01; rm -rf /"),
        trial_dir=tmp_path,
        name="msar.study.7",
        resources=Resources(**resources),
        limit=61.0,
        cwd=tmp_path,
    )


def test_sbatch_line_carries_resources_time_site_and_options_in_order(tmp_path):
    ex = sl.SlurmExecutor(partition="train", account="llm", gres="npu", options=("--qos=high", "--exclusive"))
    args = ex.sbatch_args(spec(tmp_path, nodes=2, devices_per_node=8, cores_per_node=64))
    assert args[:2] == ["sbatch", "--parsable"]
    for flag in ("--job-name=msar.study.7", "--nodes=2", "--ntasks-per-node=1", "--no-requeue", "--time=2",
                 "--cpus-per-task=64", "--gres=npu:8", "--partition=train", "--account=llm"):  # fmt: skip
        assert flag in args
    assert args[-2:] == ["--qos=high", "--exclusive"]  # the site's own options last: they win over ours
    plain = sl.SlurmExecutor().sbatch_args(spec(tmp_path))
    assert not [a for a in plain if a.startswith(("--gres", "--partition", "--account", "--cpus-per-task"))]


def test_the_trials_arguments_reach_srun_as_arguments_never_through_a_shell(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(sl, "_run", lambda argv, env=None: calls.append(argv) or "42;cluster\n")
    job = sl.SlurmExecutor().start(spec(tmp_path), sl.Slot(0, ""))
    assert job.job_id == "42" and job.record == {**job.record, "job_id": "42", "name": "msar.study.7"}
    argv = calls[0]
    assert argv[-5:] == [str(tmp_path / "job.sh"), "python", "-m", "core.train", "optim.lr=0.01; rm -rf /"]
    assert 'exec "$@"' in (tmp_path / "job.sh").read_text()


@pytest.mark.parametrize(
    "text, seconds", [("00:00:07", 7), ("01:02:03", 3723), ("2-00:00:01", 172801), ("05:30", 330), ("9", 9)]
)
def test_slurm_durations(text, seconds):
    assert sl._seconds(text) == seconds


@pytest.mark.parametrize("text, code", [("0:0", 0), ("10:0", 10), ("0:9", -9), ("13:0", 13), ("", None)])
def test_exit_codes(text, code):
    assert sl._exit_code(text) == code


def _job(monkeypatch, *states: dict) -> sl.SlurmJob:
    answers = iter(states)
    monkeypatch.setattr(sl, "job_fields", lambda job_id: next(answers))
    monkeypatch.setattr(sl, "POLL_SEC", 0.0)
    return sl.SlurmJob("5", "msar.s.0", 0.0)


@pytest.mark.parametrize(
    "state, status, words",
    [
        ("TIMEOUT", Status.TIMEOUT, "time limit (00:02:00)"),
        ("OUT_OF_MEMORY", Status.OOM, "out of memory"),
        ("NODE_FAIL", Status.NODE_FAIL, "node3"),
        ("PREEMPTED", Status.PREEMPTED, "preempted"),
        ("CANCELLED", Status.CANCELLED, "cancelled outside the agent"),
        ("COMPLETED", None, ""),
        ("FAILED", None, ""),  # the trial's own summary and exit code decide
    ],
)
def test_ended_states_map_to_statuses(monkeypatch, state, status, words):
    job = _job(
        monkeypatch,
        {"JobState": "PENDING", "RunTime": "00:00:00"},
        {"JobState": "RUNNING", "RunTime": "00:00:30"},
        {"JobState": state, "ExitCode": "0:9", "TimeLimit": "00:02:00", "NodeList": "node3", "RunTime": "00:01:00"},
    )
    assert job.poll(1.0) is None and job.started is None  # queued: the trial's clock has not started
    assert job.poll(1.0) is None and job.started == pytest.approx(sl.time.time() - 30, abs=2)
    ended = job.poll(1.0)
    assert ended.exit_code == -9 and ended.status == status and words in ended.reason


def test_the_agents_own_cancel_is_not_a_persons(monkeypatch):
    job = _job(monkeypatch, {"JobState": "CANCELLED", "ExitCode": "0:15", "RunTime": "00:00:05"})
    monkeypatch.setattr(sl, "_run", lambda argv, env=None: "")
    job.cancel()
    assert job.poll(1.0) == sl.Ended(-15)  # the agent's wait() names it (watchdog or stop)


def test_adoption_by_id_by_name_and_not_at_all(monkeypatch):
    ex = sl.SlurmExecutor()
    monkeypatch.setattr(sl, "job_fields", lambda job_id: {"JobState": "RUNNING"} if job_id in ("8", "9") else None)
    monkeypatch.setattr(sl, "_run", lambda argv, env=None: "9\n" if "--name=msar.s.1" in argv else "")
    assert ex.adopt({"executor": "slurm", "name": "msar.s.0", "job_id": "8"}).job_id == "8"
    assert ex.adopt({"executor": "slurm", "name": "msar.s.1"}).job_id == "9"  # died between sbatch and the record
    assert ex.adopt({"executor": "slurm", "name": "msar.s.2"}) is None  # never submitted: the trial is reaped
    assert ex.adopt({"executor": "slurm", "name": "msar.s.3", "job_id": "3"}) is None  # forgotten by Slurm
    assert ex.adopt({"executor": "local", "host": "h", "pid": 1}) is None
