"""Search efficiency on a suite of real-run tables: does a proposer's lead hold on spaces it was not tuned on?

    .venv/bin/python benchmarks/search_suite.py [--seeds 10] [--first-seed 100] [--methods random,tpe,...]
                                                [--tables tabular,inside,edge,layouts] [--jobs 2] [--out ...]
    .venv/bin/python benchmarks/search_suite.py --recollect [stale|all] [--tables ...]   # real runs, resumable

Each table (``benchmarks/data/*.json``) holds every config of one space run once with the real core
(``benchmarks/agent_efficiency.py collect --space benchmarks/spaces/<name>.yaml``; each table records its command's
date, commit and machine). A replay is the agent's own loop with the table as its trial command
(``agent_efficiency.replay_once``): it stops when the table's best config has run, or after as many paid runs as the
table has configs (a miss counts as that + 1).

A table whose configs today's core estimates differently from when it was collected is stale
(``table_freshness.py``): the replay refuses it, naming the command that collects it again (``--recollect``: every
config through the real core, into ``<table>.partial.json`` row by row, so a killed collection resumes where it
stopped; the table is replaced when the last row is in). ``--allow-stale`` replays it anyway, marked in the report.

Roles: on the ``dev`` tables, seeds 0-9, the methods and their constants were chosen; the ``held out`` tables were
not replayed while choosing. The report's seeds default to 100-109, unseen on every table. Per table: runs to the
best (median, quartiles), ratio of medians to random, waste (share of runs that ended OOM or NaN, pooled over
seeds), skipped proposals per replay. Aggregated over the held-out tables, and over all: the geometric mean of the
ratios, and the pooled waste. ``edge-nan`` is a ``stand-in``: ``edge`` with its diverged runs as NaN exits, as the
table issue "Agent IV" keeps aside recorded them (``STAND_INS``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import agent_efficiency as ae
from provenance import cpu_info, git_commit
from table_freshness import freshness

from autoresearch.records import config_key, diverged

ROOT = ae.ROOT
# name -> (table file under benchmarks/data, role)
TABLES = {
    "tabular": ("tabular.json", "dev"),
    "inside": ("table_inside.json", "dev"),
    "edge": ("table_edge.json", "held out"),
    "layouts": ("table_layouts.json", "held out"),
    "schedules": ("table_schedules.json", "held out"),
    "edge-nan": ("table_edge.json", "stand-in"),
}
# No table of its own: the stand-in for the table issue "Agent IV" keeps aside (edge's space collected at f8af8f1,
# where lr 1.0 ended in NaN exits; at 13e2aab the same configs run to a blown-up loss instead), edge's rows with each
# diverged run a NaN exit (``nan_exits``).
STAND_INS = {"edge-nan"}
METHODS = ("random", "tpe", "tpe+memory", "random+memory", "gp")


def _replay(job: tuple) -> dict:
    name, path, method, seed, budget, best_key, work = job
    r = ae.replay_once(Path(path), method, seed, budget, Path(work) / name, best_key, max_proposals=20 * budget)
    return {**r, "table": name}


def table_path(name: str) -> Path:
    return ROOT / "benchmarks" / "data" / TABLES[name][0]


def nan_exits(table: dict) -> dict:
    """``table`` with each run that ended ok on a diverged loss turned into a NaN exit (code 12, no objective)."""
    rows = []
    for r in table["rows"]:
        if r["status"] == "ok" and diverged(r["summary"]["metrics"]):
            summary = {**r["summary"], "status": "nan", "exit_code": 12}
            r = {**r, "status": "nan", "exit_code": 12, "objective": None, "summary": summary}
        rows.append(r)
    return {**table, "rows": rows}


def check_fresh(tables: list[str], allow_stale: bool) -> dict[str, str]:
    """Each table's freshness verdict; refuses a stale one unless ``allow_stale``, naming the command to run."""
    from autoresearch.core_adapter import estimate_with_core

    verdicts = {n: freshness(json.loads(table_path(n).read_text()), estimate_with_core) for n in tables}
    for n, v in verdicts.items():
        print(f"{n:9s} {v.text()}", flush=True)
    stale = [n for n, v in verdicts.items() if v.stale]
    if stale and not allow_stale:
        raise SystemExit(
            f"stale tables {stale}: collect them again at this commit with `.venv/bin/python "
            f"benchmarks/search_suite.py --recollect --tables {','.join(stale)}` (real runs, resumable), or "
            "replay them as they are with --allow-stale"
        )
    return {n: v.text() for n, v in verdicts.items()}


def recollect(tables: list[str], which: str) -> None:
    """Collect each table again through the real core (``agent_efficiency.collect``): the stale ones, or all.
    Rows go to ``<table>.partial.json`` as they finish (a killed run resumes there); the table is replaced whole
    once every config has a row."""
    from autoresearch.core_adapter import estimate_with_core

    for name in tables:
        if name in STAND_INS:
            print(f"{name}: a stand-in made from {TABLES[name][0]}; collect that one", flush=True)
            continue
        path = table_path(name)
        table = json.loads(path.read_text())
        verdict = freshness(table, estimate_with_core)
        if which == "stale" and not verdict.stale:
            print(f"{name}: {verdict.text()}; kept", flush=True)
            continue
        partial = path.with_suffix(".partial.json")
        args = argparse.Namespace(
            space=str(ROOT / table["space"]),
            out=str(partial),
            trials_dir=str(ROOT / "trials" / f"recollect-{name}"),
            resume=True,
        )
        ae.collect(args)  # returns once every config has its row
        partial.replace(path)
        fresh = json.loads(path.read_text())
        print(f"{name}: collected again, {freshness(fresh, estimate_with_core).text()}", flush=True)


def run(tables: list[str], methods: list[str], seeds: list[int], jobs: int) -> tuple[dict, list[dict]]:
    meta, work_list = {}, []
    work = tempfile.mkdtemp(prefix="search-suite-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None)
    for name in tables:
        path = table_path(name)
        table = json.loads(path.read_text())
        meta_path = str(path.relative_to(ROOT))
        if name in STAND_INS:
            table, path = nan_exits(table), Path(work) / f"{name}.json"
            path.write_text(json.dumps(table))
            meta_path += " (diverged runs as NaN exits)"
        best = ae.best_row(table)
        meta[name] = {
            "path": meta_path,
            "role": TABLES[name][1],
            "configs": len(table["rows"]),
            "space": table["space"],
            "objective": table["objective"],
            "date": table["date"],
            "commit": table["git_commit"],
            "cpu": table["machine"]["cpu"],
            "statuses": dict(Counter(r["status"] for r in table["rows"])),
            "best": {"index": best["index"], "params": best["params"], "objective": best["objective"]},
        }
        for method in methods:
            for seed in seeds:
                work_list.append((name, str(path), method, seed, len(table["rows"]), config_key(best["params"]), work))
    results = []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for r in pool.map(_replay, work_list):
            results.append(r)
            print(
                f"{r['table']:8s} {r['method']:14s} seed {r['seed']:3d}: {r['runs']:3d} runs, ended {r['ended']:6s}"
                f" oom {r['oom']} nan {r['nan']} skipped {r['skipped']}",
                flush=True,
            )
    return meta, results


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def aggregate(per_table: dict[str, list[dict]], names: list[str], methods: list[str]) -> list[dict]:
    """Per method over ``names``: geometric mean of the median ratios to random, pooled waste."""
    out = []
    for m in methods:
        ratios, runs, failed = [], 0, 0
        for name in names:
            s = {x["method"]: x for x in per_table[name]}
            if m in s and "random" in s:
                ratios.append(s[m]["median"] / s["random"]["median"])
                runs, failed = runs + s[m]["runs"], failed + s[m]["failed"]
        if ratios:
            out.append(
                {
                    "method": m,
                    "geomean_ratio": _geomean(ratios),
                    "worst_ratio": max(ratios),
                    "waste": failed / runs if runs else 0.0,
                    "tables": len(ratios),
                }
            )
    return out


def markdown(meta: dict, per_table: dict, args, elapsed: float) -> str:
    held = [n for n in meta if meta[n]["role"] == "held out"]
    lines = [
        f"Date {datetime.date.today()}, commit {git_commit()}, CPU {cpu_info()}.",
        f"`benchmarks/search_suite.py --seeds {args.seeds} --first-seed {args.first_seed} --tables "
        f"{','.join(meta)} --methods {','.join(args.methods)}` ({elapsed:.0f} s). Seeds "
        f"{args.first_seed}-{args.first_seed + args.seeds - 1}: unseen while choosing methods and constants.",
        "",
        "| table | role | configs (statuses) | objective | best config | collected | memory estimate since |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, m in meta.items():
        best = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in m["best"]["params"].items())
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(m["statuses"].items()))
        lines.append(
            f"| {n} | {m['role']} | {m['configs']} ({statuses}) | {m['objective']['direction']} "
            f"{m['objective']['metric']} | #{m['best']['index']} {best} ({m['best']['objective']:.5g}) | "
            f"{m['date'][:10]}, {m['commit']} | {m['freshness']} |"
        )
    lines += [
        "",
        "| table | method | runs to best: median (q1–q3) | vs random | reached | waste OOM+NaN | diverged (ran ok) "
        "| skipped per replay |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n, summary in per_table.items():
        rand = next((s["median"] for s in summary if s["method"] == "random"), None)
        for s in summary:
            lines.append(
                f"| {n} | {s['method']} | {ae._fmt(s['median'])} ({ae._fmt(s['q1'])}–{ae._fmt(s['q3'])}) | "
                f"{ae._vs(s['median'], rand)} | {s['reached']}/{s['n']} | {100 * s['waste']:.1f}% | "
                f"{100 * s.get('diverged', 0):.1f}% | {s['skipped']:.1f} |"
            )
    for label, names in (("held-out tables (" + ", ".join(held) + ")", held), ("all tables", list(meta))):
        agg = aggregate(per_table, names, args.methods)
        if not agg:
            continue
        lines += [
            "",
            f"Aggregated over the {label}:",
            "",
            "| method | geometric mean of runs-to-best ratios vs random | worst table | pooled waste |",
            "|---|---:|---:|---:|",
        ]
        lines += [
            f"| {a['method']} | {a['geomean_ratio']:.2f}× | {a['worst_ratio']:.2f}× | {100 * a['waste']:.1f}% |"
            for a in agg
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", default=",".join(TABLES))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "data" / "search_suite.md"))
    ap.add_argument("--recollect", nargs="?", const="stale", choices=("stale", "all"), help="collect tables again")
    ap.add_argument("--allow-stale", action="store_true", help="replay stale tables as they are (marked)")
    args = ap.parse_args(argv)
    args.methods = args.methods.split(",")
    tables = [t for t in args.tables.split(",") if t]
    unknown = [t for t in tables if t not in TABLES] + [m for m in args.methods if m not in ae.METHODS]
    if unknown:
        raise SystemExit(f"unknown table or method {unknown}: tables {list(TABLES)}, methods {list(ae.METHODS)}")
    if args.recollect:
        recollect(tables, args.recollect)
        return 0
    fresh = check_fresh(tables, args.allow_stale)
    start = time.monotonic()
    meta, results = run(tables, args.methods, list(range(args.first_seed, args.first_seed + args.seeds)), args.jobs)
    for n in meta:
        meta[n]["freshness"] = fresh[n]
    per_table = {n: ae.summarize([r for r in results if r["table"] == n], meta[n]["configs"]) for n in meta}
    text = markdown(meta, per_table, args, time.monotonic() - start)
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(
        json.dumps({"tables": meta, "summary": per_table, "replays": results}, indent=1) + "\n"
    )
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
