"""The study as one self-contained HTML page: the ledger, the trial table, the plots, and each trial explained.

    python -m autoresearch.report trials/<study> --html    # writes trials/<study>/report.html and the PNGs

Per trial: the config it ran, who proposed it and why, how it ended (status, reason), where its device time went
(start-up, compile, steps: ``autoresearch.study.ledger``) and its memory: the measured peak beside the core's
estimate and the agent's calibrated prediction, with the core's breakdown by component
(``autoresearch.report.explain``). The PNGs
are embedded (base64), so the page can be mailed or attached on its own.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import optuna
import pandas as pd

from autoresearch.records import Attr, TrialRow
from autoresearch.report.explain import breakdown_text, params_label
from autoresearch.report.plots import write_plots
from autoresearch.report.table import confirmation_text, ledger_text, study_table
from autoresearch.space import SpaceError, load_space
from autoresearch.study.storage import trial_rows

MiB = 1024**2
UNKNOWN_PARTS = (
    "<p><small>unknown: the trial did not report it (no start-up phases, no steady step to subtract "
    "from the first, or no summary); never estimated (autoresearch.study.ledger)</small></p>"
)
STYLE = """body{font-family:sans-serif;margin:1.5em;max-width:1400px}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#eee}pre{background:#f6f6f6;
padding:6px;font-size:12px}.trial{border-top:1px solid #999;margin-top:1em}img{max-width:100%;margin:4px}"""


def _esc(value) -> str:
    return html.escape("" if value is None else str(value))


def _mib(value) -> str:
    return "" if value is None else f"{value / MiB:.1f}"


def _sec(value) -> str:
    return "unknown" if value is None else f"{value:.3f}"


def _time_table(led: dict | None) -> str:
    if led is None:
        return "<p>still running: no ledger yet</p>"
    rows = [
        ("ranks", led.get("ranks")),
        ("wall seconds", _sec(led.get("wall_sec"))),
        ("device-seconds (ranks x wall)", _sec(led.get("device_sec"))),
        ("start-up, device-s", _sec(led.get("startup_sec"))),
        ("compile, device-s", _sec(led.get("compile_sec"))),
        ("steps, device-s", _sec(led.get("steps_sec"))),
        ("LLM calls", led.get("llm_calls")),
        ("LLM tokens", led.get("llm_tokens")),
        ("LLM dollars", "unknown" if led.get("llm_usd") is None else f"{led['llm_usd']:.4f}"),
    ]
    body = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows)
    return f"<table class='time'>{body}</table>" + (UNKNOWN_PARTS if "unknown" in body else "")


def _memory(row: TrialRow, space) -> str:
    peak, est = row.peak_memory_bytes, row.estimated_memory_bytes
    pred = row.predicted_memory_bytes
    ratio = f" (estimate / measured = {est / peak:.2f})" if peak and est else ""
    head = (
        f"<p>measured peak {_mib(peak) or 'none'} MiB; estimate {_mib(est) or 'none'} MiB; "
        f"calibrated prediction {_mib(pred) or 'none'} MiB{ratio}</p>"
    )
    text, note = breakdown_text(row, space)
    return head + (f"<pre>{_esc(text)}</pre>" if text else f"<p>no memory breakdown: {_esc(note)}</p>")


def trial_section(row: TrialRow, space=None) -> str:
    """One trial explained; ``space`` gives skipped proposals a config for the memory breakdown."""
    who = _esc(row.proposer or "unknown")
    why = f": {_esc(row.rationale)}" if row.rationale else ""
    objective = "" if row.objective is None else f", objective {row.objective:.6g}"
    return (
        f"<div class='trial' id='trial-{row.number}'><h3>trial {row.number}: {_esc(row.status)}"
        f"{objective}</h3><p><code>{_esc(params_label(row.params))}</code></p>"
        f"<p>proposed by {who}{why}</p><p>reason: {_esc(row.reason or 'none given')}</p>"
        f"<h4>time</h4>{_time_table(row.ledger)}<h4>memory</h4>{_memory(row, space)}</div>"
    )


def _image(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f"<img alt='{_esc(Path(path).name)}' src='data:image/png;base64,{data}'>"


def _space(study: optuna.Study):
    """The study's space (for skipped proposals' configs), or None when its file is gone or no longer loads."""
    path = study.user_attrs.get(Attr.SPACE_PATH)
    try:
        return load_space(path) if path and Path(path).exists() else None
    except (SpaceError, ValueError):
        return None


def write_report(study: optuna.Study, out_dir: str | Path, rows: list[TrialRow] | None = None) -> list[Path]:
    """The PNGs and ``report.html`` into ``out_dir``: the confirmation's verdict (when the study has one), the
    ledger, the table (as the CSV has it), the plots, and one section per trial, in trial order."""
    rows = trial_rows(study) if rows is None else rows
    pngs = write_plots(study, out_dir, rows)
    page = _page(study, study_table(study, rows), rows, ledger_text(rows), pngs, confirmation_text(study))
    path = Path(out_dir) / "report.html"
    path.write_text(page, encoding="utf-8")
    return [*pngs, path]


def _page(
    study: optuna.Study, table: pd.DataFrame, rows: list[TrialRow], ledger: str, pngs: list[Path], confirmation: str
) -> str:
    space = _space(study)
    metric = study.user_attrs.get(Attr.OBJECTIVE_METRIC, "objective")
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_esc(study.study_name)}</title>"
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{_esc(study.study_name)}</h1><p>space {_esc(study.user_attrs.get('space'))}; "
        f"{study.direction.name.lower()} {_esc(metric)}; {len(rows)} trials</p>",
        *([f"<h2>Confirmation</h2><pre>{_esc(confirmation)}</pre>"] if confirmation else []),
        f"<h2>Cost ledger</h2><pre>{_esc(ledger)}</pre>",
        "<h2>Trials (best first)</h2>",
        table.to_html(
            index=False, table_id="trials", na_rep="", float_format=lambda v: f"{v:.6g}", border=0, escape=True
        ),
        "<h2>Plots</h2>",
        *(_image(p) for p in pngs),
        "<h2>Each trial</h2>",
        *(trial_section(r, space) for r in rows),
        "</body></html>",
    ]
    return "\n".join(parts)
