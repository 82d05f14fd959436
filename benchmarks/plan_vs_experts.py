"""The plan against the experts (issue "Scale I"): for each published (model, cluster, batch) of
``benchmarks/data/published_runs.yaml`` that ``perf_model.py`` scores, plan a space of layouts around it and ask
whether the layout its authors published is among the plan's top 5, and what the plan predicts for its own first
choice against it.

    .venv/bin/python benchmarks/plan_vs_experts.py [--limit N] [--least-recompute]

The space per row: every power-of-two split of the row's GPUs into dp_shard x tp x pp x cp (tp <= 8, pp <= 16,
cp <= the row's), sequence parallelism with tp, 1F1B or interleaved (2 virtual stages), micro-batch 1, 2 or 4,
recompute none / selective / full, and on each axis the row's own value (Megatron's pp 35 and 3 virtual stages,
ZeRO-3 over 384 GPUs); dp_replicate as ``perf_model.overrides`` reads the row; everything else (model, cluster, batch,
sequence, precision, the row's flags) fixed as ``perf_model.overrides`` gives it, with the fitted efficiencies.
The ranking is by predicted tokens/s per device among the points that fit in memory (not only the speed-memory
front: a slower layout with less memory is still a rank down). A value the core refuses for the row's model and
batch whatever the other params are (the space's own check) is dropped from its axis before planning. A row whose
published split is uneven (``parallel.pp_layers``) or whose recompute is counted per stage
(``memory.recompute_stage_layers``, MindFormers' 70B rows) is no point of these spaces: its layout is predicted apart
and ranked by its speed among the space's fitting points. Writes ``benchmarks/data/plan_vs_experts.md``.

``--least-recompute`` plans each recomputing point with the fewest blocks per stage that fit
(``core.perf.least_recompute``, the planner's ``--least-recompute``); the published layout is then predicted as it
ran (every block recomputed) and ranked by its speed, so its own point with fewer blocks may stand above it.
Writes ``benchmarks/data/plan_vs_experts_least_recompute.md``.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf_model import DATA, FIT, fit, load, overrides, skip_reason  # noqa: E402
from provenance import git_commit  # noqa: E402

from autoresearch.search.planner import PlanRow, Verdict, plan  # noqa: E402
from autoresearch.space import SpaceError, load_space  # noqa: E402
from core.config import ConfigError, parse_overrides  # noqa: E402
from core.perf import estimate_step  # noqa: E402

SEARCHED = (
    "parallel.dp_shard",
    "parallel.tp",
    "parallel.sp",
    "parallel.pp",
    "parallel.cp",
    "parallel.pp_schedule",
    "parallel.pp_virtual",
    "training.micro_batch_size",
    "memory.recompute",
)
TOP = 5


def space_for(row: dict, typed: dict) -> dict:
    """The layouts around ``row`` (``typed``: its overrides, parsed); each axis also holds the row's own value, so
    that the published layout is a point of its space (pp 35, v 3, 384-way ZeRO-3 are not powers of two)."""
    gpus, replicas = row["gpus"], typed["parallel.dp_replicate"]
    world = gpus // replicas
    powers = [2**i for i in range(int(math.log2(world)) + 1)]
    fixed = {k: v for k, v in typed.items() if k not in SEARCHED}
    layers, batch = fixed.get("model.n_layers") or row["model"]["n_layers"], row["global_batch_sequences"]
    own = published_point(typed)

    def values(key: str, choices: list) -> list:
        return sorted({*choices, own[key]})

    return {
        "name": f"experts-{row['id']}",
        "objective": {"metric": "tokens_per_sec", "direction": "maximize"},
        "world_size": gpus,
        "fixed": fixed,
        "params": {
            "parallel.dp_shard": {"type": "choice", "values": values("parallel.dp_shard", powers)},
            "parallel.tp": {"type": "choice", "values": values("parallel.tp", [p for p in powers if p <= 8])},
            "parallel.sp": {"type": "choice", "values": [False, True]},
            "parallel.pp": {"type": "choice", "values": values("parallel.pp", [p for p in powers if p <= 16])},
            "parallel.cp": {
                "type": "choice",
                "values": values("parallel.cp", [p for p in powers if p <= own["parallel.cp"]]),
            },
            "parallel.pp_schedule": {"type": "choice", "values": ["1f1b", "interleaved"]},
            "parallel.pp_virtual": {"type": "choice", "values": values("parallel.pp_virtual", [1, 2])},
            "training.micro_batch_size": {"type": "choice", "values": values("training.micro_batch_size", [1, 2, 4])},
            "memory.recompute": {"type": "choice", "values": values("memory.recompute", ["none", "selective", "full"])},
        },
        "constraints": [
            f"parallel.dp_shard * parallel.tp * parallel.pp * parallel.cp == {world}",
            "parallel.tp > 1 or not parallel.sp",
            "parallel.pp > 1 or (parallel.pp_schedule == '1f1b' and parallel.pp_virtual == 1)",
            "(parallel.pp_virtual > 1) == (parallel.pp_schedule == 'interleaved')",
            # what the core would refuse for this model and batch, said as constraints: stages divide the layers,
            # micro-batches the batch
            f"{layers} % (parallel.pp * parallel.pp_virtual) == 0",
            f"{batch} % (training.micro_batch_size * parallel.dp_shard * {replicas}) == 0",
        ],
    }


def published_point(settings: dict) -> dict:
    """The row's own layout as a point of its space (a row without a pipeline names no schedule)."""
    defaults = {"parallel.pp_schedule": "1f1b", "parallel.pp_virtual": 1}
    return {k: settings.get(k, defaults.get(k)) for k in SEARCHED}


def runs_text(values: list) -> str:
    """``[1, 2, 2, 2, 1]`` as ``1, 2 x 3, 1``: a published split, readable in a table cell."""
    out, i = [], 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        out.append(f"{values[i]}" if j - i == 1 else f"{values[i]} x {j - i}")
        i = j
    return ", ".join(out)


def rank_of(ranked: list[PlanRow], mine: dict, speed: float | None = None) -> int | None:
    """Where the published layout stands among ``ranked`` (the fitting points, fastest first), from 0: its own
    point's place; for an uneven split, which is no point of the space, the number of points predicted faster than
    its ``speed`` (tokens/s per device; None: it does not fit). None when it is not among them."""
    if speed is not None:
        return sum(r.tokens_per_sec_per_device > speed for r in ranked)
    return next((i for i, r in enumerate(ranked) if r.params == mine), None)


def plan_pruned(space: dict, published: dict, least_recompute: bool = False) -> list:
    """Plan ``space``, first dropping each value the space's check says the core refuses for this model and batch
    whatever the other params are (tp 8 over 4 key-value heads, ZeRO-1 over one rank, ...); the published value is
    never dropped: a space that refuses it is not planned."""
    while True:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "space.yaml"
            path.write_text(yaml.safe_dump(space, sort_keys=False))
            try:
                return plan(load_space(path), least_recompute=least_recompute)
            except SpaceError as exc:
                hit = re.fullmatch(r"params\.(.+)\.values\[(\d+)\]", exc.key)
                if hit is None:
                    raise
                values = space["params"][hit.group(1)]["values"]
                value = values[int(hit.group(2))]
                if value == published[hit.group(1)] or len(values) == 1:
                    raise
                values.remove(value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="rows to plan (default: every distinct setting)")
    ap.add_argument("--least-recompute", action="store_true", help="plan recomputing points with their fewest blocks")
    ap.add_argument(
        "--out", type=Path, default=None, help="default: benchmarks/data/plan_vs_experts[_least_recompute].md"
    )
    args = ap.parse_args()
    suffix = "_least_recompute" if args.least_recompute else ""
    out = args.out or ROOT / "benchmarks" / "data" / f"plan_vs_experts{suffix}.md"
    runs = yaml.safe_load(DATA.read_text())["runs"]
    by_id = {r["id"]: r for r in runs}
    efficiency = {device: fit(by_id[row]) for device, row in FIT.items()}
    efficiency["h200"], efficiency["a100"] = efficiency["h100-sxm"], efficiency["a100-80gb"]
    seen, rows = set(), []
    for row in runs:  # one row per distinct (model, device, GPUs, batch, sequence, precision), held out of the fit
        key = (str(row["model"]), row["device"], row["gpus"], row["global_batch_sequences"], row["seq_len"])
        if skip_reason(row) or row["id"] in FIT.values() or key in seen:
            continue
        seen.add(key)
        rows.append(row)
    lines = [
        "| row | published layout | its predicted rank (of fitting points) | in top 5? | plan's first choice | "
        "predicted gain |",
        "|---|---|---:|---|---|---:|",
    ]
    hits, gains, started = 0, [], time.time()
    for row in rows[: args.limit]:
        published = overrides(row, efficiency[row["device"]])
        typed = parse_overrides(published)
        # an uneven split or per-stage recompute counts: no point of the space (planned among even splits and one
        # recompute setting for every block), so the published layout is predicted apart
        apart = {k: typed.pop(k) for k in ("parallel.pp_layers", "memory.recompute_stage_layers") if k in typed}
        space = space_for(row, typed)
        profile = yaml.safe_load((ROOT / "configs" / "cluster" / f"{typed['cluster']}.yaml").read_text())
        space["fixed"]["device"] = profile["device"]  # the space is checked by the core's rules for that device
        try:
            every = plan_pruned(space, published_point(typed), args.least_recompute)
        except (ConfigError, ValueError) as exc:
            lines.append(f"| {row['id']} | - | not planned: {exc} | - | - | - |")
            continue
        ranked = sorted(
            (r for r in every if r.verdict in (Verdict.RANKED, Verdict.DOMINATED)),
            key=lambda r: -r.tokens_per_sec_per_device,
        )
        mine = published_point(typed)
        layout = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in mine.items())
        # as it ran: a recomputing published layout is not its own point when the plan counts blocks per stage
        as_published = apart or (args.least_recompute and mine["memory.recompute"] != "none")
        if not as_published:
            where = rank_of(ranked, mine)
            speed = ranked[where].tokens_per_sec_per_device if where is not None else None
            own = next((r for r in every if r.params == mine), None)
            why = f"{own.verdict.value}: {own.reason}" if own else "not a point of the space"
        else:  # no point of the space: its own prediction, placed among the ranked points by speed
            layout += "".join(f", {k.split('.')[-1]}=[{runs_text(v)}]" for k, v in apart.items())
            est = estimate_step(load(published))
            speed = est.tokens_per_sec_per_device if est.fits else None
            where = None if speed is None else rank_of(ranked, mine, speed)
            why = f"memory: {est.peak_memory_bytes_per_rank / 2**30:.1f} GiB per rank over the device's"
            why += f" {est.memory_bytes_per_device / 2**30:g}"
        if where is None:
            lines.append(f"| {row['id']} | {layout} | predicted not to run ({why}) | no | - | - |")
            continue
        fitting = len(ranked) + bool(as_published)  # a published layout predicted apart is one more fitting point
        best = ranked[0] if where > 0 else None  # where 0: the published layout is the plan's first choice
        hits += where < TOP
        gain = best.tokens_per_sec_per_device / speed if best else 1.0
        gains.append(gain)
        changed = best.params.items() if best else ()
        choice = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in changed if mine.get(k) != v)
        if best and best.recompute_stage_layers is not None:  # --least-recompute: the blocks its stages recompute
            choice = ", ".join(
                filter(None, (choice, f"recompute_stage_layers=[{runs_text(best.recompute_stage_layers)}]"))
            )
        lines.append(
            f"| {row['id']} | {layout} | {where + 1} of {fitting} | {'yes' if where < TOP else 'no'} | "
            f"{choice or 'the same'} | {gain:.2f}x |"
        )
        print(f"  {row['id']}: rank {where + 1} of {fitting}, gain {gain:.2f}x", file=sys.stderr)
    planned = len(lines) - 2
    summary = (
        f"{planned} published settings planned in {time.time() - started:.0f} s; the published layout in the top "
        f"{TOP}: {hits} of {len(gains)}; the plan's first choice predicted "
        f"{statistics.median(gains):.2f}x the published layout at the median (max {max(gains):.2f}x)"
        if gains
        else "no setting planned"
    )
    how = " (recomputing points planned with their fewest blocks per stage)" if args.least_recompute else ""
    head = f"# The plan against the experts{how} — {time.strftime('%Y-%m-%d')}, commit {git_commit()}\n"
    text = "\n".join([head, summary, "", *lines]) + "\n"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
