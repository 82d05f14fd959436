"""Measure how this machine's runtime holds a training step, and fit core.memory's RuntimeProfile to it.

    .venv/bin/python benchmarks/memory_model.py collect [--device CPU] [--only jit] [--names REGEX]
    .venv/bin/python benchmarks/memory_model.py fit [--data benchmarks/data/memory_cpu.json]

``collect`` runs a sweep of short trials through the real CLI (10 steps as in the studies, no memory limit; a
peak still grows over the first steps: 3-step runs read ~7% low) over model size, depth,
width, micro-batch, sequence length, optimizer, recompute, ranks and gradient accumulation, in each execution
mode, and keeps every measured per-rank peak beside the config's textbook terms (``core.memory.terms``).

``fit`` fits one ``RuntimeProfile`` per mode by least squares: the peak of the plain single-rank runs as
``baseline + per_layer * layers + state_copies * states + activation_copies * (activations - scores) +
score_copies * scores + logits_copies * logits + [muon] (muon_graph + muon_copies * hidden)``; then what full
recompute holds (does it save at all; how many blocks' worth it rebuilds at once: ``rebuilt_copies``), and what
a multi-rank layout adds (the collective runtime, the parameters as collective buffers, FSDP's gathered weight),
from the residuals of their runs. Terms are recomputed from each run's overrides with today's
``core.memory.terms``, so the data outlives changes to the textbook count. Runs marked held out
(``HELD_OUT_SWEEP`` and the combined layouts: seq 512, selective and partial recompute, SWAP, pipelines, MoE, 4
ranks) are never fitted: their error is the estimate's on configs it has not seen. It prints the profiles (to copy
into ``core.memory.estimate.PROFILES``) and, per run, the peak against the estimate of the profiles core.memory ships now,
then the errors by group (median, p95, worst, how often and how far below the peak) — the figure that matters:
how wrong the agent's memory gate starts out before it has measured anything.
``tests/unit/test_memory.py`` holds the shipped profiles to this data. ``--names REGEX`` collects only the
matching runs and merges them into the data file.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "benchmarks" / "data" / "memory_cpu.json"
MiB = 2**20

# (name, overrides): single-rank runs without recompute or accumulation first (they fit the profile), then the
# runs whose extra cost is fitted from residuals.
SWEEP = [
    *[(f"tiny b{b}", ["model=tiny", f"training.global_batch_size={b}"]) for b in (1, 8, 16, 32, 64)],
    *[
        (f"tiny seq128 b{b}", ["model=tiny", "training.seq_len=128", f"training.global_batch_size={b}"])
        for b in (8, 32)
    ],
    *[(f"tiny 6 layers b{b}", ["model=tiny", "model.n_layers=6", f"training.global_batch_size={b}"]) for b in (1, 16)],
    *[(f"tiny d256 b{b}", ["model=tiny", "model.d_model=256", f"training.global_batch_size={b}"]) for b in (1, 16)],
    *[(f"tiny muon b{b}", ["model=tiny", "optim=muon", f"training.global_batch_size={b}"]) for b in (1, 8, 32)],
    *[(f"small b{b}", ["model=small", f"training.global_batch_size={b}"]) for b in (1, 8, 16)],
    ("small seq128 b8", ["model=small", "training.seq_len=128", "training.global_batch_size=8"]),
    *[(f"small muon b{b}", ["model=small", "optim=muon", f"training.global_batch_size={b}"]) for b in (1, 8)],
    *[(f"medium b{b}", ["model=medium", f"training.global_batch_size={b}"]) for b in (1, 4)],
    *[
        (f"tiny recompute b{b}", ["model=tiny", "memory.recompute=full", f"training.global_batch_size={b}"])
        for b in (8, 32)
    ],
    ("small recompute b8", ["model=small", "memory.recompute=full", "training.global_batch_size=8"]),
    *[
        (f"tiny dp2 b{b}", ["model=tiny", "parallel.dp_replicate=2", f"training.global_batch_size={b}"])
        for b in (2, 16)
    ],
    ("small dp2 b16", ["model=small", "parallel.dp_replicate=2", "training.global_batch_size=16"]),
    (
        "small dp2 accum4 b8",
        ["model=small", "parallel.dp_replicate=2", "training.micro_batch_size=1", "training.global_batch_size=8"],
    ),
    (
        "small dp2 recompute b8",
        ["model=small", "parallel.dp_replicate=2", "memory.recompute=full", "training.global_batch_size=8"],
    ),
    ("tiny accum4 b8", ["model=tiny", "training.micro_batch_size=2", "training.global_batch_size=8"]),
    ("small accum4 b8", ["model=small", "training.micro_batch_size=2", "training.global_batch_size=8"]),
]
# Mesh layouts (each rank's peak). Single-axis layouts (2 ranks, and FSDP on 4) are fitted; every combination of
# axes is held out (the third element), to measure the estimate on layouts it was not fitted on.
LAYOUT_SWEEP = [
    *[
        (f"{m} {name} b{b}", [f"model={m}", *ov, f"training.global_batch_size={b}"], False)
        for m, b in (("tiny", 16), ("small", 8), ("medium", 4))
        for name, ov in (("dp_shard2", ["parallel.dp_shard=2"]), ("tp2", ["parallel.tp=2"]), ("cp2", ["parallel.cp=2"]))
    ],
    (
        "small dp_shard2 muon b8",
        ["model=small", "optim=muon", "parallel.dp_shard=2", "training.global_batch_size=8"],
        False,
    ),
    ("small tp2 muon b8", ["model=small", "optim=muon", "parallel.tp=2", "training.global_batch_size=8"], False),
    ("small dp_shard2 b16", ["model=small", "parallel.dp_shard=2", "training.global_batch_size=16"], False),
    ("small tp2 sp b8", ["model=small", "parallel.tp=2", "parallel.sp=true", "training.global_batch_size=8"], True),
    (
        "small hsdp2x2 b8",
        ["model=small", "parallel.dp_replicate=2", "parallel.dp_shard=2", "training.global_batch_size=8"],
        True,
    ),
    (
        "small tp2 dp_shard2 b8",
        ["model=small", "parallel.tp=2", "parallel.dp_shard=2", "training.global_batch_size=8"],
        True,
    ),
    ("small cp2 tp2 b8", ["model=small", "parallel.cp=2", "parallel.tp=2", "training.global_batch_size=8"], True),
    ("small dp_shard4 b8", ["model=small", "parallel.dp_shard=4", "training.global_batch_size=8"], False),
    (
        "medium tp2 dp_shard2 b4",
        ["model=medium", "parallel.tp=2", "parallel.dp_shard=2", "training.global_batch_size=4"],
        True,
    ),
    (
        "tiny cp2 tp2 muon b16",
        ["model=tiny", "optim=muon", "parallel.cp=2", "parallel.tp=2", "training.global_batch_size=16"],
        True,
    ),
    (
        "medium tp2 sp muon b4",
        ["model=medium", "optim=muon", "parallel.tp=2", "parallel.sp=true", "training.global_batch_size=4"],
        True,
    ),
]
# Fitted too: FSDP's per-op backward graphs (each weight's op re-gathers and differentiates itself in its bprop
# outside recomputed blocks: core.parallel.fsdp), which grow with the number of wrapped ops, not with their size:
# depth varied at a small width and batch, and the same with full recompute (its blocks do not have them).
TINY_FSDP = ["model=tiny", "parallel.dp_shard=2", "training.seq_len=64", "training.global_batch_size=4"]
LAYOUT_SWEEP += [
    ("tiny dp_shard2 1 layer seq64 b4", [*TINY_FSDP, "model.n_layers=1"], False),
    ("tiny dp_shard2 6 layers seq64 b4", [*TINY_FSDP, "model.n_layers=6"], False),
    ("tiny dp_shard2 6 layers seq64 recompute b4", [*TINY_FSDP, "model.n_layers=6", "memory.recompute=full"], False),
    ("tiny dp_shard2 d256 seq64 b4", [*TINY_FSDP, "model.d_model=256"], False),
]
# Fitted too: longer sequences, so that the fit sees attention's S x S terms grow, with and without recompute.
SWEEP += [
    ("tiny seq256 b8", ["model=tiny", "training.seq_len=256", "training.global_batch_size=8"]),
    (
        "tiny seq256 recompute b8",
        ["model=tiny", "training.seq_len=256", "memory.recompute=full", "training.global_batch_size=8"],
    ),
    ("small seq256 b4", ["model=small", "training.seq_len=256", "training.global_batch_size=4"]),
    (
        "small seq256 recompute b4",
        ["model=small", "training.seq_len=256", "memory.recompute=full", "training.global_batch_size=4"],
    ),
]
# Held out, never fitted: the estimate's error on configs it has not seen, spanning model size, sequence length,
# micro-batch, recompute (full, partial, selective), SWAP, pipelines, MoE and a combined layout. Rows a mode
# refuses (selective recompute and SWAP under jit on CPU) are skipped in that mode.
SMALL512 = ["model=small", "training.seq_len=512", "training.global_batch_size=8"]
TINY6 = ["model=tiny", "model.n_layers=6", "training.seq_len=256"]
HELD_OUT_SWEEP = [
    ("small seq512 b8", SMALL512),
    ("small seq512 recompute b8", [*SMALL512, "memory.recompute=full"]),
    ("small seq512 selective b8", [*SMALL512, "memory.recompute=selective"]),
    ("small seq512 swap b8", [*SMALL512, "memory.swap=true"]),
    (
        "small seq256 accum2 b8",
        ["model=small", "training.seq_len=256", "training.micro_batch_size=4", "training.global_batch_size=8"],
    ),
    ("medium seq256 b4", ["model=medium", "training.seq_len=256", "training.global_batch_size=4"]),
    (
        "medium seq256 recompute b4",
        ["model=medium", "training.seq_len=256", "memory.recompute=full", "training.global_batch_size=4"],
    ),
    (
        "tiny 6 layers seq256 recompute 3 b16",
        [*TINY6, "memory.recompute=full", "memory.recompute_layers=3", "training.global_batch_size=16"],
    ),
    ("tiny 6 layers seq256 b8", [*TINY6, "training.global_batch_size=8"]),
    ("tiny 6 layers seq256 swap b8", [*TINY6, "memory.swap=true", "training.global_batch_size=8"]),
    (
        "small pp2 1f1b b8",
        ["model=small", "parallel.pp=2", "training.micro_batch_size=2", "training.global_batch_size=8"],
    ),
    (
        "small pp2 gpipe recompute b8",
        [
            "model=small",
            "parallel.pp=2",
            "parallel.pp_schedule=gpipe",
            "memory.recompute_stages=[full,none]",
            "training.micro_batch_size=2",
            "training.global_batch_size=8",
        ],
    ),
    ("moe-tiny b16", ["model=moe-tiny", "training.global_batch_size=16"]),
    ("moe-tiny shared1 b16", ["model=moe-tiny", "model.moe_shared_experts=1", "training.global_batch_size=16"]),
    ("moe-tiny ep2 b16", ["model=moe-tiny", "parallel.dp_shard=2", "parallel.ep=2", "training.global_batch_size=16"]),
    (
        "small tp2 dp_shard2 recompute b8",
        [
            "model=small",
            "parallel.tp=2",
            "parallel.dp_shard=2",
            "memory.recompute=full",
            "training.global_batch_size=8",
        ],
    ),
]
SWEEP = [(name, ov, False) for name, ov in SWEEP] + LAYOUT_SWEEP + [(name, ov, True) for name, ov in HELD_OUT_SWEEP]
MODES = ("jit", "pynative")
STEPS = 10


def collect(args) -> None:
    """Run the sweep. The data file is rewritten after every run, so an interrupted collection resumes with
    `--resume`: runs already in the file with today's overrides are kept, not run again."""
    import mindspore
    from provenance import git_commit

    modes = [m for m in MODES if not args.only or m == args.only]
    wanted = [
        (i, name, ov, held) for i, (name, ov, held) in enumerate(SWEEP) if not args.names or re.search(args.names, name)
    ]
    merge = (args.names or args.resume) and Path(args.data).exists()
    old = json.loads(Path(args.data).read_text())["rows"] if merge else []
    done = {(r["mode"], r["name"]): r["overrides"] for r in old} if args.resume else {}
    redo = {(mode, name) for mode in modes for _, name, _, _ in wanted}
    rows = [r for r in old if (r["mode"], r["name"]) not in redo or args.resume]
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        "unknown CPU",
    )
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": "per row (each row's commit)" if merge else git_commit(),
        "device": args.device,
        "machine": cpu,
        "mindspore": mindspore.__version__,
    }
    order = {(m, n): k for k, (m, n) in enumerate((m, n) for m in MODES for n, _, _ in SWEEP)}

    def write():
        rows.sort(key=lambda r: order.get((r["mode"], r["name"]), len(order)))
        Path(args.data).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            for i, name, overrides, held_out in wanted:
                ov = [*overrides, f"device={args.device}", f"training.mode={mode}", f"trial.max_steps={STEPS}"]
                if done.get((mode, name)) == ov:
                    continue
                out = Path(tmp) / f"{mode}{i}"
                # compile_cache=false: every row's peak includes compiling its graphs, as in a trial that compiles
                subprocess.run(
                    [sys.executable, "-m", "core.train", *ov, "execution.compile_cache=false", f"trial.dir={out}"],
                    cwd=ROOT,
                    capture_output=True,
                )
                s = json.loads((out / "trial_summary.json").read_text())
                if s["status"] == "invalid":  # a setting this mode refuses (core.config says why)
                    print(f"{mode:8s} {name:26s} skipped: {s['reason'][:100]}", file=sys.stderr)
                    continue
                if s["status"] != "ok":
                    raise SystemExit(f"{name} ({mode}): trial ended {s['status']}: {s['reason']}")
                peak = s["metrics"]["peak_memory_bytes"]  # the largest rank's peak
                rows[:] = [r for r in rows if (r["mode"], r["name"]) != (mode, name)]
                rows.append(
                    {
                        "name": name,
                        "mode": mode,
                        "overrides": ov,
                        "peak_bytes": peak,
                        "peak_bytes_per_rank": s["metrics"]["peak_memory_bytes_per_rank"],
                        "held_out": held_out,
                        "commit": git_commit(),
                    }
                )
                write()
                print(f"{mode:8s} {name:26s} {peak / MiB:7.0f} MiB", file=sys.stderr)
    write()
    print(f"wrote {args.data} ({len(rows)} runs)", file=sys.stderr)


def _terms(row):
    """The run's textbook terms by today's core.memory (the data keeps overrides and peaks, not terms)."""
    from core.config import load_config
    from core.memory import terms

    key = tuple(row["overrides"])
    if key not in _TERMS:
        _TERMS[key] = terms(load_config(row["overrides"]))
    return _TERMS[key]


_TERMS: dict = {}


def held_out(row) -> bool:
    """Whether a run is kept out of the fit: as SWEEP says now (the data file records it as collected)."""
    return _HELD_OUT.get(row["name"], bool(row.get("held_out")))


_HELD_OUT = {name: held for name, _, held in SWEEP}


def _plain(t) -> bool:
    return t.ranks == 1 and t.recomputed is None and t.grads == t.params


def fit_profile(rows: list[dict]):
    """A RuntimeProfile from one mode's rows (see the module docstring)."""
    from core.memory import RuntimeProfile, apply_profile

    rows = [r for r in rows if not held_out(r)]
    plain = [r for r in rows if _plain(_terms(r))]
    cols = {  # name -> feature per row (bytes, or 1 for a constant)
        "baseline": lambda t: 1.0,
        "per_layer": lambda t: t.layers,
        "state_copies": lambda t: t.states,
        "activation_copies": lambda t: t.activations - t.scores,
        "score_copies": lambda t: t.scores,
        "logits_copies": lambda t: t.logits,
        "muon_graph": lambda t: 1.0 if t.muon_hidden else 0.0,
        "muon_copies": lambda t: t.muon_hidden,
    }
    X = np.array([[f(_terms(r)) for f in cols.values()] for r in plain], dtype=float)
    y = np.array([r["peak_bytes"] for r in plain], dtype=float)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    values = dict(zip(cols, coef, strict=True))
    # A state term with copies c is held as c * states; the profile keeps (c - 1) as runtime overhead.
    # Selective recompute is not in the fit (PyNative only here, where it saved 5% of the peak against a textbook
    # ~40%): it counts as saving nothing, which over-predicts it a little rather than under.
    prof = RuntimeProfile(
        **{k: (int(v) if k in ("baseline", "per_layer", "muon_graph") else float(v)) for k, v in values.items()},
        selective_saves=False,
    )

    def residual(r, p):
        return r["peak_bytes"] - apply_profile(_terms(r), p).total

    # Recompute: does it save memory here? Compare both readings on the single-rank recompute runs.
    rec = [r for r in rows if _terms(r).recomputed is not None and _terms(r).ranks == 1]
    if rec:
        keeps = RuntimeProfile(**{**asdict(prof), "recompute_saves": False})
        saves_err = sum(abs(residual(r, prof)) for r in rec)
        keeps_err = sum(abs(residual(r, keeps)) for r in rec)
        if keeps_err < saves_err:
            per_layer = float(np.mean([residual(r, keeps) / _terms(r).layers for r in rec]))
            prof = RuntimeProfile(**{**asdict(keeps), "recompute_per_layer": max(0, int(per_layer))})
        else:  # how many blocks' activations full recompute holds while it rebuilds one
            full = [r for r in rec if _terms(r).rebuilt]
            x = np.array([prof.activation_copies * _terms(r).rebuilt for r in full])
            extra = float(x @ np.array([residual(r, prof) for r in full]) / (x @ x)) if full else 0.0
            prof = RuntimeProfile(**{**asdict(prof), "rebuilt_copies": 1.0 + extra})
    # Ranks: the collective runtime (a constant and a part per peer), the parameters as collective buffers (the
    # dp_replicate all-reduce's flat copy, FSDP's shards), FSDP's gathered weight and its ops' backward graphs, from
    # what is left of the fitted multi-rank runs once everything above is accounted for.
    dist = [r for r in rows if _terms(r).ranks > 1]
    if dist:
        res = np.array([residual(r, prof) for r in dist])
        X = np.array([[1.0, t.ranks - 2, t.comm_params, t.gathered, t.sharded_ops] for t in (_terms(r) for r in dist)])
        # Non-negative: each is a size or a count of copies, and the multi-rank rows are few (one of 4 ranks), so
        # plain least squares traded a negative per-rank cost against the others (-20 MiB a rank at 4ebf2e0)
        (c0, c1, c2, c3, c4), _ = nnls(X, res)
        prof = RuntimeProfile(
            **{
                **asdict(prof),
                "distributed": int(c0),
                "distributed_per_rank": int(c1),
                "distributed_param_copies": float(c2),
                "gathered_copies": float(c3),
                "sharded_op_graph": int(c4),
            }
        )
    return prof


def fit(args) -> None:
    from core.config import load_config
    from core.memory import estimate_memory_bytes

    data = json.loads(Path(args.data).read_text())
    meta, rows = data["meta"], data["rows"]
    print(
        f"Data: `{Path(args.data).resolve().relative_to(ROOT)}`: {len(rows)} runs of {STEPS} steps, "
        f"{meta['date']}, commit {meta['commit']}, {meta['machine']}, MindSpore {meta['mindspore']}, "
        f"device {meta['device']}.\n"
    )
    for mode in sorted({r["mode"] for r in rows}):
        prof = fit_profile([r for r in rows if r["mode"] == mode])
        shown = ", ".join(f"{f.name}={_fmt(getattr(prof, f.name))}" for f in fields(prof))
        print(f"fitted ({meta['device']}, {mode}): RuntimeProfile({shown})\n")
    print("| mode | run | held out | measured MiB | core.memory estimate MiB | error |\n|---|---|---|---:|---:|---:|")
    errors: dict = {}
    for r in rows:
        est = estimate_memory_bytes(load_config(r["overrides"]))
        err = (est - r["peak_bytes"]) / r["peak_bytes"]
        layout = _terms(r).ranks > 1
        errors.setdefault((r["mode"], held_out(r), layout), []).append(err)
        print(
            f"| {r['mode']} | {r['name']} | {'yes' if held_out(r) else ''} | {r['peak_bytes'] / MiB:.0f} | "
            f"{est / MiB:.0f} | {100 * err:+.1f}% |"
        )
    print(
        "\nThe estimate shipped in core.memory: |error| (median, p95, worst), and how often it predicted less than "
        "the measured peak (under-predicted: the error that costs a trial when a budget is near):\n\n"
        "| mode | runs | n | median | p95 | worst | under-predicted | by > 5% |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|"
    )
    groups = dict(errors)
    for (mode, held, _), errs in errors.items():  # and each mode's fitted and held-out runs together
        groups.setdefault((mode, held, None), []).extend(errs)
    order = {False: 0, True: 1, None: 2}  # single rank, multi-rank, all
    for (mode, held, layout), errs in sorted(groups.items(), key=lambda kv: (*kv[0][:2], order[kv[0][2]])):
        what = f"{'held out' if held else 'fitted'}, " + {True: "multi-rank", False: "single rank", None: "all"}[layout]
        e = np.array(errs)
        a = np.abs(e)
        print(
            f"| {mode} | {what} | {len(a)} | {100 * np.median(a):.1f}% | {100 * np.percentile(a, 95):.1f}% | "
            f"{100 * a.max():.1f}% | {np.mean(e < 0):.0%} | {np.mean(e < -0.05):.0%} |"
        )
    print_layout_order()


LAYOUTS = ROOT / "benchmarks" / "data" / "table_layouts.json"  # the search suite's table of mesh layouts
APART = 0.05  # pairs whose measured peaks differ by more than this must be ordered as measured


def layout_order(table: dict) -> tuple[list[tuple[str, float]], list[tuple[dict, dict]], int]:
    """The shipped estimate on a table of real runs never fitted (``agent_efficiency.py collect``, each row's
    resolved overrides in its summary): (layout family and error of each ok row, the pairs of rows whose measured
    peaks differ by more than ``APART`` that the estimate orders the other way, how many such pairs)."""
    from core.config import load_config
    from core.memory import estimate_memory_bytes

    runs = []
    for r in table["rows"]:
        if r["status"] != "ok":
            continue
        est = estimate_memory_bytes(load_config([o for o in r["summary"]["overrides"] if not o.startswith("trial.")]))
        runs.append((r["params"], r["peak_memory_bytes"], est))
    pairs = [(a, b) for i, a in enumerate(runs) for b in runs[i + 1 :] if abs(a[1] / b[1] - 1) > APART]
    wrong = [(a[0], b[0]) for a, b in pairs if (a[1] > b[1]) != (a[2] > b[2])]
    return [(_family(p), est / peak - 1) for p, peak, est in runs], wrong, len(pairs)


def _family(params: dict) -> str:
    degrees = [f"{k.split('.')[1]} {v}" for k, v in params.items() if k.startswith("parallel.") and v != 1]
    return f"{' x '.join(degrees) or '1 process'}, recompute {params.get('memory.recompute', 'none')}"


def print_layout_order(path: Path = LAYOUTS) -> None:
    table = json.loads(path.read_text())
    errors, wrong, pairs = layout_order(table)
    print(
        f"\nHeld out: the layouts table (`{path.relative_to(ROOT)}`, {table['git_commit']}): {len(wrong)} of {pairs} "
        f"pairs whose measured peaks differ by more than {APART:.0%} ordered the other way by the estimate.\n\n"
        "| layout family | runs | median error | worst |\n|---|---:|---:|---:|"
    )
    for family in sorted({f for f, _ in errors}):
        e = [x for f, x in errors if f == family]
        print(f"| {family} | {len(e)} | {100 * np.median(e):+.1f}% | {100 * max(e, key=abs):+.1f}% |")


def _fmt(v) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{round(v / MiB)} * MiB" if v else "0"
    return f"{v:.3g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="run the sweep (real trials) and write the data file")
    c.add_argument("--device", default="CPU")
    c.add_argument("--only", choices=MODES, help="one execution mode")
    c.add_argument("--data", default=str(DATA))
    c.add_argument("--names", help="only the runs whose name matches this regex, merged into the data file")
    c.add_argument("--resume", action="store_true", help="keep the runs already collected with today's overrides")
    f = sub.add_parser("fit", help="fit a RuntimeProfile per mode and show the shipped estimate's errors")
    f.add_argument("--data", default=str(DATA))
    args = ap.parse_args()
    collect(args) if args.cmd == "collect" else fit(args)


if __name__ == "__main__":
    main()
