"""A study as a table a person can review, with its cost ledger and its confirmation.

Rows are sorted by objective, best first for the study's direction; trials without an objective (failures,
pruned proposals) follow in trial order. The ledger columns (``autoresearch.study.ledger``) are device-seconds: ranks,
device_sec (ranks x wall time), its parts startup_sec, compile_sec and steps_sec (empty where the trial cannot
tell them), then llm_tokens and llm_usd. The study's ledger follows the markdown table (on stderr with --format
csv|json, so that stdout stays parseable). Markdown is formatted here (no ``tabulate`` dependency). Reading the
CSV back with pandas: ``pd.read_csv(f, keep_default_na=False, na_values=[""])``, or the status ``nan`` reads as
a missing value.
"""

from __future__ import annotations

import math
import statistics

import optuna
import pandas as pd

from autoresearch.records import Attr, TrialRow, plan_errors
from autoresearch.study import confirm, ledger
from autoresearch.study.storage import trial_rows

MiB = 1024**2
LEAD = ["number", "status", "exit_code"]
LEDGER = ["ranks", "device_sec", *ledger.PARTS, "llm_tokens", "llm_usd"]  # from each row's ledger
TAIL = ["objective", "vs_baseline", "mem_vs_baseline", "peak_mem_mib", "wall_time_sec", *LEDGER, "proposer", "reason"]
# What a person reads first (the agent's terminal, report.html): the params that vary among the rows, then these.
BRIEF = ["objective", "predicted", "vs_baseline", "mem_vs_baseline", "peak_mem_mib", "device_sec", "proposer"]


def param_names(study: optuna.Study, rows: list[TrialRow]) -> list[str]:
    """The space's params in its order, then any other a trial has (a study whose space grew)."""
    names = list(study.user_attrs.get(Attr.PARAM_NAMES) or [])
    for r in rows:
        names += [k for k in r.params if k not in names]
    return names


def study_table(study: optuna.Study, rows: list[TrialRow] | None = None) -> pd.DataFrame:
    """One row per trial: number, status, exit code, each param, objective, its ratio to the baseline's
    (``records.gain``) and its peak memory's, peak memory (MiB), wall time, the ledger's columns, proposer, reason;
    sorted best first. ``rows``: ``trial_rows(study)``, when already read."""
    rows = trial_rows(study) if rows is None else rows
    table = []
    for r in rows:
        peak, led = r.peak_memory_bytes, r.ledger or {}
        table.append(
            {
                "number": r.number,
                "status": str(r.status),
                "exit_code": r.exit_code,
                **r.params,
                "objective": r.objective,
                "vs_baseline": r.gain,
                "mem_vs_baseline": r.memory_ratio,
                "peak_mem_mib": None if peak is None else round(peak / MiB, 1),
                "wall_time_sec": r.wall_time_sec,
                **{k: led.get(k) for k in LEDGER},
                "proposer": r.proposer,
                "reason": r.reason,
            }
        )
    df = pd.DataFrame(table, columns=LEAD + param_names(study, rows) + TAIL)
    if any(r.predicted_objective is not None for r in rows):  # --plan: the model's figure beside the measured one
        df.insert(df.columns.get_loc("objective") + 1, "predicted", [r.predicted_objective for r in rows])
    for column in ("exit_code", "ranks", "llm_tokens"):
        df[column] = df[column].astype("Int64")
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    df = df.sort_values(["objective", "number"], ascending=[not maximize, True], na_position="last", kind="stable")
    return df.reset_index(drop=True)


def brief(df: pd.DataFrame, params: list[str]) -> pd.DataFrame:
    """The table a person reads: number and status, the params whose value differs between rows (a param at one
    value everywhere says nothing), and ``BRIEF``'s columns that hold a value."""
    varying = [p for p in params if p in df.columns and df[p].astype(str).nunique(dropna=False) > 1]
    tail = [c for c in BRIEF if c in df.columns and df[c].notna().any()]
    return df[["number", "status", *varying, *tail]]


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


def ledger_text(study: optuna.Study, rows: list[TrialRow]) -> str:
    """The study's ledger (``autoresearch.study.ledger.format_totals``) from ``trial_rows``."""
    return ledger.format_totals(ledger.of_study(study, rows))


def model_error_text(rows: list[TrialRow], last: int = 5) -> str:
    """How far the step-time model's predictions (``--plan``: each made before its run, with the model refitted
    to the runs before it) were from the measured objective: the median |predicted / measured - 1| over the ok
    runs, and over the ``last`` of them, which shows whether the refits helped; "" without predictions."""
    errors = plan_errors(rows)
    if not errors:
        return ""
    recent = errors[-last:]
    return (
        f"step-time model (--plan), predicted before each run vs measured: median |error| "
        f"{100 * statistics.median(errors):.1f}% over {len(errors)} ok runs, {100 * statistics.median(recent):.1f}% "
        f"over the last {len(recent)}"
    )


def confirmation_text(study: optuna.Study) -> str:
    """The confirmation's table (mean ± std of each front-runner's repeats, the params that vary among them) and
    its verdict, or "" when the study has no confirmation runs (``autoresearch.study.confirm``)."""
    v = confirm.recorded_verdict(study)
    if v is None:
        return ""
    metric = study.user_attrs.get(Attr.OBJECTIVE_METRIC, "objective")
    df = pd.DataFrame(confirm.table(v, metric))
    params = [p for p in param_names(study, []) if p in df.columns]
    constant = [p for p in params if df[p].astype(str).nunique(dropna=False) <= 1]
    table = to_markdown(df.drop(columns=constant))
    return f"confirmation (up to {v.repeats} runs per config; the search's own run left out):\n{table}\n{v.line}"
