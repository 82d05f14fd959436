"""Turn a study into a table a person can review, its cost ledger, plots and an HTML page.

    python -m autoresearch.report trials/<study>                     # markdown table, best first, and the ledger
    python -m autoresearch.report trials/<study> --format csv|json   # for spreadsheets and scripts
    python -m autoresearch.report trials/<study> --plot              # PNGs into trials/<study>/ (autoresearch.plots)
    python -m autoresearch.report trials/<study> --html              # report.html + PNGs (autoresearch.report_html)
    python -m autoresearch.report --storage postgresql://... --study NAME

Rows are sorted by objective, best first for the study's direction; trials without an objective (failures,
pruned proposals) follow in trial order. The ledger columns (``autoresearch.ledger``) are device-seconds: ranks,
device_sec (ranks x wall time), its parts startup_sec, compile_sec and steps_sec (empty where the trial cannot
tell them), then llm_tokens and llm_usd. The study's ledger follows the markdown table (on stderr with --format
csv|json, so that stdout stays parseable). Markdown is formatted here (no ``tabulate`` dependency). Reading the
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

from autoresearch import ledger
from autoresearch.storage import storage_url, trial_rows

MiB = 1024**2
LEAD = ["number", "status", "exit_code"]
LEDGER = ["ranks", "device_sec", *ledger.PARTS, "llm_tokens", "llm_usd"]  # from each row's ledger
TAIL = ["objective", "peak_mem_mib", "wall_time_sec", *LEDGER, "proposer", "reason"]


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


def param_names(study: optuna.Study, rows: list[dict]) -> list[str]:
    """The space's params in its order, then any other a trial has (a study whose space grew)."""
    names = list(study.user_attrs.get("param_names") or [])
    for r in rows:
        names += [k for k in r["params"] if k not in names]
    return names


def study_table(study: optuna.Study, rows: list[dict] | None = None) -> pd.DataFrame:
    """One row per trial: number, status, exit code, each param, objective, peak memory (MiB), wall time, the
    ledger's columns, proposer, reason; sorted best first. ``rows``: ``trial_rows(study)``, when already read."""
    rows = trial_rows(study) if rows is None else rows
    table = []
    for r in rows:
        peak, led = r["peak_memory_bytes"], r["ledger"] or {}
        table.append({"number": r["number"], "status": r["status"], "exit_code": r["exit_code"], **r["params"],
                      "objective": r["objective"], "peak_mem_mib": None if peak is None else round(peak / MiB, 1),
                      "wall_time_sec": r["wall_time_sec"], **{k: led.get(k) for k in LEDGER},
                      "proposer": r["proposer"], "reason": r["reason"]})
    df = pd.DataFrame(table, columns=LEAD + param_names(study, rows) + TAIL)
    for column in ("exit_code", "ranks", "llm_tokens"):
        df[column] = df[column].astype("Int64")
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


def ledger_text(rows: list[dict]) -> str:
    """The study's ledger (``autoresearch.ledger.format_totals``) from ``trial_rows``."""
    return ledger.format_totals(ledger.study_totals(rows))


def confirmation_text(study: optuna.Study) -> str:
    """The confirmation's table (mean ± std of each front-runner's repeats) and its verdict, or "" when the
    study has no confirmation runs (``autoresearch.confirm``)."""
    from autoresearch import confirm

    v = confirm.recorded_verdict(study)
    if v is None:
        return ""
    metric = study.user_attrs.get("objective_metric", "objective")
    table = to_markdown(pd.DataFrame(confirm.table(v, metric)))
    return f"confirmation (up to {v.repeats} runs per config; the search's own run left out):\n{table}\n{v.line}"


def plot(study: optuna.Study, out_dir: str | Path, rows: list[dict] | None = None) -> list[Path]:
    """Every PNG of ``autoresearch.plots`` into ``out_dir``."""
    from autoresearch import plots

    rows = trial_rows(study) if rows is None else rows
    return plots.write_all(study, study_table(study, rows), rows, param_names(study, rows), out_dir)


def write_html(study: optuna.Study, out_dir: str | Path, rows: list[dict] | None = None) -> list[Path]:
    """The PNGs and ``report.html`` (table, ledger, plots, each trial explained) into ``out_dir``."""
    from autoresearch import report_html

    rows = trial_rows(study) if rows is None else rows
    pngs = plot(study, out_dir, rows)
    page = report_html.write(study, study_table(study, rows), rows, ledger_text(rows), pngs,
                             Path(out_dir) / "report.html", confirmation_text(study))
    return [*pngs, page]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autoresearch.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("study_dir", nargs="?", help="a study directory, trials/<study> (reads its study.db)")
    ap.add_argument("--storage", help="SQLAlchemy URL of the study storage instead of <study_dir>/study.db")
    ap.add_argument("--study", help="study name (default: the only study in the storage, or the dir's name)")
    ap.add_argument("--format", choices=["markdown", "csv", "json"], default="markdown")
    ap.add_argument("--plot", action="store_true", help="write PNG plots into the study dir (or --out)")
    ap.add_argument("--html", action="store_true", help="write report.html (table, ledger, plots, each trial "
                    "explained) and the PNGs into the study dir (or --out)")
    ap.add_argument("--out", help="directory for --plot and --html (default: the study dir, else trials/<study>)")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_study(args.study_dir, args.storage, args.study)
    rows = trial_rows(study)
    sys.stdout.write(render(study_table(study, rows), args.format).rstrip("\n") + "\n")
    side = sys.stdout if args.format == "markdown" else sys.stderr  # csv/json stay parseable
    print("\n" + ledger_text(rows), file=side)
    confirmed = confirmation_text(study)
    if confirmed:
        print("\n" + confirmed, file=side)
    if args.plot or args.html:
        out = args.out or args.study_dir or Path("trials") / study.study_name
        for path in (write_html if args.html else plot)(study, out, rows):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
