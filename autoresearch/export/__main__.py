"""``python -m autoresearch.export``: a study's winner as the config of the training stack you run (see
``autoresearch.export``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import optuna

import autoresearch.export as export
from autoresearch.export import CHOICES, ExportError, export_trial, pick_trial
from autoresearch.study.connection import StorageUnavailable
from autoresearch.study.storage import load_study
from core.config import ConfigError


def main(argv: list[str] | None = None) -> int:
    usage = export.__doc__.split("\n\nModules:\n")[0]  # the package's modules are no help to a user
    ap = argparse.ArgumentParser(
        prog="python -m autoresearch.export",
        description=usage.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(usage.split("\n\n")[1:]),
    )
    ap.add_argument("study_dir", nargs="?", help="a study directory, trials/<study> (reads its study.db)")
    ap.add_argument("--storage", help="SQLAlchemy URL of the study storage instead of <study_dir>/study.db")
    ap.add_argument("--study", help="study name (default: the only study in the storage, or the dir's name)")
    ap.add_argument("--to", required=True, choices=CHOICES, help="the config to write")
    ap.add_argument("--trial", type=int, help="export this trial (default: the study's winner)")
    ap.add_argument("--out", help="write to this file (default: stdout)")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = load_study(args.study_dir, args.storage, args.study)
    except StorageUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        output = export_trial(study, pick_trial(study, args.trial), args.to)
    except (ExportError, ConfigError) as exc:
        print(f"autoresearch.export: {exc}", file=sys.stderr)
        return 2
    if args.to == "overrides":
        print("\n".join(output.header), file=sys.stderr)
    if args.out:
        Path(args.out).write_text(output.text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(output.text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
