"""How noisy is a trial's objective here, how often does a search's raw winner survive confirmation, and where does
a study's device time go?

    .venv/bin/python benchmarks/confirmation.py [--space parallel.yaml] [--studies 3] [--first-seed 0] [--trials 8]
                                                [--confirm 3] [--repeats 3] [--out benchmarks/data/confirmation.md]

Runs ``--studies`` real studies of the agent (``python -m autoresearch.agent``, default proposer, seeds 0, 1, ...,
each with its confirmation phase) and reads them back from their Optuna storage:

- noise: for each confirmed config, σ/mean of the objective over its confirmation runs (fresh processes of one
  config, interleaved with the others);
- survival: whether the search's best run is the config the confirmation names as winner, is among those tied
  within noise, or lost to another config by more than the noise;
- cost: the study's device-seconds (``autoresearch.study.ledger``) split into start-up, compile, steps and unsplit, for the
  search and the confirmation separately.

Every figure is in-sample: the studies measure themselves; nothing here was tuned on them.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
from pathlib import Path

from provenance import cpu_info, git_commit

ROOT = Path(__file__).resolve().parent.parent


def run_study(args, seed: int, trials_dir: Path) -> str:
    name = f"confirm-{args.space.removesuffix('.yaml')}-{seed}"
    cmd = [
        sys.executable,
        "-m",
        "autoresearch.agent",
        "--space",
        args.space,
        "--trials",
        str(args.trials),
        "--confirm",
        str(args.confirm),
        "--repeats",
        str(args.repeats),
        "--seed",
        str(seed),
        "--study",
        name,
        "--trials-dir",
        str(trials_dir),
        "--no-progress",
    ]
    print("$ " + " ".join(cmd[1:]), flush=True)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    print(f"  exit {done.returncode}: {last}", flush=True)
    if done.returncode != 0:
        print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
    return name


def summarise(study_dir: Path) -> dict:
    from autoresearch.study import confirm, ledger, storage
    from autoresearch.study.storage import load_study

    study = load_study(study_dir)
    rows = storage.trial_rows(study)
    v = confirm.recorded_verdict(study)
    best = storage.best_trial(study)
    search = [r for r in rows if r["confirmation_of"] is None]
    confirming = [r for r in rows if r["confirmation_of"] is not None]
    out = {
        "study": study.study_name,
        "line": v.line if v else "no confirmation",
        "configs": [],
        "search": ledger.study_totals(search),
        "confirmation": ledger.study_totals(confirming),
    }
    if v is None or best is None:
        out["survival"] = "no confirmation"
        return out
    for c in v.configs:
        out["configs"].append(
            {
                "trial": c.trial,
                "params": c.params,
                "search": c.search_value,
                "n": c.n,
                "mean": c.mean,
                "cv": c.std / c.mean if c.std is not None and c.mean else None,
            }
        )
    if v.winner is not None:
        out["survival"] = "won" if v.winner.trial == best.number else f"lost to trial {v.winner.trial}"
    else:
        out["survival"] = "tied within noise" if best.number in v.tied else "tied, not top"
    return out


def shares(totals: dict) -> str:
    device = totals["device_sec"] or 0.0
    if not device:
        return "0 s"
    parts = [
        f"{k.removesuffix('_sec')} {100 * (totals.get(k) or 0.0) / device:.0f}%"
        for k in ("startup_sec", "compile_sec", "steps_sec", "unsplit_sec")
    ]
    return f"{device:.0f} device-s: " + ", ".join(parts)


def markdown(args, results: list[dict]) -> str:
    metric_cv = [c["cv"] for r in results for c in r["configs"] if c["cv"] is not None]
    lines = [
        f"Date {datetime.date.today()}, commit {git_commit()}, CPU {cpu_info()}.",
        f"`benchmarks/confirmation.py --space {args.space} --studies {args.studies} --first-seed {args.first_seed} "
        f"--trials {args.trials} "
        f"--confirm {args.confirm} --repeats {args.repeats}` (in-sample: each study measures itself).",
        "",
        "| study | raw winner | verdict | search: device time | confirmation: device time |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['study']} | {r['survival']} | {r['line']} | {shares(r['search'])} | {shares(r['confirmation'])} |"
        )
    lines += ["", "| study | trial | config | search run | n | mean | σ/mean |", "|---|---:|---|---:|---:|---:|---:|"]
    for r in results:
        for c in r["configs"]:
            config = " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in c["params"].items())
            cv = "" if c["cv"] is None else f"{100 * c['cv']:.1f}%"
            mean = "" if c["mean"] is None else f"{c['mean']:.5g}"
            lines.append(f"| {r['study']} | {c['trial']} | {config} | {c['search']:.5g} | {c['n']} | {mean} | {cv} |")
    if metric_cv:
        lines += [
            "",
            f"σ/mean over {len(metric_cv)} confirmed configs: median {100 * statistics.median(metric_cv):.1f}%, "
            f"max {100 * max(metric_cv):.1f}%.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--space", default="parallel.yaml")
    ap.add_argument("--studies", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0, help="the studies' seeds: first-seed, first-seed + 1, ...")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--confirm", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--trials-dir", default=str(ROOT / "trials" / "bench-confirmation"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "data" / "confirmation.md"))
    ap.add_argument("--reuse", action="store_true", help="summarise the studies already in --trials-dir")
    args = ap.parse_args(argv)
    trials_dir = Path(args.trials_dir)
    results = []
    for seed in range(args.first_seed, args.first_seed + args.studies):
        name = f"confirm-{args.space.removesuffix('.yaml')}-{seed}" if args.reuse else run_study(args, seed, trials_dir)
        results.append(summarise(trials_dir / name))
    text = markdown(args, results)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
