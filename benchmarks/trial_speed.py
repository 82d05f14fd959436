"""Trial speed, measured through the real CLI, side by side in one run (issues "Training core v1" and
"Performance I", Measure).

    .venv/bin/python benchmarks/trial_speed.py [--steps 12] [--repeats 2] [overrides ...]

1. ``model=small`` and ``model=medium``: median step time and tokens/s with ``training.mode=jit`` vs ``pynative``,
   and MFU against this machine's fixed reference rate (``metrics.reference_flops_per_sec``, core.reference_rate).
2. Process start to the end of the first step (``startup_sec``), ``model=tiny`` on 1 and on 2 ranks, and each
   start-up phase (``startup_phases_sec``: launch, imports, cluster, build, first step); the tiny variants also
   with their graphs loaded from the compile cache (core.runtime.compile_cache; every other run compiles its graphs), and
   with those graphs and their processes forked from a warm server, as the agent starts its trials (core.trial.fork_server;
   ``startup_sec`` then counts from the fork, which the agent's runner asks for milliseconds before).

``overrides`` are added to every variant (``execution.host_pipeline=true``, say, for MindSpore's own default).
Runs alternate between the variants so that load on this shared machine hits both alike; medians over repeats.
Prints a markdown table with date and commit, for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import cpu_info, git_commit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from core.trial import fork_server as warm
from core.trial.contract import STARTUP_PHASES

VARIANTS = {
    "small jit": ["model=small", "training.mode=jit"],
    "small pynative": ["model=small", "training.mode=pynative"],
    "medium jit": ["model=medium"],
    "tiny 1 rank": ["model=tiny"],
    "tiny 2 ranks (dp)": ["model=tiny", "parallel.dp_replicate=2"],
}
CACHED = ("tiny 1 rank", "tiny 2 ranks (dp)")  # also run with their graphs loaded from the compile cache, cold and warm


def run(overrides: list[str], steps: int, out: Path, cache: Path | None = None, warmed: bool = False) -> dict:
    """One trial; ``cache``: the compile cache's root (the variant loads its graphs), else it compiles them;
    ``warmed``: its processes forked from the warm server that ``main`` runs, else started afresh."""
    flag = f"execution.compile_cache={cache is not None}".lower()
    env = {k: v for k, v in os.environ.items() if warmed or k != warm.SOCKET_ENV}
    if cache:
        env["MSAR_COMPILE_CACHE_DIR"] = str(cache)
    out.mkdir(parents=True)
    with open(out / "stdout.log", "wb") as log:
        start = warm.popen if warmed else subprocess.Popen  # (warm.popen: forked when a server runs)
        proc = start(
            [sys.executable, "-m", "core.train", *overrides, flag, f"trial.max_steps={steps}", f"trial.dir={out}"],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        proc.wait()
    if warmed != isinstance(proc, warm.WarmProcess):
        raise SystemExit(f"{overrides}: meant to start {'warm' if warmed else 'cold'}, started the other way")
    summary = json.loads((out / "trial_summary.json").read_text())
    if summary["status"] != "ok":
        raise SystemExit(f"{overrides}: trial ended {summary['status']}: {summary['reason']}")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("overrides", nargs="*", help="core.train overrides added to every variant")
    args = ap.parse_args()
    variants = {name: [*overrides, *args.overrides] for name, overrides in VARIANTS.items()}
    runs = {name: (overrides, False, False) for name, overrides in variants.items()}
    runs.update({f"{name}, graphs cached": (variants[name], True, False) for name in CACHED})
    runs.update({f"{name}, graphs cached, warm": (variants[name], True, True) for name in CACHED})
    results: dict[str, list[dict]] = {name: [] for name in runs}
    with tempfile.TemporaryDirectory() as tmp, warm.serving():
        cache = Path(tmp) / "cache"
        for name in CACHED:  # fill the cache: one trial of each compiles and saves its graphs
            run(variants[name], 2, Path(tmp) / f"fill{CACHED.index(name)}", cache)
        for r in range(args.repeats):
            for i, (name, (overrides, cached, warmed)) in enumerate(runs.items()):
                out = Path(tmp) / f"v{i}_{r}"  # hydra overrides reject ( ) in values
                results[name].append(run(overrides, args.steps, out, cache if cached else None, warmed))
                if cached and results[name][-1]["compile_cache"] != "loaded":
                    raise SystemExit(f"{name}: the graphs were not loaded from the cache")
                print(f"  done: {name} #{r + 1}", file=sys.stderr)

    def med(name: str, key: str, metrics: bool = True):
        values = [(s["metrics"] if metrics else s)[key] for s in results[name]]
        return statistics.median(v for v in values if v is not None)

    def phase(name: str, key: str) -> float:
        return statistics.median(s["startup_phases_sec"][key] for s in results[name])

    print(
        f"\n### Trial speed — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {git_commit()}, "
        f"{cpu_info()}; {args.repeats} alternating repeats of {args.steps} steps"
        + (f"; every variant with `{' '.join(args.overrides)}`" if args.overrides else "")
        + "\n"
    )
    print(
        f"MFU against the machine's fixed reference rate "
        f"({results['small jit'][0]['metrics']['reference_flops_per_sec'] / 1e9:.0f} GFLOP/s, core.reference_rate)."
        f" Start-up phases in seconds (launch: process up; imports: MindSpore and the trainer; cluster: joined; "
        "build: model, optimizer, schedule; first step: its graphs compiled and run once).\n"
    )
    print("| variant | step median (ms) | tokens/s | MFU | start-up (s) | " + " | ".join(STARTUP_PHASES) + " |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(STARTUP_PHASES))
    for name in runs:
        print(
            f"| {name} | {med(name, 'step_time_ms_median'):.0f} | {med(name, 'tokens_per_sec'):.0f} | "
            f"{med(name, 'mfu'):.3f} | {med(name, 'startup_sec', metrics=False):.1f} | "
            + " | ".join(f"{phase(name, p):.2f}" for p in STARTUP_PHASES)
            + " |"
        )
    speedup = med("small pynative", "step_time_ms_median") / med("small jit", "step_time_ms_median")
    startup = med("tiny 2 ranks (dp)", "startup_sec", False) / med("tiny 1 rank", "startup_sec", False)
    print(
        f"\njit speed-up over PyNative (model=small): **{speedup:.2f}x**; start-up of 2 ranks vs 1: **{startup:.2f}x**"
    )
    for name in CACHED:
        ratio = med(f"{name}, graphs cached", "startup_sec", False) / med(name, "startup_sec", False)
        warmed = med(f"{name}, graphs cached, warm", "startup_sec", False) / med(name, "startup_sec", False)
        print(
            f"start-up of {name} with its graphs from the compile cache: **{ratio:.2f}x** of compiling them; "
            f"forked warm as well: **{warmed:.2f}x**"
        )


if __name__ == "__main__":
    main()
