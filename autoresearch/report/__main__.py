"""``python -m autoresearch.report``: a study as a table a person can review, its cost ledger, plots and an HTML
page.

    python -m autoresearch.report trials/<study>                     # markdown table, best first, and the ledger
    python -m autoresearch.report trials/<study> --format csv|json   # for spreadsheets and scripts
    python -m autoresearch.report trials/<study> --plot              # PNGs into trials/<study>/
    python -m autoresearch.report trials/<study> --html              # report.html + PNGs
    python -m autoresearch.report --storage postgresql://... --study NAME
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import optuna

from autoresearch.report.html import write_report
from autoresearch.report.plots import write_plots
from autoresearch.report.table import confirmation_text, ledger_text, model_error_text, render, study_table
from autoresearch.study.connection import StorageUnavailable
from autoresearch.study.storage import load_study, trial_rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m autoresearch.report",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("study_dir", nargs="?", help="a study directory, trials/<study> (reads its study.db)")
    ap.add_argument("--storage", help="SQLAlchemy URL of the study storage instead of <study_dir>/study.db")
    ap.add_argument("--study", help="study name (default: the only study in the storage, or the dir's name)")
    ap.add_argument("--format", choices=["markdown", "csv", "json"], default="markdown")
    ap.add_argument("--plot", action="store_true", help="write PNG plots into the study dir (or --out)")
    ap.add_argument(
        "--html",
        action="store_true",
        help="write report.html (table, ledger, plots, each trial "
        "explained) and the PNGs into the study dir (or --out)",
    )
    ap.add_argument("--out", help="directory for --plot and --html (default: the study dir, else trials/<study>)")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = load_study(args.study_dir, args.storage, args.study)
    except StorageUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = trial_rows(study)
    sys.stdout.write(render(study_table(study, rows), args.format).rstrip("\n") + "\n")
    side = sys.stdout if args.format == "markdown" else sys.stderr  # csv/json stay parseable
    print("\n" + ledger_text(study, rows), file=side)
    if text := model_error_text(rows):
        print("\n" + text, file=side)
    confirmed = confirmation_text(study)
    if confirmed:
        print("\n" + confirmed, file=side)
    if args.plot or args.html:
        out = args.out or args.study_dir or Path("trials") / study.study_name
        for path in (write_report if args.html else write_plots)(study, out, rows):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
