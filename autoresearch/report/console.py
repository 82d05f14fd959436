"""What the agent shows on its terminal: a progress bar per phase with one line per trial (the session's
``Listener``), the agent's log lines above the bar, and at the end the study's table, its ledger and the verdict.
The session prints nothing itself (``autoresearch.run.session``).
"""

from __future__ import annotations

import logging
import shlex
import sys

import optuna
import pandas as pd
from optuna.trial import FrozenTrial
from tqdm import tqdm

from autoresearch.records import WASTED
from autoresearch.report.explain import params_label
from autoresearch.report.table import ledger_text, model_error_text, render, study_table, to_markdown
from autoresearch.run.session import Outcome, Phase, Session, TrialEvent
from autoresearch.study import confirm, ledger
from autoresearch.study.storage import best_trial, trial_rows


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
        tqdm.write(text, file=sys.stdout)
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


def trial_line(e: TrialEvent, metric: str) -> str:
    """One line per trial: number, status, config, objective, time, slot, reason."""
    head = f"trial {e.number:4d} {str(e.status):13s} {params_label(e.params)}: "
    if e.wall_time is None:  # a proposal recorded without running
        return head + e.reason
    value = "" if e.objective is None else f"{metric}={e.objective:.5g} "
    if e.predicted is not None:
        value += f"(plan {e.predicted:.5g}) "
    where = f" [{e.slot}]" if e.slot else ""
    if e.confirmation_of is not None:
        where += f" confirming trial {e.confirmation_of} (run {e.repeat + 1})"
    knew = f" [before it ran: {e.knew}]" if e.knew and e.status in WASTED else ""
    return f"{head}{value}({e.wall_time:.1f}s){where} {e.reason[:120]}{knew}"


def print_outcome(session: Session, outcome: Outcome) -> None:
    """After the session: the table (also written to ``trials.csv``), the ledger, and last the verdict."""
    study, rows = outcome.study, outcome.rows
    df = study_table(study, rows)
    session.study_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(session.study_dir / "trials.csv", index=False)
    print(f"\nstopped: {outcome.why}\n")
    print(render(df, "markdown"))
    print("\n" + ledger_text(rows))
    if text := model_error_text(rows):
        print("\n" + text)
    print(
        f"\ntrials.csv: {session.study_dir / 'trials.csv'}; review with: python -m autoresearch.report "
        f"{session.study_dir}"
    )
    print_verdict(session, study)


def print_verdict(session: Session, study: optuna.Study) -> None:
    """The search's best run, the confirmation table, and last the verdict: a winner only with evidence."""
    best = best_trial(study)
    if best is None:
        print("\nno feasible trial yet")
        return
    metric, opts = session.space.objective_metric, session.opts
    waste = ledger.waste_text(ledger.study_totals(trial_rows(study)))
    print(f"\nsearch's best run: trial {best.number}: {metric}={best.value:.6g}; on the way, {waste}")
    v = confirm.verdict(study, opts.confirm, opts.repeats) if opts.confirm > 0 else None
    pick = best.params
    if v is not None:
        print(
            f"\nconfirmation ({opts.repeats} runs per config; mean ± std of those runs, the search's own run left out):"
        )
        print(to_markdown(pd.DataFrame(confirm.table(v, metric))))
        pick = v.winner.params if v.winner is not None else pick
    for k, value in pick.items():
        print(f"  {k} = {value}")
    print("reproduce: " + shlex.join([*session.command, *session.space.overrides(pick)]))
    print(
        v.line if v is not None else f"best (unconfirmed, --confirm 0): trial {best.number}, {metric}={best.value:.6g}"
    )
