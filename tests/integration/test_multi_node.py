"""Multi-node trials across real network hosts: two network namespaces made by the test, joined through a bridge, each
with its own address and ports, one supervisor per "node" (as the agent's Slurm job starts them). Layouts across the
two nodes equal one process; a supervisor killed -9, a node that never joins and a stopped rank each end the trial
with a status and a reason that names them, and leave nothing running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import netns
from tests.integration.agent_helpers import dead, wait_for
from tests.integration.conftest import ROOT, TrialRun, assert_same_run, run_trial

STEPS = 10
BASE = ("model=tiny", "seed=5", f"trial.max_steps={STEPS}", "checkpoint.interval=5")


pytestmark = [pytest.mark.timeout(900), pytest.mark.skipif(bool(netns.missing()), reason=netns.missing() or "ok")]


@pytest.fixture(scope="module")
def hosts():
    """Two network namespaces with a veth pair between them: [(namespace, address), ...]; node 0 first."""
    try:
        with netns.hosts() as made:
            yield made
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"network namespaces unavailable here: {exc.stderr.decode().strip()}")


def _start_node(hosts, node: int, trial_dir: Path, *overrides: str, env: dict | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "core.train", *overrides, f"trial.dir={trial_dir}"]
    return subprocess.Popen(
        netns.node_command(hosts, node, argv, env),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _run_nodes(hosts, trial_dir: Path, *overrides: str) -> tuple[TrialRun, list[int]]:
    procs = [_start_node(hosts, k, trial_dir, *overrides) for k in range(len(hosts))]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    return TrialRun(procs[0].returncode, trial_dir, "\n".join(outs)), [p.returncode for p in procs]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_trial(tmp_path_factory.mktemp("one") / "t", *BASE, timeout=600)


def _pids(trial_dir: Path) -> list[int]:
    pids = []
    for f in (trial_dir / "logs").glob("pids*.json"):
        data = json.loads(f.read_text())
        pids += [p for p in [data["scheduler"], *data["ranks"].values()] if p]
    return pids


@pytest.mark.parametrize(
    "layout", [("parallel.dp_replicate=2",), ("parallel.dp_replicate=2", "parallel.tp=2")], ids=["dp2", "tp2xdp2"]
)
def test_a_layout_across_two_hosts_equals_one_process(tmp_path, hosts, reference, layout):
    run, codes = _run_nodes(hosts, tmp_path / "t", *BASE, *layout)
    assert codes == [0, 0], run.output[-3000:]
    assert_same_run(run, reference, STEPS)
    ranks = run.summary["ranks"]
    world = 2 if len(layout) == 1 else 4
    assert [r["rank"] for r in ranks] == list(range(world))
    assert [r["node"] for r in ranks] == [k * 2 // world for k in range(world)]  # node 1's ranks, reported by it
    assert (tmp_path / "t" / "nodes" / "node_1.json").exists()


def test_a_node_whose_supervisor_is_killed_ends_the_trial_everywhere(tmp_path, hosts):
    trial_dir = tmp_path / "t"
    procs = [_start_node(hosts, k, trial_dir, "model=tiny", "parallel.dp_replicate=2", "trial.max_steps=100000")
             for k in range(2)]  # fmt: skip
    metrics = trial_dir / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, 300, "two steps")
    pids = _pids(trial_dir)
    # nsenter execs env, which execs python: the process is the supervisor itself
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait()
    start = time.monotonic()
    out, _ = procs[0].communicate(timeout=120)
    assert time.monotonic() - start < 60, out[-2000:]  # the failure grace and the loss detection, not a hang
    summary = json.loads((trial_dir / "trial_summary.json").read_text())
    assert procs[0].returncode == summary["exit_code"] == 1
    assert summary["status"] == "error" and "node 1" in summary["reason"], summary["reason"]
    wait_for(lambda: all(dead(p) for p in pids), 30, "every rank on both nodes to end")


def test_a_node_that_never_joins_times_out_with_a_reason(tmp_path, hosts):
    trial_dir = tmp_path / "t"
    proc = _start_node(hosts, 0, trial_dir, "model=tiny", "parallel.dp_replicate=2", "trial.max_steps=5",
                       env={"MSAR_JOIN_TIMEOUT_SEC": "15"})  # fmt: skip
    out, _ = proc.communicate(timeout=180)
    summary = json.loads((trial_dir / "trial_summary.json").read_text())
    assert proc.returncode == summary["exit_code"] == 13, out[-2000:]
    assert "node(s) 1 never joined within" in summary["reason"]
    wait_for(lambda: all(dead(p) for p in _pids(trial_dir)), 30, "node 0's ranks to end")


def test_a_stopped_rank_is_a_timeout_naming_it_not_an_error_of_its_peers(tmp_path):
    trial_dir = tmp_path / "t"
    proc = subprocess.Popen(
        [sys.executable, "-m", "core.train", "model=tiny", "model.n_layers=2", "parallel.pp=2",
         "trial.max_steps=100000", f"trial.dir={trial_dir}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "MS_CPU_COMM_OP_TIMEOUT": "20"},  # the peers give up sooner than the default's 15 min
    )  # fmt: skip
    metrics = trial_dir / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, 300, "two steps")
    stopped = json.loads((trial_dir / "logs" / "pids.json").read_text())["ranks"]["1"]
    os.kill(stopped, signal.SIGSTOP)
    out, _ = proc.communicate(timeout=300)
    summary = json.loads((trial_dir / "trial_summary.json").read_text())
    assert proc.returncode == summary["exit_code"] == 13, out[-2000:]
    assert "rank 1 stopped" in summary["reason"], summary["reason"]
    wait_for(lambda: dead(stopped), 30, "the stopped rank to be killed")
