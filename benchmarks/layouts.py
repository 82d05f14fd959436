"""Speed and memory of every mesh layout against the 1-process run, side by side in one run (issue "Mesh
parallelism I", Measure): the table the agent's ``parallel.yaml`` study searches.

    .venv/bin/python benchmarks/layouts.py [--models small medium] [--steps 12] [--rounds 2]
    .venv/bin/python benchmarks/layouts.py --models small --layouts "1 process" tp=2 "tp=2 sp" --against f7a01a7

``--against REV`` runs each layout also at another commit (a git worktree of it, the same interpreter), the two
alternating within each round (which runs first alternating too), and prints the two side by side: what a change
to the core did, in one run.

Each (model, layout) is a real trial through the CLI (AdamW, global batch 8 x 64 tokens, jit); layouts alternate
within each round so that load on this shared machine hits them alike; medians over rounds. Reported: median step
time, tokens/s, each rank's peak memory (VmHWM), its counted parameter + gradient + optimizer bytes, the memory
estimate's error (``core.memory``; held-out layouts marked: their kind of layout was not in the fit), and the
share of rank 0's step time spent in collectives, from one more run per layout under MindSpore's profiler
(``training.profile=true``, core.runtime.profiling; the profiler slows steps, so that run's times are not used).

On 2 cores a 4-rank layout runs two ranks per core: its step times measure oversubscription as much as the
layout. Ratios from one run are what count (machines of one kind differ ~2x in absolute time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MiB = 2**20

LAYOUTS = {  # name -> (overrides, held out of the memory fit)
    "1 process": ([], False),
    "dp_replicate=2": (["parallel.dp_replicate=2"], False),
    "dp_shard=2": (["parallel.dp_shard=2"], False),
    "tp=2": (["parallel.tp=2"], False),
    "tp=2 sp": (["parallel.tp=2", "parallel.sp=true"], True),
    "cp=2": (["parallel.cp=2"], False),
    "hsdp 2x2": (["parallel.dp_replicate=2", "parallel.dp_shard=2"], True),
    "tp=2 dp_shard=2": (["parallel.tp=2", "parallel.dp_shard=2"], True),
    "cp=2 tp=2": (["parallel.cp=2", "parallel.tp=2"], True),
    # ZeRO-1 (core.parallel.zero1): weights and gradients whole, masters and AdamW's states sharded
    "zero1 dp_shard=2": (["parallel.dp_shard=2", "parallel.dp_shard_strategy=optim"], True),
}


def run(overrides: list[str], out: Path, cwd: Path = ROOT) -> dict:
    """One trial of the core checked out at ``cwd`` (``python -m`` imports the ``core`` of its working directory)."""
    # compile_cache=false: every layout compiles its graphs (their memory is part of the peak on CPU)
    subprocess.run(
        [sys.executable, "-m", "core.train", *overrides, "execution.compile_cache=false", f"trial.dir={out}"],
        cwd=cwd,
        capture_output=True,
    )
    s = json.loads((out / "trial_summary.json").read_text())
    if s["status"] != "ok":
        raise SystemExit(f"{overrides}: trial ended {s['status']}: {s['reason']}")
    return s


def run_rounds(rows: dict[str, list[str]], rounds: int, tmp: Path, runner=run) -> dict[str, list[dict]]:
    """Each row's trial (its full overrides) once per round, rows alternating within a round, so that load on a
    shared machine hits them alike: {row: [summary per round]}. ``runner(overrides, out_dir)`` runs one row and
    returns its trial summary (default: the core's CLI; a peer framework's runner writes the same summary)."""
    results: dict = {}
    for r in range(rounds):
        for i, (name, overrides) in enumerate(rows.items()):
            s = runner(overrides, tmp / f"{i}_{r}")
            results.setdefault(name, []).append(s)
            print(f"  {name} #{r + 1}: {s['metrics']['step_time_ms_median']:.0f} ms", file=sys.stderr)
    return results


def bench_args(doc: str, model: str, **extra: int) -> argparse.Namespace:
    """--model, --steps and --rounds of a side-by-side benchmark, and ``--name value`` for each integer option in
    ``extra`` (name -> default; underscores become dashes)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--model", default=model)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    for name, default in extra.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    return ap.parse_args()


def state_bytes(s: dict) -> int:
    per_rank = [r["state_bytes"] for r in s.get("ranks", [])] or [s["metrics"]["state_bytes"]]
    return max(b["params"] + b["grads"] + b["optimizer"] for b in per_rank)


def main() -> None:
    from core.config import load_config
    from core.memory import estimate_memory_bytes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["small", "medium"])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    ap.add_argument("--against", metavar="REV", help="run each layout at this commit too, side by side")
    args = ap.parse_args()
    layouts = {name: LAYOUTS[name] for name in args.layouts}
    base = [
        "training.global_batch_size=8",
        "training.seq_len=64",
        f"trial.max_steps={args.steps}",
        "training.eval_batches=1",
    ]
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.against:
            against(args, layouts, base, Path(tmp))
            return
        for r in range(args.rounds):
            for model in args.models:
                for i, (name, (overrides, _)) in enumerate(layouts.items()):
                    s = run([f"model={model}", *base, *overrides], Path(tmp) / f"{model}{i}_{r}")
                    results.setdefault((model, name), []).append(s)
                    print(f"  {model} {name} #{r + 1}: {s['metrics']['step_time_ms_median']:.0f} ms", file=sys.stderr)
        for model in args.models:
            for i, (name, (overrides, _)) in enumerate(layouts.items()):
                s = run([f"model={model}", *base, *overrides, "training.profile=true"], Path(tmp) / f"{model}{i}_p")
                results[(model, name, "profiled")] = s
    print(
        f"\n### Layouts — {time.strftime('%Y-%m-%d')}, commit {git_commit()}, {args.rounds} alternating rounds of "
        f"{args.steps} steps, AdamW, jit, global batch 8 x 64\n"
    )
    for model in args.models:
        ref = results[(model, "1 process")]
        ref_ms = statistics.median(s["metrics"]["step_time_ms_median"] for s in ref)
        ref_state = state_bytes(ref[0])
        print(f"\n`model={model}`\n")
        print(
            "| layout | ranks | step (ms) | vs 1 process | tokens/s | time in collectives | peak MiB per rank | "
            "state MiB per rank (vs 1 process) | estimate error |"
        )
        print("|---|---:|---:|---:|---:|---:|---|---:|---:|")
        for name, (overrides, held_out) in layouts.items():
            runs = results[(model, name)]
            ms = statistics.median(s["metrics"]["step_time_ms_median"] for s in runs)
            tps = statistics.median(s["metrics"]["tokens_per_sec"] for s in runs)
            peaks = [
                max(p or 0 for p in col)
                for col in zip(*(s["metrics"]["peak_memory_bytes_per_rank"] for s in runs), strict=True)
            ]
            est = estimate_memory_bytes(load_config([f"model={model}", *base, *overrides]))
            err = (est - max(peaks)) / max(peaks)
            st = state_bytes(runs[0])
            comm = results[(model, name, "profiled")]["metrics"]["comm_time_share"]
            print(
                f"| {name} | {runs[0]['layout']['world_size']} | {ms:.0f} | {ms / ref_ms:.2f}x | {tps:.0f} | "
                f"{'-' if comm is None else f'{100 * comm:.0f}%'} | "
                f"{' / '.join(f'{p / MiB:.0f}' for p in peaks)} | {st / MiB:.1f} ({st / ref_state:.2f}) | "
                f"{100 * err:+.1f}%{' (held out)' if held_out else ''} |"
            )


def against(args: argparse.Namespace, layouts: dict, base: list[str], tmp: Path) -> None:
    """Each layout at this checkout and at ``args.against``, alternating, printed side by side."""
    rev = subprocess.run(["git", "rev-parse", "--short", args.against], cwd=ROOT, capture_output=True, text=True)
    if rev.returncode:
        raise SystemExit(f"--against {args.against}: not a revision of this repository")
    tree = tmp / "against"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.against], cwd=ROOT, check=True)
    try:
        sides = {"this checkout": ROOT, rev.stdout.strip(): tree}
        results: dict = {}
        for r in range(args.rounds):
            for model in args.models:
                for i, (name, (overrides, _)) in enumerate(layouts.items()):
                    order = list(sides.items())[:: -1 if r % 2 else 1]  # neither side always runs first
                    for j, (side, cwd) in enumerate(order):
                        s = run([f"model={model}", *base, *overrides], tmp / f"{model}{i}{j}_{r}", cwd=cwd)
                        results.setdefault((model, name, side), []).append(s)
                        ms = s["metrics"]["step_time_ms_median"]
                        print(f"  {model} {name} at {side} #{r + 1}: {ms:.0f} ms", file=sys.stderr)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=True)
    this, other = sides
    print(
        f"\n### Layouts at {git_commit()} against {other} — {time.strftime('%Y-%m-%d')}, {args.rounds} alternating "
        f"rounds of {args.steps} steps, AdamW, jit, global batch 8 x 64\n"
    )
    print(f"| model | layout | step (ms), {other} | step (ms), this | ratio | peak MiB per rank, {other} | this |")
    print("|---|---|---:|---:|---:|---|---|")
    for model in args.models:
        for name in layouts:
            ms, peaks = {}, {}
            for side in sides:
                runs = results[(model, name, side)]
                ms[side] = statistics.median(s["metrics"]["step_time_ms_median"] for s in runs)
                cols = zip(*(s["metrics"]["peak_memory_bytes_per_rank"] for s in runs), strict=True)
                peaks[side] = " / ".join(f"{max(p or 0 for p in col) / MiB:.0f}" for col in cols)
            print(
                f"| {model} | {name} | {ms[other]:.0f} | {ms[this]:.0f} | {ms[this] / ms[other]:.2f}x | "
                f"{peaks[other]} | {peaks[this]} |"
            )


if __name__ == "__main__":
    main()
