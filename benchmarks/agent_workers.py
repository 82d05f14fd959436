"""Study wall time with --workers 1 and --workers K, side by side in one run (the reason --workers exists).

    .venv/bin/python benchmarks/agent_workers.py [--space hparams.yaml] [--trials 8] [--workers 2] [--repeats 2]

Both runs are the same study: the grid proposer walks the same configs in the same order, so they do the same
work; only how many trials run at once differs (each slot pinned to its own cores, autoresearch.execute.slots). Runs
alternate between the variants so that load on a shared machine hits both alike. Prints a markdown table with
date and commit for benchmarks/RESULTS.md: median study wall time, and the median trial's own wall time (a
trial on fewer cores is slower; the study is faster when trials overlap enough to make up for it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
from provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]


def study_once(space: str, trials: int, workers: int, work: Path) -> tuple[float, list[float]]:
    cmd = [
        sys.executable,
        "-m",
        "autoresearch.agent",
        "--space",
        space,
        "--proposer",
        "grid",
        "--trials",
        str(trials),
        "--workers",
        str(workers),
        "--trials-dir",
        str(work),
        "--study",
        "bench",
        "--no-progress",
    ]
    start = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "ANTHROPIC_API_KEY": ""})
    wall = time.monotonic() - start
    if out.returncode != 0:
        raise SystemExit(f"--workers {workers}: the agent exited {out.returncode}\n{out.stdout[-2000:]}")
    study = optuna.load_study(study_name="bench", storage=f"sqlite:///{work}/bench/study.db")
    ran = [t for t in study.trials if t.user_attrs.get("status") == "ok"]
    if len(ran) != trials:
        raise SystemExit(f"--workers {workers}: {len(ran)} of {trials} trials ended ok; see {work}")
    return wall, [t.user_attrs["wall_time_sec"] for t in ran]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="hparams.yaml")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    variants = (1, args.workers)
    walls: dict[int, list[float]] = {w: [] for w in variants}
    trial_walls: dict[int, list[float]] = {w: [] for w in variants}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for r in range(args.repeats):
        for w in variants:
            with tempfile.TemporaryDirectory(prefix=f"agent-workers-{w}-") as work:
                wall, per_trial = study_once(args.space, args.trials, w, Path(work))
            walls[w].append(wall)
            trial_walls[w].extend(per_trial)
            print(f"  --workers {w} #{r + 1}: {wall:.1f} s", file=sys.stderr)
    commit = git_commit()
    base = statistics.median(walls[1])
    print(
        f"{time.strftime('%Y-%m-%d')}, commit {commit}, {os.cpu_count()} cores: `--space {args.space} "
        f"--proposer grid --trials {args.trials}`, {args.repeats} runs each, alternating.\n"
    )
    print("| workers | study wall s (median) | speed-up vs 1 worker | trial wall s (median) |\n|---:|---:|---:|---:|")
    for w in variants:
        med = statistics.median(walls[w])
        print(f"| {w} | {med:.1f} | {base / med:.2f}x | {statistics.median(trial_walls[w]):.1f} |")


if __name__ == "__main__":
    main()
