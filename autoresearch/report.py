"""Turn a study into a table a person can review, and plots.

    python -m autoresearch.report trials/<study>                     # markdown table, best first
    python -m autoresearch.report trials/<study> --format csv|json   # for spreadsheets and scripts
    python -m autoresearch.report trials/<study> --plot              # PNGs into trials/<study>/
    python -m autoresearch.report --storage postgresql://... --study NAME

Rows are sorted by objective, best first for the study's direction; trials without an objective (failures,
pruned proposals) follow in trial order. Markdown is formatted here (no ``tabulate`` dependency). Reading the
CSV back with pandas: ``pd.read_csv(f, keep_default_na=False, na_values=[""])``, or the status ``nan`` reads as
a missing value.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import optuna
import pandas as pd

from autoresearch.storage import storage_url, trial_rows

MiB = 1024**2
LEAD = ["number", "status", "exit_code"]
TAIL = ["objective", "peak_mem_mib", "wall_time_sec", "proposer", "reason"]


def load_study(path: str | Path | None = None, storage: str | None = None, study: str | None = None) -> optuna.Study:
    """The study in ``<path>/study.db`` (the agent's default), or ``study`` in ``storage``."""
    if storage is None:
        if path is None:
            raise SystemExit("give a study directory (trials/<study>) or --storage URL --study NAME")
        db = Path(path) / "study.db"
        if not db.exists():
            raise SystemExit(f"{db} does not exist: is {path} a study directory written by autoresearch.agent?")
        storage = f"sqlite:///{db}"
    storage = storage_url(storage)
    if study is None:
        names = optuna.get_all_study_names(storage=storage)
        if len(names) != 1:
            wanted = Path(path).name if path is not None else None
            if wanted not in names:
                raise SystemExit(f"{storage} holds studies {names}; pick one with --study")
            names = [wanted]
        study = names[0]
    return optuna.load_study(study_name=study, storage=storage)


def study_table(study: optuna.Study) -> pd.DataFrame:
    """One row per trial: number, status, exit code, each param, objective, peak memory (MiB), wall time,
    proposer, reason; sorted best first."""
    names = list(study.user_attrs.get("param_names") or [])
    rows = []
    for r in trial_rows(study):
        names += [k for k in r["params"] if k not in names]
        peak = r["peak_memory_bytes"]
        rows.append({"number": r["number"], "status": r["status"], "exit_code": r["exit_code"], **r["params"],
                     "objective": r["objective"], "peak_mem_mib": None if peak is None else round(peak / MiB, 1),
                     "wall_time_sec": r["wall_time_sec"], "proposer": r["proposer"], "reason": r["reason"]})
    df = pd.DataFrame(rows, columns=LEAD + names + TAIL)
    df["exit_code"] = df["exit_code"].astype("Int64")
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    df = df.sort_values(["objective", "number"], ascending=[not maximize, True], na_position="last", kind="stable")
    return df.reset_index(drop=True)


def _cell(value) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value).splitlines()[0] if str(value) else ""
    text = text if len(text) <= 100 else text[:97] + "..."
    return text.replace("|", "\\|")


def to_markdown(df: pd.DataFrame) -> str:
    header = "| " + " | ".join(df.columns) + " |"
    rule = "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else "---" for c in df.columns) + "|"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def render(df: pd.DataFrame, fmt: str = "markdown") -> str:
    if fmt == "csv":
        return df.to_csv(index=False)
    if fmt == "json":
        return df.to_json(orient="records", indent=1)
    return to_markdown(df)


def plot(study: optuna.Study, out_dir: str | Path) -> list[Path]:
    """objective_by_trial.png (each trial, failures marked, best-so-far line) and objective_vs_<param>.png."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display here or in CI
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    df = study_table(study).sort_values("number")
    metric = study.user_attrs.get("objective_metric", "objective")
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    ok = df[df["objective"].notna()]
    failed = df[df["objective"].isna()]
    written = []

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.scatter(ok["number"], ok["objective"], s=18, label="trial")
    if len(ok):
        best = ok["objective"].cummax() if maximize else ok["objective"].cummin()
        ax.step(ok["number"], best, where="post", color="C1", label="best so far")
        floor = ok["objective"].min() if maximize else ok["objective"].max()
        for _, row in failed.iterrows():  # failures sit on the worst value, labelled by what went wrong
            ax.annotate(str(row["status"]), (row["number"], floor), color="C3", fontsize=7, rotation=90)
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title(f"{study.study_name}: {metric} per trial ({'max' if maximize else 'min'}imize; "
                 f"{len(failed)} without objective)")
    ax.legend(loc="best")
    written.append(_save(fig, out_dir / "objective_by_trial.png"))

    params = [c for c in df.columns if c not in LEAD + TAIL]
    dists = {}
    for t in study.get_trials(deepcopy=False):
        dists.update(t.distributions)
    floor = (ok["objective"].min() if maximize else ok["objective"].max()) if len(ok) else 0.0
    for name in params:
        fig, ax = plt.subplots(figsize=(6, 4))
        dist = dists.get(name)
        if isinstance(dist, optuna.distributions.CategoricalDistribution) or df[name].dtype == object:
            labels = [str(c) for c in getattr(dist, "choices", sorted(df[name].dropna().unique(), key=str))]
            position = lambda v, labels=labels: labels.index(str(v)) if str(v) in labels else -1  # noqa: E731
            ax.set_xticks(range(len(labels)), labels)
            ax.set_xlim(-0.5, len(labels) - 0.5)
        else:
            position = float
            if getattr(dist, "log", False):
                ax.set_xscale("log")
        ax.scatter(ok[name].map(position), ok["objective"], s=18, label="trial")
        if len(failed):  # where failures and skips sit along this param: the region to stay out of
            ax.scatter(failed[name].dropna().map(position), [floor] * failed[name].notna().sum(), marker="x",
                       color="C3", label="no objective (failed or skipped)")
        ax.set_xlabel(name)
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} against {name}")
        ax.legend(loc="best", fontsize=8)
        written.append(_save(fig, out_dir / f"objective_vs_{name.replace('/', '_')}.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autoresearch.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("study_dir", nargs="?", help="a study directory, trials/<study> (reads its study.db)")
    ap.add_argument("--storage", help="SQLAlchemy URL of the study storage instead of <study_dir>/study.db")
    ap.add_argument("--study", help="study name (default: the only study in the storage, or the dir's name)")
    ap.add_argument("--format", choices=["markdown", "csv", "json"], default="markdown")
    ap.add_argument("--plot", action="store_true", help="write PNG plots into the study dir (or --out)")
    ap.add_argument("--out", help="directory for --plot (default: the study dir, else trials/<study>)")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_study(args.study_dir, args.storage, args.study)
    sys.stdout.write(render(study_table(study), args.format).rstrip("\n") + "\n")
    if args.plot:
        out = args.out or args.study_dir or Path("trials") / study.study_name
        for path in plot(study, out):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
