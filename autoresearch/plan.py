"""``python -m autoresearch.plan --space <file> [overrides] [--top K] [--out DIR]``: rank every point of a search
space by the core's step-time model before paying for a trial (``autoresearch.search.planner``).

    python -m autoresearch.plan --space cluster-llama3-70b.yaml
    python -m autoresearch.plan --space cluster-llama3-70b.yaml cluster.nodes=64 --top 5
    python -m autoresearch.plan --space cluster-llama3-70b.yaml --least-recompute

Prints the top K with predicted tokens/s per device, MFU, memory per rank and the pipeline's idle share, then how
many points lost and why (invalid, over memory, dominated); writes ``plan.csv`` (every point, its prediction, its
verdict and reason), ``plan.md`` and ``plan.png`` (predicted throughput against memory per rank) into ``--out``
(default ``trials/plan/<space name>/``). With ``--least-recompute`` a point that recomputes does so only on the
first blocks of each pipeline stage that its rank needs to fit the device (``core.perf.least_recompute``; the
per-stage counts MindFormers' configs set by hand), and the table says how many. Exit 2 on a malformed space or
override, naming it.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import pandas as pd

from autoresearch.report.table import to_markdown
from autoresearch.search.planner import PlanRow, Verdict, plan
from autoresearch.space import SpaceError, load_space
from core.config import ConfigError


def table(rows: list[PlanRow], *, least_recompute: bool = False) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "rank": i + 1 if r.verdict is Verdict.RANKED else None,
                **r.params,
                "tokens_per_sec_per_device": r.tokens_per_sec_per_device,
                "tokens_per_sec": r.tokens_per_sec,
                "mfu": r.mfu,
                "step_time_sec": r.step_time_sec,
                "memory_gib": r.memory_gib,
                "bubble": r.bubble,
                **({"memory.recompute_stage_layers": r.recompute_stage_layers} if least_recompute else {}),
                "verdict": r.verdict.value,
                "reason": r.reason,
            }
            for i, r in enumerate(rows)
        ]
    )


def write_plot(df: pd.DataFrame, path: Path) -> None:
    # function-level: matplotlib loads only when a plot is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # function-level: as above

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for verdict, marker in ((Verdict.RANKED, "o"), (Verdict.DOMINATED, "."), (Verdict.MEMORY, "x")):
        part = df[df.verdict == verdict.value]
        if len(part):
            ax.scatter(part.memory_gib, part.tokens_per_sec_per_device, marker=marker, label=verdict.value)
    ax.set_xlabel("predicted peak memory per rank (GiB)")
    ax.set_ylabel("predicted tokens/s per device")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", required=True, help="a space file (search_spaces/ or a path)")
    ap.add_argument("overrides", nargs="*", help="key=value on top of the space's fixed settings")
    ap.add_argument("--top", type=int, default=10, help="points to print (default 10)")
    ap.add_argument("--out", type=Path, default=None, help="directory of plan.csv, plan.md, plan.png")
    ap.add_argument("--points-per-float", type=int, default=4, help="grid values of a float param (default 4)")
    ap.add_argument(
        "--least-recompute",
        action="store_true",
        help="a point that recomputes does so on the fewest blocks of each pipeline stage that fit the device "
        "(the counts in column memory.recompute_stage_layers)",
    )
    args = ap.parse_args(argv)
    try:
        space = load_space(args.space)
        rows = plan(space, args.overrides, points_per_float=args.points_per_float, least_recompute=args.least_recompute)
    except (SpaceError, ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    df = table(rows, least_recompute=args.least_recompute)
    out = args.out or Path("trials") / "plan" / space.name
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "plan.csv", index=False)
    (out / "plan.md").write_text(to_markdown(df) + "\n")
    write_plot(df, out / "plan.png")
    ranked = df[df.verdict == Verdict.RANKED.value].head(args.top)
    fitted = ["memory.recompute_stage_layers"] if args.least_recompute else []
    columns = [*space.params, *fitted, "tokens_per_sec_per_device", "mfu", "memory_gib", "bubble"]
    print(f"{space.name}: {len(df)} points; best {len(ranked)} by predicted tokens/s per device:")
    print(ranked[columns].to_string(index=False, float_format=lambda v: f"{v:.3g}") if len(ranked) else "(none)")
    counts = Counter(df.verdict)
    print(", ".join(f"{counts[v.value]} {v.value}" for v in Verdict if counts[v.value]))
    over = df[df.verdict == Verdict.MEMORY.value]
    if len(over):
        print(f"memory: {len(over)} need {over.memory_gib.min():.1f} to {over.memory_gib.max():.1f} GiB per rank")
    invalid = Counter(r.field for r in rows if r.verdict is Verdict.INVALID)
    if invalid:
        print("invalid, by the key the core's rule names: " + ", ".join(f"{k} {n}" for k, n in invalid.most_common()))
    print(f"wrote {out / 'plan.csv'}, plan.md, plan.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
