"""Reports of a study: the table, its ledger and confirmation, plots, an HTML page, and the agent's terminal.

table.py      study_table: one row per trial, best first; markdown, CSV or JSON; the ledger's text
explain.py    one trial explained: its config in short, its memory breakdown; the study's space
headline.py   the study's answer: what to use, its gain over the baseline, its memory, the commands
plots.py      the PNGs (objective, params, best against device time, predicted against measured, memory, throughput
              against memory with its Pareto front, parallel coordinates)
html.py       report.html: the headline first, then everything above on one page
console.py    the agent's terminal: a progress bar and a line per trial, then the headline
__main__.py   ``python -m autoresearch.report``
"""

from autoresearch.report.explain import params_label
from autoresearch.report.table import confirmation_text, ledger_text, render, study_table, to_markdown

__all__ = ["confirmation_text", "ledger_text", "params_label", "render", "study_table", "to_markdown"]
