"""Trials forked from the agent's warm server (core.trial.fork_server) run as cold ones do: same losses, the graphs a cold trial
saved load in a warm one, and a multi-rank trial's scheduler and workers are warm too."""

import json
import os

import pytest

from autoresearch.run.runner import run_trial as run_agent_trial
from core.trial import fork_server as warm
from tests.integration.conftest import ROOT, assert_same_run, losses, run_trial

pytestmark = pytest.mark.slow
BASE = ("model=tiny", "trial.max_steps=3", "training.eval_batches=1", "checkpoint.at_end=true")


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """A cold trial, run first: it compiles its graphs and publishes them to this module's compile cache."""
    root = tmp_path_factory.mktemp("warm")
    run = run_trial(root / "cold", *BASE, f"execution.compile_cache_dir={root / 'cache'}")
    assert run.code == 0, run.output
    return root, run


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_warm_trials_reproduce_cold_ones_and_load_their_graphs(cold, monkeypatch):
    root, cold_run = cold
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("GLOG_v", "2")  # MindSpore's warnings, among them its compile cache's refusals
    parents = []
    with warm.serving():
        one = run_agent_trial(
            [*BASE, f"execution.compile_cache_dir={root / 'cache'}"],
            root / "warm1",
            on_start=lambda pid: parents.append(parent_of(pid)),
        )
        two = run_agent_trial(
            [*BASE, "parallel.dp_replicate=2", f"execution.compile_cache_dir={root / 'cache'}"], root / "warm2"
        )
    assert one.status == "ok" and two.status == "ok", (one.reason, two.reason)
    assert parents and parents[0] != os.getpid()  # the server forked the trial; it is not the runner's child
    assert one.summary["compile_cache"] == "loaded"
    # MindSpore used the cold trial's graphs: its check of the entry script's dependencies passed (it warns
    # "dependency files ... changed" and compiles anew otherwise, as it did before core.trial.fork_server._as_entry_script).
    assert (
        "dependency files"
        not in (one.trial_dir / "stderr.log").read_text() + (one.trial_dir / "stdout.log").read_text()
    )
    run = type(cold_run)(0, one.trial_dir, "")
    assert_same_run(run, cold_run, 3)
    # Two data-parallel ranks (scheduler and workers forked from the server) train on the same global batch.
    got, want = losses(type(cold_run)(0, two.trial_dir, "")), losses(cold_run)
    assert got.keys() == want.keys()
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-5)
    pids = json.loads((two.trial_dir / "logs" / "pids.json").read_text())
    assert pids["scheduler"] and len(pids["ranks"]) == 2
