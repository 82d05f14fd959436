"""``search_suite.py --recollect`` (issue "Agent IV"): a stale table is collected again row by row into
``<table>.partial.json``, a killed collection resumes where it stopped, the table is replaced once whole, and a
fresh table is kept. The core is faked at its two seams: the trial runner and the memory estimate."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from autoresearch.records import Status, TrialResult

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
import agent_efficiency  # noqa: E402
import search_suite  # noqa: E402

MiB = 2**20
BATCHES = [8, 16, 32, 64]
SPACE = """\
name: sizes
trial_command: other
objective: {metric: val_loss, direction: minimize}
fixed: {model: tiny, memory.limit_gb: 8}
params:
  training.global_batch_size: {type: choice, values: [8, 16, 32, 64], memory: up}
"""


def peak(batch: int) -> int:  # the fake core's measured peak
    return 100 * MiB * batch


def estimate_now(overrides) -> int:  # today's estimate: 1.5x the peak (the recorded one was exact)
    return 150 * MiB * int(next(o for o in overrides if "global_batch_size" in o).split("=")[1])


@pytest.fixture
def suite(tmp_path, monkeypatch):
    (tmp_path / "benchmarks" / "data").mkdir(parents=True)
    (tmp_path / "sizes.yaml").write_text(SPACE)
    rows = [
        {
            "index": i,
            "params": {"training.global_batch_size": b},
            "status": "ok",
            "objective": 1.0 / b,
            "peak_memory_bytes": peak(b),
            "estimated_memory_bytes": peak(b),
        }
        for i, b in enumerate(BATCHES)
    ]
    table = {"space": "sizes.yaml", "fixed": {"model": "tiny", "memory.limit_gb": 8}, "git_commit": "old", "rows": rows}
    path = tmp_path / "benchmarks" / "data" / "table_sizes.json"
    path.write_text(json.dumps(table))
    monkeypatch.setattr(search_suite, "ROOT", tmp_path)
    monkeypatch.setattr(agent_efficiency, "ROOT", tmp_path)
    monkeypatch.setattr(search_suite, "TABLES", {"sizes": ("table_sizes.json", "dev")})
    monkeypatch.setattr("autoresearch.core_adapter.estimate_with_core", estimate_now)
    ran: list[int] = []

    def run_trial(overrides, trial_dir, *, objective_metric):
        batch = int(next(o for o in overrides if "global_batch_size" in o).split("=")[1])
        if batch == 32 and 32 not in ran:
            ran.append(batch)
            raise KeyboardInterrupt  # killed while running the third config
        ran.append(batch)
        metrics = {"peak_memory_bytes": peak(batch), "estimated_memory_bytes": estimate_now(overrides)}
        metrics[objective_metric] = 1.0 / batch
        summary = {"status": "ok", "exit_code": 0, "reason": "ok", "steps": 1, "metrics": metrics}
        return TrialResult(
            status=Status.OK,
            exit_code=0,
            reason="ok",
            summary=summary,
            objective=1.0 / batch,
            wall_time=1.0,
            trial_dir=Path(trial_dir),
        )

    monkeypatch.setattr("autoresearch.run.runner.run_trial", run_trial)
    return path, ran


def test_a_stale_table_is_collected_again_resumably_and_a_fresh_one_kept(suite, capsys):
    path, ran = suite
    with pytest.raises(SystemExit, match=r"--recollect --tables sizes"):
        search_suite.check_fresh(["sizes"], allow_stale=False)  # estimate moved 50% against an exact record
    with pytest.raises(KeyboardInterrupt):
        search_suite.recollect(["sizes"], "stale")
    partial = json.loads(path.with_suffix(".partial.json").read_text())
    assert [r["params"]["training.global_batch_size"] for r in partial["rows"]] == [8, 16]
    assert json.loads(path.read_text())["git_commit"] == "old"  # the table is untouched until whole
    search_suite.recollect(["sizes"], "stale")  # resumes: only the configs without a row run
    assert ran == [8, 16, 32, 32, 64]
    table = json.loads(path.read_text())
    assert not path.with_suffix(".partial.json").exists() and table["git_commit"] != "old"
    assert [r["estimated_memory_bytes"] for r in table["rows"]] == [
        estimate_now([f"training.global_batch_size={b}"]) for b in BATCHES
    ]
    assert "memory_profile" in table
    search_suite.check_fresh(["sizes"], allow_stale=False)  # fresh now: no exit
    search_suite.recollect(["sizes"], "stale")
    assert len(ran) == 5 and "kept" in capsys.readouterr().out
