"""The runner against the fake trial: typed outcomes, crashes without a summary, and the watchdog."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from autoresearch import core_adapter
from autoresearch.core_adapter import read_result, watchdog_seconds
from autoresearch.run import runner
from autoresearch.run.runner import run_trial
from core.config import override_value
from core.trial import processes
from tests.schema import assert_summary_schema

FAKE = [sys.executable, str(Path(__file__).resolve().parents[3] / "fake_trial.py")]


def run(tmp_path, *overrides, metric="tokens_per_sec", **kw):
    return run_trial(list(overrides), tmp_path / "t", command=FAKE, objective_metric=metric, **kw)


def test_ok_trial_reads_summary_and_objective(tmp_path):
    r = run(tmp_path, "training.micro_batch_size=4", "training.seq_len=256")
    assert (r.status, r.exit_code) == ("ok", 0)
    assert_summary_schema(r.summary)  # the fake writes what the core writes
    step_ms = 5.0 + 0.02 * 4 * 256
    assert r.objective == pytest.approx(4 * 256 / step_ms * 1000.0)
    assert r.metrics["peak_memory_bytes"] == int(int(64 * 2**20 + 4 * 256 * 128 * 1024) * 1.1)
    assert r.trial_dir == tmp_path / "t"
    assert (tmp_path / "t" / "stdout.log").exists() and (tmp_path / "t" / "stderr.log").exists()


@pytest.mark.parametrize(
    "overrides, status, code",
    [
        (["training.micro_batch_size=64", "training.seq_len=256"], "oom", 10),
        (["optim.lr=0.5"], "nan", 12),
        (["fake.compile_error=true"], "compile_error", 11),
        (["fake.error=true"], "error", 1),
        (["not_a_key.x=1"], "invalid", 2),
        (["fake.sleep=5", "trial.max_wall_time_sec=0.2"], "timeout", 13),
    ],
)
def test_typed_failures(tmp_path, overrides, status, code):
    r = run(tmp_path, *overrides)
    assert (r.status, r.exit_code) == (status, code)
    assert_summary_schema(r.summary)
    assert r.objective is None  # only an ok trial has an objective
    assert r.reason


def test_objective_missing_or_null_gives_none(tmp_path):
    r = run(tmp_path, metric="mfu")  # the fake reports mfu as null
    assert r.status == "ok" and r.objective is None


def test_crash_without_summary_records_signal_and_stderr_tail(tmp_path):
    r = run(tmp_path, "fake.crash=true")
    assert r.summary is None
    assert r.exit_code == -9
    assert r.status == "error"
    assert "SIGKILL" in r.reason
    assert "Segmentation fault (fake)" in r.reason  # the stderr tail


def test_nonzero_exit_without_summary_keeps_its_code(tmp_path):
    r = run_trial(
        ["x=1"], tmp_path / "t", command=[sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(10)"]
    )
    assert (r.status, r.exit_code) == ("oom", 10)
    assert "without writing trial_summary.json" in r.reason and "boom" in r.reason


def test_watchdog_kills_a_hung_trial_that_ignores_sigterm(tmp_path, monkeypatch):
    monkeypatch.setattr(processes, "KILL_WAIT_SEC", 0.5)
    marker = tmp_path / "marker"
    r = run(tmp_path, "fake.hang=true", f"fake.marker={marker}", timeout=1.0, poll_sec=0.2)
    assert r.status == "timeout"
    assert r.exit_code == -9  # SIGTERM was ignored, so the group got SIGKILL
    assert "watchdog" in r.reason and "hanging (fake)" in r.reason
    pid = int(marker.read_text().split()[1])
    assert not Path(f"/proc/{pid}").exists()  # reaped by the runner, not left a zombie


def test_callbacks_get_pid_and_polls(tmp_path):
    pids, polls = [], []
    r = run(tmp_path, "fake.sleep=0.6", on_start=pids.append, on_poll=lambda: polls.append(1), poll_sec=0.1)
    assert r.status == "ok"
    assert len(pids) == 1 and pids[0] > 0
    assert len(polls) >= 1


def test_stop_ends_the_trial_and_raises_interrupted(tmp_path):
    stop, marker = threading.Event(), tmp_path / "marker"
    threading.Timer(0.5, stop.set).start()
    with pytest.raises(runner.Interrupted):
        run(tmp_path, "fake.sleep=30", f"fake.marker={marker}", stop=stop)
    pid = int(marker.read_text().split()[1])
    assert not Path(f"/proc/{pid}").exists()  # ended with its group and reaped
    assert not (tmp_path / "t" / "trial_summary.json").exists()  # it never reached the end of its 30 s


def test_watchdog_budget_from_overrides():
    assert watchdog_seconds(["trial.max_wall_time_sec=100", "trial.grace_sec=5"]) == 100 + 5 + 10
    assert watchdog_seconds(["trial.max_wall_time_sec=1000"]) == 1000 + 30 + 100
    assert watchdog_seconds([]) == core_adapter.DEFAULT_WALL_SEC + 30 + 0.1 * core_adapter.DEFAULT_WALL_SEC
    assert override_value(["a=1", "+b=2", "a=3"], "a") == "3"
    assert override_value(["a=1", "+b=2"], "b") == "2"


def test_torn_summary_counts_as_missing(tmp_path):
    (tmp_path / "trial_summary.json").write_text('{"status": "ok", "metr')
    (tmp_path / "stderr.log").write_text("killed mid-write")
    r = read_result(tmp_path, -9, "tokens_per_sec")
    assert r.summary is None and r.status == "error" and "killed mid-write" in r.reason


def test_argument_list_passes_values_verbatim(tmp_path):
    # No shell: a value with shell syntax reaches the trial as one literal argument.
    r = run(tmp_path, "fake.note=$(touch pwned); echo hi")
    assert r.status == "ok"
    assert (
        json.loads((tmp_path / "t" / "trial_summary.json").read_text())["config"]["fake.note"]
        == "$(touch pwned); echo hi"
    )
    assert not Path("pwned").exists()


def test_the_result_says_whether_the_trial_loaded_its_graphs(tmp_path):
    summary = {"status": "ok", "exit_code": 0, "reason": "ok", "metrics": {"peak_memory_bytes": 5}}
    (tmp_path / "trial_summary.json").write_text(json.dumps({**summary, "compile_cache": "loaded"}))
    assert read_result(tmp_path, 0).metrics == {"peak_memory_bytes": 5, "compile_cache": "loaded"}
    (tmp_path / "trial_summary.json").write_text(json.dumps({**summary, "compile_cache": None}))
    assert read_result(tmp_path, 0).metrics == {"peak_memory_bytes": 5}
