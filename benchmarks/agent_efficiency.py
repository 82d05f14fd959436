"""How fast does each proposer find the best config, and how many runs does it waste on OOM and NaN?

    .venv/bin/python benchmarks/agent_efficiency.py collect [--resume]        # every config once, real core
    .venv/bin/python benchmarks/agent_efficiency.py replay [--seeds 20] [--budget N]
    .venv/bin/python benchmarks/agent_efficiency.py demo [--seed 0] [--trials 16]  # a real study, OOM dominance

A tabular benchmark (the way NAS-Bench and HPOBench make optimiser comparisons cheap and repeatable):

1. ``collect`` runs every config of ``benchmarks/spaces/tabular.yaml`` once through the real trial CLI
   (``python -m core.train``, via ``autoresearch.run.runner.run_trial``) and keeps the outcomes as data in
   ``benchmarks/data/tabular.json``: params, status, exit code, objective, measured and estimated peak memory,
   wall time, and the summary each trial wrote. Failures are real: the OOMs are the core's memory budget
   (exit 10) and the NaNs a learning rate that really diverges (exit 12).
2. ``replay`` runs the agent itself — ``autoresearch.run.session.Session``: its proposers, Optuna study, typed-failure
   constraints, feasibility memory and memory gate — with this file's ``trial`` subcommand as the trial command
   (the agent's ``--command``). That command looks the config up in the table, writes the stored
   ``trial_summary.json`` and exits with the stored code, so the agent decides exactly as it would on the real
   run and nothing is re-implemented. The only benchmark-specific piece is the stop condition (``ReplayLoop``):
   stop when the table's best config has run, after ``--budget`` paid runs, or when the agent's own check would
   skip every config not yet run ("stuck"). Skipped proposals (pruned as dominated, gated by predicted memory,
   duplicates) cost no run; ``--budget`` counts runs only (the real agent's ``--trials`` counts them too).
3. ``demo`` runs a real short study (``python -m autoresearch.agent``, real trials) and checks from the study
   that after the first OOM no run trial was dominated by it; the report goes to ``benchmarks/data/oom_demo.md``.

Metrics, per method over seeds: runs (trials actually paid for) until the best config ran, median and quartiles;
the share of runs, up to then, that ended OOM or NaN (pooled over seeds); proposals skipped for free.
``collect --space benchmarks/spaces/<name>.yaml --out benchmarks/data/table_<name>.json`` tables another space; a
replay uses the space the table was collected from. ``benchmarks/search_suite.py`` replays every table of the suite
and aggregates.

This module's top level imports only the standard library: ``trial`` is started once per replayed trial.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPACE = ROOT / "benchmarks" / "spaces" / "tabular.yaml"
DATA = ROOT / "benchmarks" / "data"
TABLE = DATA / "tabular.json"
FAILED = ("oom", "nan")  # the waste the target counts
MiB = 1024**2


# ------------------------------------------------------------------------------------------ replayed trial


def trial_main(argv: list[str]) -> int:
    """``trial --table PATH <key=value overrides> trial.dir=DIR``: replay one trial from the table."""
    table_path = Path(argv[0].split("=", 1)[1]) if argv and argv[0].startswith("--table=") else TABLE
    overrides = [a for a in argv if not a.startswith("--table=")]
    given = dict(a.split("=", 1) for a in overrides)
    trial_dir = Path(given.pop("trial.dir"))
    table = json.loads(table_path.read_text())
    for row in table["rows"]:
        if all(given.get(k) == v for k, v in row["param_overrides"].items()):
            summary = dict(row["summary"], replayed_from=str(table_path))
            trial_dir.mkdir(parents=True, exist_ok=True)
            tmp = trial_dir / "trial_summary.json.tmp"
            tmp.write_text(json.dumps(summary))
            os.replace(tmp, trial_dir / "trial_summary.json")
            return int(row["exit_code"])
    print(f"no row of {table_path} matches {overrides}", file=sys.stderr)
    return 1


# ------------------------------------------------------------------------------------------------ collect


def _machine() -> dict:
    import platform

    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {
        "host": platform.node(),
        "machine": platform.machine(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gib": mem,
        "python": platform.python_version(),
        "load_avg_at_start": list(os.getloadavg()),
    }


def _row(index: int, params: dict, space, result) -> dict:
    """One table row from a TrialResult (the summary minus its resolved config, which the overrides rebuild)."""
    from core.config import format_value

    summary = {k: v for k, v in (result.summary or {}).items() if k != "config"}
    if not summary:  # no summary left behind: keep what the runner saw, for the replay to write back
        summary = {"status": result.status, "exit_code": result.exit_code, "reason": result.reason, "metrics": {}}
    m = result.metrics
    return {
        "index": index,
        "params": params,
        "param_overrides": {k: format_value(params[k]) for k in space.params},
        "status": result.status,
        "exit_code": result.exit_code,
        "objective": result.objective,
        "peak_memory_bytes": m.get("peak_memory_bytes"),
        "estimated_memory_bytes": m.get("estimated_memory_bytes"),
        "wall_time_sec": round(result.wall_time, 2),
        "steps": summary.get("steps"),
        "reason": result.reason,
        "summary": summary,
    }


def collect(args) -> int:
    import datetime
    import shutil

    from table_freshness import memory_profile

    from autoresearch.run.runner import run_trial
    from autoresearch.space import load_space

    space = load_space(str(args.space))
    grid = space.grid()
    out = Path(args.out)
    trials_dir = Path(args.trials_dir)
    table = None
    if args.resume and out.exists():
        table = json.loads(out.read_text())
    if table is None:
        table = {
            "space": str(Path(args.space).resolve().relative_to(ROOT)),
            "space_name": space.name,
            "objective": {"metric": space.objective_metric, "direction": space.direction},
            "fixed": space.fixed,
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "git_commit": _git_commit(),
            "machine": _machine(),
            "command": "python -m core.train",
            "memory_profile": memory_profile(),  # what the estimates were made with (table_freshness.py)
            "retry_policy": "a compile_error or error (not caused by the config: seen as a flaky jit "
            "compile here) is run once more; both outcomes are kept in 'attempts'",
            "rows": [],
        }
    done = {json.dumps(r["params"], sort_keys=True) for r in table["rows"]}
    print(f"{len(grid)} configs of {space.name}; {len(done)} already in {out}", flush=True)
    for i, params in enumerate(grid):
        if json.dumps(params, sort_keys=True) in done:
            continue
        attempts = []
        for attempt in range(2):
            trial_dir = trials_dir / (f"{i:03d}" + ("" if attempt == 0 else f"-retry{attempt}"))
            shutil.rmtree(trial_dir, ignore_errors=True)  # a stale summary must not pass for this run's
            # compile_cache=false: each config compiles, so its memory peak (and OOM) does not depend on order
            result = run_trial(
                [*space.overrides(params), "execution.compile_cache=false"],
                trial_dir,
                objective_metric=space.objective_metric,
            )
            row = _row(i, params, space, result)
            attempts.append({k: row[k] for k in ("status", "exit_code", "reason", "wall_time_sec")})
            if result.status not in ("compile_error", "error"):
                break
        row["attempts"] = attempts
        table["rows"].append(row)
        peak = row["peak_memory_bytes"]
        print(
            f"[{len(table['rows']):2d}/{len(grid)}] "
            + " ".join(f"{k}={v}" for k, v in params.items())
            + f" -> {row['status']} (exit {row['exit_code']}) objective={row['objective']} "
            f"peak={'-' if peak is None else f'{peak / MiB:.0f} MiB'} {row['wall_time_sec']:.1f}s"
            + (f" [{len(attempts)} attempts]" if len(attempts) > 1 else ""),
            flush=True,
        )
        table["rows"].sort(key=lambda r: r["index"])
        _write_json(out, table)
    table["machine"]["load_avg_at_end"] = list(os.getloadavg())
    table["total_wall_time_sec"] = round(sum(r["wall_time_sec"] for r in table["rows"]), 1)
    _write_json(out, table)
    print(table_markdown(table))
    return 0


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def table_markdown(table: dict) -> str:
    names = list(table["rows"][0]["params"]) if table["rows"] else []
    lines = [
        "| # | " + " | ".join(names) + " | status | exit | val_loss | peak MiB | est. MiB | wall s |",
        "|---:|" + "---|" * len(names) + "---|---:|---:|---:|---:|---:|",
    ]
    for r in table["rows"]:
        obj = "" if r["objective"] is None else f"{r['objective']:.4f}"
        peak = "" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / MiB:.0f}"
        est = "" if r["estimated_memory_bytes"] is None else f"{r['estimated_memory_bytes'] / MiB:.0f}"
        lines.append(
            f"| {r['index']} | "
            + " | ".join(str(r["params"][n]) for n in names)
            + f" | {r['status']} | {r['exit_code']} | {obj} | {peak} | {est} | {r['wall_time_sec']:.1f} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- replay

# name -> (agent proposer, feasibility memory on, memory-gate estimator). "tpe+memory" is the agent's default
# (`--proposer tpe`); the plain baselines are `--no-learn`. Only the first four are the target; the
# rest show where the gain comes from.
METHODS = {
    "random": ("random", False, None),
    "grid": ("grid", False, None),
    "tpe": ("tpe", False, None),
    "tpe+memory": ("tpe", True, "autoresearch.core_adapter:estimate_with_core"),
    "tpe+dominance (no gate)": ("tpe", True, None),
    "random+memory": ("random", True, "autoresearch.core_adapter:estimate_with_core"),
    # the agent's default: it plans where the step-time model answers without measuring first (a throughput
    # objective on a calibrated machine: autoresearch.run.session)
    "gp": ("gp", True, "autoresearch.core_adapter:estimate_with_core"),
    "gp-noplan": ("gp", True, "autoresearch.core_adapter:estimate_with_core"),  # --no-plan
    "gp+plan": ("gp", True, "autoresearch.core_adapter:estimate_with_core"),  # --plan: the step-time model first
}
PLAN = {"gp+plan": True, "gp-noplan": False}  # --plan, --no-plan; other methods: the agent's default
SEEDLESS = ("grid",)  # the grid walks the same order whatever the seed


def make_replay_session(opts, proposer: str, best_key: tuple, budget: int, max_proposals: int):
    """The agent's own session with one change: when to stop (the benchmark's, not a user's). Returns the session
    and a function giving why the replay ended."""
    from autoresearch.records import RAN, config_key
    from autoresearch.run.session import Session
    from autoresearch.study.storage import recorded_keys, status_of

    ended = [""]

    def stop_when(study) -> str:
        ended[0] = why(study)
        return ended[0]

    def why(study) -> str:
        trials = study.get_trials(deepcopy=False)
        ran = [t for t in trials if t.state.is_finished() and status_of(t) in RAN]
        if any(config_key(t.params) == best_key for t in ran):
            return "best"
        if len(ran) >= budget:
            return "budget"
        # Stuck: the agent's own check (Gate.skip) would skip every config that has not run. Skipped proposals
        # teach the feasibility memory nothing, so that holds for good: the real agent would only record pruned
        # proposals until its --trials ran out.
        done, recorded = {config_key(t.params) for t in ran}, recorded_keys(study)
        if all(session.gate.skip(study, p, recorded) for p in session.space.grid() if config_key(p) not in done):
            return "stuck"
        if len(trials) >= max_proposals:
            return "proposal cap"
        return ""

    session = Session(opts, proposer, stop_when=stop_when)
    return session, lambda: ended[0]


def replay_once(
    table_path: Path, method: str, seed: int, budget: int, work: Path, best_key: tuple, max_proposals: int
) -> dict:
    import contextlib
    import io

    import optuna

    from autoresearch.records import RAN, SKIPPED, diverged
    from autoresearch.run.options import AgentOptions
    from autoresearch.study.storage import default_storage, status_of

    proposer, learn, estimator = METHODS[method]
    study = f"{method.replace('+', '_').replace(' ', '_').replace('(', '').replace(')', '')}-s{seed}"
    space = table_space(json.loads(table_path.read_text()))
    opts = AgentOptions(
        space=str(space),
        proposer=proposer,
        study=study,
        trials=budget,
        timeout=1e9,
        seed=seed,
        trials_dir=str(work),
        command=[sys.executable, str(Path(__file__).resolve()), "trial", f"--table={table_path}"],
        estimator=estimator,
        learn=learn,
        progress=False,
        confirm=0,
        plan=PLAN.get(method),
    )  # the search alone
    session, ended = make_replay_session(opts, proposer, best_key, budget, max_proposals)
    with contextlib.redirect_stdout(io.StringIO()) as out:  # anything the agent logs
        code = session.run().code
    ended = ended()
    if code != 0:
        raise RuntimeError(f"replay {method} seed {seed} ended with {code}:\n{out.getvalue()[-2000:]}")
    url = default_storage(work, study)
    s = optuna.load_study(study_name=study, storage=url)
    from autoresearch.records import config_key

    runs, skipped, reached, diverged_runs = [], [], False, 0
    for t in s.get_trials(deepcopy=False):
        status = status_of(t)
        if status in RAN:
            runs.append(status)
            diverged_runs += status == "ok" and diverged(t.user_attrs.get("metrics"))
            if config_key(t.params) == best_key:
                reached = True
        elif status in SKIPPED:
            skipped.append(t.user_attrs.get("reason", ""))
        else:
            raise RuntimeError(f"replay {method} seed {seed}: trial {t.number} ended {status}")
    return {
        "method": method,
        "seed": seed,
        "runs": len(runs),
        "reached": reached,
        "ended": ended,
        "failed": sum(s_ in FAILED for s_ in runs),
        "oom": runs.count("oom"),
        "nan": runs.count("nan"),
        "diverged": diverged_runs,  # ran "ok" with a blown-up loss: paid for nothing too, not in the waste
        "skipped": len(skipped),
        "skipped_dominated": sum(r.startswith("dominated") for r in skipped),
        "skipped_gate": sum(r.startswith("predicted peak") for r in skipped),
        "statuses": runs,
    }


def table_space(table: dict) -> Path:
    """The space file a table was collected from (its ``space``, relative to the repository)."""
    return ROOT / table["space"]


def best_row(table: dict) -> dict:
    ok = [r for r in table["rows"] if r["status"] == "ok" and r["objective"] is not None]
    sign = 1 if table["objective"]["direction"] == "minimize" else -1
    return min(ok, key=lambda r: sign * r["objective"])


def soundness(table: dict) -> list[str]:
    """Lines on whether the space's annotations hold on the table: every config that the table's evidence would
    prune (``FeasibilityMemory.dominates``; for NaN the evidence includes ok runs whose loss diverged,
    ``learn.Outcome.proves``) must have failed the same way, or diverged, never run ok."""
    from autoresearch.search.feasibility import FeasibilityMemory, Outcome
    from autoresearch.space import load_space

    space = load_space(str(table_space(table)))
    memory = FeasibilityMemory(space)

    def proves(r):
        return Outcome(r["params"], r["status"], (r.get("summary") or {}).get("metrics")).proves

    lines, wrong = [], 0
    for kind in FAILED:
        evidence = [r for r in table["rows"] if proves(r) == kind]
        covered = [r for r in table["rows"] if any(memory.dominates(f["params"], r["params"], kind) for f in evidence)]
        same = [r for r in covered if proves(r) == kind]
        bad = [r for r in covered if r["status"] == "ok" and proves(r) is None]  # a config that works
        other = [r for r in covered if r not in same and r not in bad]
        wrong += len(bad)
        diverged = sum(r["status"] == "ok" for r in evidence)
        lines.append(
            f"- {kind}: {len(evidence) - diverged} configs ended {kind}"
            + (f" and {diverged} ran ok with a diverged loss (final > 1.5x first)" if diverged else "")
            + f"; they dominate {len(covered)} configs: {len(same)} "
            + ("ended nan or diverged" if kind == "nan" else f"ended {kind}")
            + f", {len(other)} failed otherwise"
            + "".join(f" (#{r['index']} {_params_text(r['params'])}: {r['status']})" for r in other)
            + f", {len(bad)} ran ok"
            + "".join(f" (#{r['index']} {_params_text(r['params'])})" for r in bad)
        )
    lines.append(
        "- no dominance claim covers a config that ran ok (without diverging): the annotations are sound on this table"
        if not wrong
        else f"- {wrong} configs that ran ok would be pruned: an annotation is wrong"
    )
    return lines


def waste_breakdown(results: list[dict], budget: int) -> list[str]:
    """When tpe+memory's failed runs happen: during TPE's random start-up or after it."""
    rs = [r for r in results if r["method"] == "tpe+memory"]
    if not rs:
        return []
    startup = max(3, min(10, budget // 4))  # as autoresearch.run.session.Session.open derives it from --trials
    early = sum(s in FAILED for r in rs for s in r["statuses"][:startup])
    late = sum(s in FAILED for r in rs for s in r["statuses"][startup:])
    return [
        f"Where tpe+memory's waste comes from: {early} of its {early + late} OOM/NaN runs (over {len(rs)} "
        f"seeds) came in the first {startup} runs, TPE's random start-up (the agent sets n_startup_trials = "
        f"max(3, min(10, trials // 4)) from --trials {budget}), {late} after it. Dominance cannot prevent a "
        "first NaN of each optimizer (the space leaves `optim` unannotated: a failure with one says nothing "
        "about the other) unless a diverged run at a smaller learning rate came first."
    ]


def gate_diagnosis(table: dict, best: dict) -> list[str]:
    """What the agent's memory gate predicts for the best config once it has measured only the smallest batch
    (``learn.MemoryModel`` calibrated on those rows, ``runner.estimate_with_core`` for the estimate)."""
    from autoresearch.core_adapter import estimate_with_core
    from autoresearch.search.gate import GiB
    from autoresearch.search.memory_model import MemoryModel
    from autoresearch.space import load_space

    space = load_space(str(table_space(table)))
    limit = float(space.fixed["memory.limit_gb"]) * GiB
    memory_param = next(n for n, p in space.params.items() if p.memory == "up")
    smallest = space.params[memory_param].values[0]
    ok = [
        r
        for r in table["rows"]
        if r["status"] == "ok"
        and r["params"][memory_param] == smallest
        and r["peak_memory_bytes"]
        and r["estimated_memory_bytes"]
    ]
    est = estimate_with_core(space.overrides(best["params"]))
    lines = []
    for label, rows in (
        (f"one ok run at {memory_param}={smallest} (#{ok[0]['index']})", ok[:1]),
        (f"every ok run at {memory_param}={smallest} ({len(ok)} runs)", ok),
    ):
        model = MemoryModel([(r["estimated_memory_bytes"], r["peak_memory_bytes"]) for r in rows])
        predicted = model.predict(est)
        lines.append(
            f"- after {label}: {model.describe()}; the best config (estimate {est / MiB:.0f} MiB) is "
            f"predicted at {predicted / MiB:.0f} MiB against the limit {limit / MiB:.0f} MiB: "
            + ("gated, never runs" if predicted > limit else "runs")
            + f" (measured: {best['peak_memory_bytes'] / MiB:.0f} MiB)"
        )
    return lines


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    import statistics

    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def summarize(results: list[dict], budget: int) -> list[dict]:
    out = []
    for method in METHODS:
        rs = [r for r in results if r["method"] == method]
        if not rs:
            continue
        # Not reached within the budget: counted as budget + 1 (worse than any reached), so the median stays honest.
        to_best = [r["runs"] if r["reached"] else budget + 1 for r in rs]
        q1, med, q3 = _quartiles(to_best)
        runs, failed = sum(r["runs"] for r in rs), sum(r["failed"] for r in rs)
        out.append(
            {
                "method": method,
                "seeds": len({r["seed"] for r in rs}),
                "reached": sum(r["reached"] for r in rs),
                "n": len(rs),
                "median": med,
                "q1": q1,
                "q3": q3,
                "runs": runs,
                "failed": failed,
                "oom": sum(r["oom"] for r in rs),
                "nan": sum(r["nan"] for r in rs),
                "waste": failed / runs if runs else 0.0,
                "diverged": sum(r.get("diverged", 0) for r in rs) / runs if runs else 0.0,
                "skipped": sum(r["skipped"] for r in rs) / len(rs),
                "dominated": sum(r["skipped_dominated"] for r in rs) / len(rs),
                "gate": sum(r["skipped_gate"] for r in rs) / len(rs),
                "stuck": sum(r["ended"] == "stuck" for r in rs),
            }
        )
    return out


def _vs(median: float, random_median: float | None) -> str:
    return "–" if random_median is None else f"{median / random_median:.2f}×"


def _fmt(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.1f}"


def results_markdown(table: dict, summary: list[dict], results: list[dict], args, best: dict, elapsed: float) -> str:
    rows = table["rows"]
    n = len(rows)
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    random_med = next((s["median"] for s in summary if s["method"] == "random"), None)
    lines = [
        "# Agent efficiency: proposers replayed on a real tabular space",
        "",
        f"Table: `{Path(args.table).resolve().relative_to(ROOT)}` — {n} configs of `{table['space']}`, each run once "
        "with the real core "
        f"on {table['date']} (commit {table['git_commit']}; {table['machine']['cpu']}, "
        f"{table['machine']['cores']} cores). Outcomes: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        + ".",
        f"Best config: #{best['index']} "
        + ", ".join(f"{k}={v}" for k, v in best["params"].items())
        + f" ({table['objective']['metric']} {best['objective']:.4f}).",
        "",
        f"Replay: `python benchmarks/agent_efficiency.py replay --seeds {args.seeds} --budget {args.budget}` "
        f"({elapsed:.0f} s). Each replay is the agent's own session (`autoresearch.run.session.Session`) with the "
        "table "
        "as its trial command; it stops when the best config has run or after the budget of paid runs. "
        "`runs to best`: trials actually run up to and including the best (a replay that misses it within the "
        f"budget counts as {args.budget + 1}). `waste`: share of those runs that ended OOM or NaN, pooled over "
        "seeds. `skipped`: proposals per replay that the agent skipped for free (duplicates, dominated by a known "
        "OOM/NaN, or over the memory gate). `stuck`: replays that ended because the agent would skip every config "
        "not yet run (its own check, `Gate.skip`), the best among them, so it could never reach the best.",
        "",
        "| method | seeds | reached best | runs to best: median (q1–q3) | vs random | waste OOM+NaN (oom/nan runs) "
        "| skipped per replay (dominated / gate) | stuck |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        seeds = "1 (deterministic)" if s["method"] in SEEDLESS else str(s["seeds"])
        lines.append(
            f"| {s['method']} | {seeds} | {s['reached']}/{s['n']} | {_fmt(s['median'])} "
            f"({_fmt(s['q1'])}–{_fmt(s['q3'])}) | {_vs(s['median'], random_med)} | "
            f"{100 * s['waste']:.1f}% ({s['oom']}/{s['nan']}) | {s['skipped']:.1f} "
            f"({s['dominated']:.1f} / {s['gate']:.1f}) | {s['stuck']} |"
        )
    tm = next((s for s in summary if s["method"] == "tpe+memory"), None)
    if tm is not None and random_med is not None:
        ratio = tm["median"] / random_med
        met_speed, met_waste = ratio <= 0.5, tm["waste"] <= 0.10
        lines += [
            "",
            f"Target (issue 3): tpe+memory reaches the best in ≤ 0.5× the runs of random search "
            f"(measured {ratio:.2f}×: {'met' if met_speed else 'NOT met'}) with ≤ 10% of runs wasted on failures "
            f"(measured {100 * tm['waste']:.1f}%: {'met' if met_waste else 'NOT met'}).",
        ]
    lines += [
        "",
        "The grid walks `space.grid()` in file order (first param slowest), whatever the seed: its count is the "
        "best config's position in that order.",
        "",
        *[line for text in waste_breakdown(results, args.budget) for line in (text, "")],
        "The memory gate on this table: what `learn.MemoryModel` predicts for the best config (estimate from "
        "`runner.estimate_with_core`) once only the smallest batch has been measured. A gated config never runs, "
        "so a model that over-predicts never gets the point that would correct it (the replay then ends `stuck`):",
        "",
        *gate_diagnosis(table, best),
        "",
        "Annotations of the space checked against the table (a dominance claim that a config would fail must "
        "hold for every config it covers):",
        "",
        *soundness(table),
        "",
        "## The table",
        "",
        table_markdown(table),
        "",
    ]
    return "\n".join(lines)


def replay(args) -> int:
    import shutil
    import tempfile
    import time

    from autoresearch.records import config_key

    table_path = Path(args.table).resolve()
    table = json.loads(table_path.read_text())
    best = best_row(table)
    best_key = config_key(best["params"])
    n = len(table["rows"])
    args.budget = args.budget or n
    methods = args.methods.split(",") if args.methods else list(METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    work = Path(tempfile.mkdtemp(prefix="agent-efficiency-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    start = time.monotonic()
    results = []
    try:
        for method in methods:
            for seed in range(1 if method in SEEDLESS else args.seeds):
                r = replay_once(table_path, method, seed, args.budget, work, best_key, max_proposals=20 * n)
                results.append(r)
                print(
                    f"{method:24s} seed {seed:2d}: {r['runs']:3d} runs, ended {r['ended']:6s}, "
                    f"oom {r['oom']}, nan {r['nan']}, skipped {r['skipped']}: {' '.join(r['statuses'])}",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(results, args.budget)
    text = results_markdown(table, summary, results, args, best, time.monotonic() - start)
    print("\n" + text)
    if not args.no_write:
        Path(args.out).write_text(text)
        _write_json(Path(args.out).with_suffix(".json"), {"args": vars(args), "summary": summary, "replays": results})
        print(f"written: {args.out}")
    return 0


# --------------------------------------------------------------------------------------------------- demo


def demo(args) -> int:
    """A real study on the tabular space, then: which trials OOMed, which proposals were pruned (and why),
    and whether any trial that ran after the first OOM was dominated by it (it must not be)."""
    import subprocess

    from autoresearch.records import RAN
    from autoresearch.search.feasibility import FeasibilityMemory
    from autoresearch.space import load_space
    from autoresearch.study.storage import load_study

    study_dir = ROOT / args.trials_dir / args.study
    if study_dir.exists() and not args.reuse:
        raise SystemExit(f"{study_dir} exists: remove it, or pass --reuse to report on it as it is")
    agent_args = [
        "--space",
        str(SPACE.relative_to(ROOT)),
        "--proposer",
        "tpe",
        "--trials",
        str(args.trials),
        "--study",
        args.study,
        "--seed",
        str(args.seed),
        "--confirm",
        "0",
        *([] if args.gate else ["--estimator", "none"]),
    ]
    if not args.reuse:
        cmd = [
            sys.executable,
            "-m",
            "autoresearch.agent",
            *agent_args,
            "--trials-dir",
            args.trials_dir,
            "--no-progress",
        ]
        print("$ " + " ".join(cmd[1:]), flush=True)
        agent = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "ANTHROPIC_API_KEY": ""})
        if agent.returncode != 0:
            raise SystemExit(f"the agent exited {agent.returncode}")
    report = subprocess.run(
        [sys.executable, "-m", "autoresearch.report", str(study_dir.relative_to(ROOT)), "--format", "markdown"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    replayed = replay_sequence(args)
    study = load_study(study_dir)
    space = load_space(str(SPACE))
    memory = FeasibilityMemory(space)
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    ooms = [t for t in trials if t.user_attrs.get("status") == "oom"]
    lines = [
        "# After the first OOM, no dominated proposal runs: a real study",
        "",
        f"`python -m autoresearch.agent {' '.join(agent_args)} --trials-dir {args.trials_dir}` — real trials "
        f"of the tiny GPT through `python -m core.train`, memory budget {space.fixed['memory.limit_gb']} GiB "
        f"per rank; then `python -m autoresearch.report {study_dir.relative_to(ROOT)} --format markdown` "
        f"(below). Date {_now()}, commit {_git_commit()}.",
        "",
    ]
    if not args.gate:
        lines += [
            "The memory gate is off (`--estimator none`) so that an OOM can happen at all: with it, the estimate "
            "(`core.memory`, predicting batch 32 above the 1 GiB budget) keeps every OOM config of this space "
            "from running, and dominance has nothing to learn from.",
            "",
        ]
    if not ooms:
        lines.append("No trial went out of memory in this study: nothing to show (try another --seed).")
    else:
        first = ooms[0]
        later = [t for t in trials if t.number > first.number]
        ran_later = [t for t in later if t.user_attrs.get("status") in RAN]
        violations = [
            t
            for t in ran_later
            if any(memory.dominates(o.params, t.params, "oom") for o in ooms if o.number < t.number)
        ]
        pruned = [t for t in trials if t.user_attrs.get("status") == "pruned"]
        lines += [
            f"First OOM: trial {first.number} ({_params_text(first.params)}): {first.user_attrs.get('reason', '')}",
            "",
            "Every trial in the order the agent proposed it (pruned = skipped without running):",
            "",
            "| trial | params | status | exit | dominated by an earlier OOM? | reason |",
            "|---:|---|---|---:|---|---|",
        ]
        for t in trials:
            status = t.user_attrs.get("status")
            exit_code = t.user_attrs.get("exit_code")
            dom = [o.number for o in ooms if o.number < t.number and memory.dominates(o.params, t.params, "oom")]
            lines.append(
                f"| {t.number} | {_params_text(t.params)} | {status} | "
                f"{'' if exit_code is None else exit_code} | "
                f"{'yes: trial ' + ', '.join(map(str, dom)) if dom else 'no'} | "
                f"{(t.user_attrs.get('reason') or '').replace('|', '/')} |"
            )
        lines += [
            "",
            f"After trial {first.number}: {len(later)} proposals, {len(ran_later)} ran, "
            f"{sum(1 for t in later if t.user_attrs.get('status') == 'pruned')} pruned. Trials that ran after "
            f"an OOM and were dominated by it: {len(violations)}"
            + (
                " (" + ", ".join(str(t.number) for t in violations) + ")"
                if violations
                else " — none: every dominated proposal was skipped before it ran."
            ),
        ]
        lines.append(f"Pruned proposals in the study: {len(pruned)}.")
    real = [(dict(t.params), t.user_attrs.get("status")) for t in trials]
    same = next((i for i, (a, b) in enumerate(zip(real, replayed, strict=True)) if a != b), None)
    lines += [
        "",
        "Replay check: the same agent command with the table (`benchmarks/data/tabular.json`) as its trial "
        "command "
        + (
            "proposes the same configs with the same outcomes, trial for trial"
            if same is None and len(real) == len(replayed)
            else "differs from this real study from trial "
            f"{same if same is not None else min(len(real), len(replayed))}"
            " on (run-to-run differences in measured peaks or losses change what the agent learns)"
        )
        + ".",
    ]
    lines += ["", "## Trial table (`python -m autoresearch.report`)", "", report.strip(), ""]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        Path(args.out).write_text(text)
        print(f"written: {args.out}")
    return 0


def replay_sequence(args) -> list[tuple[dict, str]]:
    """The demo's agent command (same space, proposer, --trials and --seed) with the table as its trial command:
    the (params, status) of each trial, in order."""
    import contextlib
    import io
    import tempfile

    import optuna

    from autoresearch.run.options import AgentOptions
    from autoresearch.run.session import Session

    with tempfile.TemporaryDirectory(prefix="agent-efficiency-demo-") as work:
        opts = AgentOptions(
            space=str(SPACE),
            proposer="tpe",
            study=args.study,
            trials=args.trials,
            seed=args.seed,
            trials_dir=work,
            progress=False,
            confirm=0,
            estimator=AgentOptions.estimator if args.gate else None,
            command=[sys.executable, str(Path(__file__).resolve()), "trial", f"--table={TABLE}"],
        )
        with contextlib.redirect_stdout(io.StringIO()):
            Session(opts, "tpe").run()
        study = optuna.load_study(study_name=args.study, storage=f"sqlite:///{work}/{args.study}/study.db")
        return [(dict(t.params), t.user_attrs.get("status")) for t in study.get_trials(deepcopy=False)]


def _git_commit() -> str:
    from provenance import git_commit  # not at the top: it imports core, and ``trial`` runs once per replayed trial

    return git_commit()


def _params_text(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def _now() -> str:
    import datetime

    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["trial"]:  # the replayed trial command: kept free of argparse and heavy imports
        return trial_main(argv[1:])
    sys.path.insert(0, str(ROOT))
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="run every config of the space once with the real core")
    c.add_argument("--space", default=str(SPACE))
    c.add_argument("--out", default=str(TABLE))
    c.add_argument("--trials-dir", default=str(ROOT / "trials" / "tabular-collect"))
    c.add_argument("--resume", action="store_true", help="keep the rows already in --out, run the rest")
    r = sub.add_parser("replay", help="replay the proposers against the table (no trial runs)")
    r.add_argument("--table", default=str(TABLE))
    r.add_argument("--seeds", type=int, default=20)
    r.add_argument("--budget", type=int, default=None, help="paid runs per replay (default: the table's size)")
    r.add_argument("--methods", help=f"comma-separated subset of: {', '.join(METHODS)}")
    r.add_argument("--out", default=str(DATA / "agent_efficiency.md"))
    r.add_argument("--no-write", action="store_true")
    d = sub.add_parser("demo", help="a real short study: after the first OOM, no dominated proposal runs")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--trials", type=int, default=16)
    d.add_argument("--study", default="demo-oom")
    d.add_argument("--trials-dir", default="trials", help="relative to the repository")
    d.add_argument("--reuse", action="store_true", help="report on an existing study without running the agent")
    d.add_argument("--gate", action="store_true", help="keep the memory gate on (it then prevents the OOMs)")
    d.add_argument("--out", default=str(DATA / "oom_demo.md"))
    d.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    return {"collect": collect, "replay": replay, "demo": demo}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
