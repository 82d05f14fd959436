"""What a cluster costs a trial (issue "Cluster", Measure), side by side in one run on this machine:

1. The Slurm executor against the local one: submission to the trial's first step, median of ``--rounds`` runs
   each, interleaved (a real Slurm started for the run: tests/slurm_cluster.py; both start the trial cold, as a
   Slurm job always does; the local executor's warm start, the agent's default, is shown too).
2. A 2-node data-parallel trial against the same 2 ranks on one node: the step time's median, the two nodes being
   network namespaces joined through a bridge (tests/netns.py), so the difference is what crossing those links
   costs next to loopback, on the same two cores.

    .venv/bin/python benchmarks/cluster_overhead.py [--rounds 10] [--model small] [--steps 20]

Needs root (slurmd, network namespaces) and Debian's slurm-wlm and munge.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from provenance import cpu_info, git_commit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoresearch.execute import LocalExecutor, Resources, SlurmExecutor, TrialSpec, wait  # noqa: E402
from autoresearch.execute.slots import Slot  # noqa: E402
from core.trial import fork_server  # noqa: E402
from tests import netns  # noqa: E402
from tests.slurm_cluster import SlurmCluster  # noqa: E402

TINY = ("model=tiny", "trial.max_steps=2", "training.log_interval=1")


def first_step_after(executor, trial_dir: Path) -> float:
    """Seconds from asking ``executor`` to start a tiny trial to its first logged step."""
    trial_dir.mkdir(parents=True)
    spec = TrialSpec(
        argv=(sys.executable, "-m", "core.train", *TINY, f"trial.dir={trial_dir}"),
        trial_dir=trial_dir,
        name=f"msar.bench.{trial_dir.name}",
        resources=Resources(),
        limit=300,
        cwd=ROOT,
    )
    metrics, seen = trial_dir / "metrics.jsonl", []

    def watch():
        while not (metrics.exists() and metrics.read_text().strip()):
            time.sleep(0.005)
        seen.append(time.monotonic())

    watcher = threading.Thread(target=watch, daemon=True)
    start = time.monotonic()
    watcher.start()
    result = wait(executor.start(spec, Slot(0, "")), spec)
    watcher.join(timeout=10)
    if result.status != "ok" or not seen:
        raise SystemExit(f"{executor.name} trial failed: {result.status} {result.reason}")
    return seen[0] - start


def step_time(argvs: list[list[str]], trial_dir: Path) -> float:
    """Run one trial's node commands together; the summary's median step time (ms)."""
    procs = [subprocess.Popen(a, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT) for a in argvs]
    codes = [p.wait(timeout=900) for p in procs]
    summary = json.loads((trial_dir / "trial_summary.json").read_text())
    if codes[0] != 0:
        raise SystemExit(f"trial in {trial_dir} ended {summary['status']}: {summary['reason']}")
    return summary["metrics"]["step_time_ms_median"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="msar-cluster-bench-"))
    print(f"commit {git_commit()}; {cpu_info()}; {time.strftime('%Y-%m-%d')}")

    cluster = SlurmCluster().start()
    os.environ["SLURM_CONF"] = str(cluster.conf)
    times: dict[str, list[float]] = {"local, cold": [], "local, warm": [], "slurm": []}
    try:
        with fork_server.serving():
            for i in range(args.rounds):
                times["local, warm"].append(first_step_after(LocalExecutor(), root / f"warm{i}"))
        for i in range(args.rounds):
            times["local, cold"].append(first_step_after(LocalExecutor(), root / f"local{i}"))
            times["slurm"].append(first_step_after(SlurmExecutor(), root / f"slurm{i}"))
    finally:
        cluster.stop()
    print(f"\nsubmission to first step, model=tiny, 1 rank, median of {args.rounds} (min-max), seconds")
    for name, xs in times.items():
        print(f"  {name:12s} {statistics.median(xs):6.2f}  ({min(xs):.2f}-{max(xs):.2f})")
    print(
        f"  slurm - local, cold: {statistics.median(times['slurm']) - statistics.median(times['local, cold']):+.2f} s"
    )

    train = [f"model={args.model}", "parallel.dp_replicate=2", f"trial.max_steps={args.steps}"]
    steps: dict[str, list[float]] = {"1 node, 2 ranks": [], "2 nodes (namespaces), 1 rank each": []}
    with netns.hosts() as hosts:
        for i in range(3):
            d = root / f"one{i}"
            steps["1 node, 2 ranks"].append(
                step_time([[sys.executable, "-m", "core.train", *train, f"trial.dir={d}"]], d)
            )
            d = root / f"two{i}"
            argv = [sys.executable, "-m", "core.train", *train, f"trial.dir={d}"]
            steps["2 nodes (namespaces), 1 rank each"].append(
                step_time([netns.node_command(hosts, k, argv) for k in range(2)], d)
            )
    print(f"\nstep time, model={args.model}, dp_replicate=2, {args.steps} steps, median of 3 trials' medians, ms")
    for name, xs in steps.items():
        print(f"  {name:28s} {statistics.median(xs):8.1f}  ({min(xs):.1f}-{max(xs):.1f})")
    ratio = statistics.median(steps["2 nodes (namespaces), 1 rank each"]) / statistics.median(steps["1 node, 2 ranks"])
    print(f"  2 nodes / 1 node: {ratio:.3f}")


if __name__ == "__main__":
    main()
