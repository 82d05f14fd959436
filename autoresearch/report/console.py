"""What the agent shows on its terminal: a progress bar per phase with one line per trial (the session's
``Listener``), the agent's log lines above the bar, and at the end the study's table, its ledger and the verdict.
The session prints nothing itself (``autoresearch.run.session``).
"""

from __future__ import annotations

import logging
import sys
import textwrap

from optuna.trial import FrozenTrial
from tqdm import tqdm

from autoresearch.records import WASTED, Status
from autoresearch.report.explain import params_label
from autoresearch.report.headline import headline
from autoresearch.report.headline import text as headline_text
from autoresearch.report.table import (
    brief,
    confirmation_text,
    ledger_text,
    model_error_text,
    param_names,
    study_table,
    to_markdown,
)
from autoresearch.run.session import Outcome, Phase, Session, TrialEvent

WIDTH = 120  # columns of a progress line (a wider one wraps)
INDENT = 11  # a wrapped progress line's continuation


class Console(logging.Handler):
    """The session's listener on a terminal, and the handler of the agent's log lines (written above the bar)."""

    def __init__(self, metric: str, *, progress: bool = True):
        super().__init__(logging.INFO)
        self.metric, self.progress = metric, progress
        self.bar: tqdm | None = None
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.note(self.format(record))

    def note(self, text: str) -> None:
        tqdm.write("\n".join(_wrap(line, WIDTH) if line else line for line in text.split("\n")), file=sys.stdout)
        sys.stdout.flush()

    def phase_started(self, phase: Phase) -> None:
        self.bar = tqdm(
            total=phase.total,
            initial=min(phase.done(), phase.total),
            unit="trial",
            desc=phase.name,
            dynamic_ncols=True,
            disable=None if self.progress else True,
        )  # None: only on a terminal

    def trial_ended(self, phase: Phase, event: TrialEvent, best: FrozenTrial | None) -> None:
        self.bar.n = min(phase.done(), phase.total)
        if best is not None:
            self.bar.set_postfix_str(f"best {self.metric}={best.value:.5g} (#{best.number})")
        self.bar.refresh()
        self.bar.write(trial_line(event, self.metric))

    def phase_ended(self, phase: Phase) -> None:
        self.bar.close()
        self.bar = None


def trial_line(e: TrialEvent, metric: str, width: int = WIDTH) -> str:
    """One trial, in at most ``width`` columns a line (wrapped, nothing cut): its number and status, what it
    changed from the baseline (every param when the study has none), its objective against the baseline's and the
    plan's, its time and slot; for a run that did not end ok, the reason and what the agent knew before it ran."""
    if e.changes is None:
        what = params_label(e.params)
    else:
        what = params_label(e.changes) if e.changes else "the baseline"
    text = f"trial {e.number:4d} {str(e.status):13s} {what}:"
    if e.wall_time is None:  # a proposal recorded without running
        return _wrap(f"{text} {e.reason}", width)
    if e.objective is not None:
        text += f" {metric}={number_text(e.objective)}"
        against = [f"{e.gain:.2f}x the baseline" if e.gain is not None and e.changes else ""]
        against.append(f"memory {e.memory_ratio:.2f}x" if e.memory_ratio is not None and e.changes else "")
        against.append(f"plan {number_text(e.predicted)}" if e.predicted is not None else "")
        if any(against):
            text += f" ({', '.join(a for a in against if a)})"
    text += f" in {e.wall_time:.1f}s"
    if e.slot:
        text += f" [{e.slot}]"
    if e.confirmation_of is not None:
        text += f" confirming trial {e.confirmation_of} (run {e.repeat + 1})"
    if e.status != Status.OK:
        text += f"; {e.reason}"
        if e.knew and e.status in WASTED:
            text += f" [before it ran: {e.knew}]"
    return _wrap(text, width)


def number_text(value: float) -> str:
    """A measured number as a person reads it: 3,982 or 0.0314 (four significant digits below 1,000)."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _wrap(text: str, width: int) -> str:
    return textwrap.fill(text, width, subsequent_indent=" " * INDENT, break_long_words=False, break_on_hyphens=False)


def print_outcome(session: Session, outcome: Outcome) -> None:
    """After the session: the table (``trials.csv`` holds every column; here the params that vary), the ledger,
    the confirmation, and last the study's answer (``autoresearch.report.headline``)."""
    study, rows = outcome.study, outcome.rows
    df = study_table(study, rows)
    session.study_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(session.study_dir / "trials.csv", index=False)
    print(f"\nstopped: {outcome.why}\n")
    print(to_markdown(brief(df, param_names(study, rows))))
    print("\n" + ledger_text(study, rows))
    if text := model_error_text(rows):
        print("\n" + text)
    print(
        f"\ntrials.csv: {session.study_dir / 'trials.csv'} (every column); review with: python -m autoresearch.report "
        f"{session.study_dir} --html"
    )
    if confirmed := confirmation_text(study):
        print("\n" + confirmed)
    print("\n" + headline_text(headline(study, session.study_dir, session.command)))
