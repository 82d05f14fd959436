"""The study as one self-contained HTML page: its answer first, then how the search got there, the runs, the
confirmation, the ledger, the plots, and each trial explained.

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

from autoresearch.records import Attr, TrialRow
from autoresearch.report.explain import breakdown_text, params_label, study_space
from autoresearch.report.headline import command_lines, facts, headline, title
from autoresearch.report.plots import write_plots
from autoresearch.report.table import brief, confirmation_text, ledger_text, param_names, study_table
from autoresearch.study.storage import trial_rows

MiB = 1024**2
UNKNOWN_PARTS = (
    "<p><small>unknown: the trial did not report it (no start-up phases, no steady step to subtract "
    "from the first, or no summary); never estimated (autoresearch.study.ledger)</small></p>"
)
STYLE = """body{font-family:sans-serif;margin:1.5em;max-width:1400px}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#eee}pre{background:#f6f6f6;
padding:6px;font-size:12px}.trial{border-top:1px solid #999;margin-top:1em}img{max-width:100%;margin:4px}
#headline{border:2px solid #2a7;background:#f3fbf6;padding:0.4em 1.2em;margin:1em 0}#headline li{margin:0.2em 0}"""


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


def write_report(
    study: optuna.Study, out_dir: str | Path, rows: list[TrialRow] | None = None, command: list[str] | None = None
) -> list[Path]:
    """The PNGs and ``report.html`` into ``out_dir``. The page reads top down as a person asks: the answer (the
    headline the agent printed, ``autoresearch.report.headline``); how the search got there (best so far against
    device time; the model's predictions against the runs, time and memory; throughput against memory with its
    Pareto front); the runs (the params that vary); the confirmation; the ledger; then every plot and every trial
    in detail. ``command``: the trial command the study ran (default: the core's)."""
    rows = trial_rows(study) if rows is None else rows
    pngs = {p.name: p for p in write_plots(study, out_dir, rows)}
    page = _page(study, rows, pngs, headline(study, out_dir, command))
    path = Path(out_dir) / "report.html"
    path.write_text(page, encoding="utf-8")
    return [*pngs.values(), path]


FIRST_PLOTS = (  # the plots of the page's first screen; every other follows under "More plots"
    "best_vs_device_time.png",
    "objective_predicted_vs_measured.png",
    "memory_predicted_vs_measured.png",
    "objective_vs_memory.png",
)


def headline_html(h) -> str:
    """The headline as a section: what to use as its heading, the facts as a list, the commands as code."""
    body = [f"<section id='headline'><h2>{_esc(title(h))}</h2>"]
    if h.kind != "none":
        body.append("<ul>" + "".join(f"<li>{_esc(f)}</li>" for f in facts(h)) + "</ul>")
        body.append(f"<h3>Reproduce</h3><pre><code>{_esc(chr(10).join(command_lines(h.reproduce)))}</code></pre>")
        if h.exports:
            body.append(f"<h3>Export</h3><pre><code>{_esc(chr(10).join(h.exports))}</code></pre>")
    return "".join(body) + "</section>"


def _page(study: optuna.Study, rows: list[TrialRow], pngs: dict[str, Path], h) -> str:
    space = study_space(study)
    metric = study.user_attrs.get(Attr.OBJECTIVE_METRIC, "objective")
    df = study_table(study, rows)
    runs = brief(df, param_names(study, rows))
    confirmation = confirmation_text(study)
    table_html = runs.to_html(
        index=False, table_id="trials", na_rep="", float_format=lambda v: f"{v:.4g}", border=0, escape=True
    )
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_esc(study.study_name)}</title>"
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{_esc(study.study_name)}</h1><p>space {_esc(study.user_attrs.get('space'))}; "
        f"{study.direction.name.lower()} {_esc(metric)}; {len(rows)} trials</p>",
        headline_html(h),
        "<h2>How the search got there</h2>",
        *(_image(pngs[name]) for name in FIRST_PLOTS if name in pngs),
        "<h2>Runs (best first; the params that vary)</h2>",
        table_html,
        *([f"<h2>Confirmation</h2><pre>{_esc(confirmation)}</pre>"] if confirmation else []),
        f"<h2>Cost ledger</h2><pre>{_esc(ledger_text(study, rows))}</pre>",
        "<h2>More plots</h2>",
        *(_image(p) for name, p in pngs.items() if name not in FIRST_PLOTS),
        "<h2>Each trial</h2>",
        *(trial_section(r, space) for r in rows),
        "</body></html>",
    ]
    return "\n".join(parts)
