"""The study's answer in a few lines: which config to use, how much better it is than the baseline (with its
interval), its peak memory, the command that reproduces it, and the commands that carry it to another stack. The
agent prints it last; ``report.html`` opens with it. One function makes it (``headline``), one text renders it
(``text``), so that the two cannot disagree.

The config is the confirmation's pick (``autoresearch.study.confirm.Verdict.pick``: the winner, or of the configs
tied with the best the one that changes least from the baseline), else the search's best run, marked unconfirmed.
Its figure is the mean of its confirmation runs (the search's own run is left out: it was selected for being good),
its gain the ratio of that mean to the baseline's (``records.gain``: above 1 is better).
"""

from __future__ import annotations

import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from autoresearch.core_adapter import DEFAULT_COMMAND
from autoresearch.records import Attr, changes, gain
from autoresearch.report.explain import params_label, study_space
from autoresearch.space import CORE_COMMAND
from autoresearch.study import confirm
from autoresearch.study.storage import baseline_rows, best_trial, trial_rows
from core.config import override

MiB = 2**20
WIDTH = 120
EXPORT_TARGETS = ("mindformers", "torchtitan", "overrides")


@dataclass
class Headline:
    """What the study says to use (``kind``: winner, tied, unconfirmed, or none when nothing ran ok)."""

    kind: str
    metric: str
    trial: int | None = None
    params: dict = field(default_factory=dict)
    changes: dict | None = None  # from the baseline (None: the study has no baseline)
    value: float | None = None
    runs: int = 0
    gain: float | None = None
    interval: tuple[float, float] | None = None
    peak_bytes: float | None = None
    memory_ratio: float | None = None
    tied: list[int] = field(default_factory=list)
    baseline_value: float | None = None
    baseline_runs: int = 0
    verdict: str = ""  # the confirmation's own line
    # where the pick is the baseline: the best other config confirmed, its changes, gain, interval and runs
    alternative: tuple[int, dict, float, tuple[float, float] | None, int] | None = None
    reproduce: list[str] = field(default_factory=list)  # the command, as argv
    exports: list[str] = field(default_factory=list)  # the export commands, as shell lines


def headline(study: optuna.Study, study_dir: str | Path, command: list[str] | tuple[str, ...] | None = None):
    """The study's headline; ``command`` is the trial command the agent ran (default: the core's)."""
    metric = str(study.user_attrs.get(Attr.OBJECTIVE_METRIC, "objective"))
    rows = trial_rows(study)
    best = best_trial(study)
    if best is None:
        return Headline("none", metric)
    maximize = study.direction.name == "MAXIMIZE"
    base = study.user_attrs.get(Attr.BASELINE)
    v = confirm.recorded_verdict(study)
    pick = v.pick if v is not None else None
    h = Headline("unconfirmed", metric)
    if pick is not None and pick.mean is not None:
        h.kind = "winner" if v.winner is not None else "tied"
        h.trial, h.params, h.value, h.runs, h.peak_bytes = pick.trial, pick.params, pick.mean, pick.n, pick.peak
        h.tied, h.verdict = [t for t in v.tied if t != pick.trial], v.line
        if (g := v.gain(pick)) is not None:
            h.gain = g[0]
            h.interval = None if g[1] is None else (g[1], g[2])
        if v.baseline is not None:
            h.baseline_value, h.baseline_runs = v.baseline.mean, v.baseline.n
        others = [c for c in v.configs if c.mean is not None and not c.baseline]
        if pick.baseline and others and (g := v.gain(others[0])) is not None:
            best = others[0]  # configs come best first
            h.alternative = (best.trial, changes(best.params, base or {}), g[0], g[1:] if g[1] else None, best.n)
    else:
        row = next(r for r in rows if r.number == best.number)
        h.trial, h.params, h.value, h.runs, h.peak_bytes = best.number, dict(best.params), best.value, 1, None
        h.peak_bytes = row.peak_memory_bytes
        h.gain = row.gain
        ran = baseline_rows(rows)
        if ran:
            h.baseline_value, h.baseline_runs = sum(r.objective for r in ran) / len(ran), len(ran)
    if base:
        h.changes = changes(h.params, base)
        peaks = [r.peak_memory_bytes for r in baseline_rows(rows) if r.peak_memory_bytes]
        if h.peak_bytes and peaks:
            h.memory_ratio = h.peak_bytes / sorted(peaks)[len(peaks) // 2]
        if h.gain is None and h.baseline_value:
            h.gain = gain(h.value, h.baseline_value, maximize)
    h.reproduce = _reproduce(study, h.params, command)
    if command is None or tuple(command) == DEFAULT_COMMAND:
        h.exports = [f"python -m autoresearch.export {study_dir} --to {to}" for to in EXPORT_TARGETS]
    return h


def _reproduce(study: optuna.Study, params: dict, command) -> list[str]:
    """The command that runs the config again: the space's fixed settings, then the params a trial must set. Of a
    space of the core whose baseline is the core's defaults, only what differs from the baseline (or what the space
    names in ``baseline:``); every param otherwise."""
    space = study_space(study)
    argv = list(command or DEFAULT_COMMAND)
    if space is None or set(params) != set(space.params):  # the space file is gone or changed since
        return [*argv, *(override(k, v) for k, v in params.items())]
    base = space.baseline_point
    if base is None or space.trial_command != CORE_COMMAND:
        return [*argv, *space.overrides(params)]
    needed = {k: v for k, v in params.items() if k in changes(params, base) or k in space.baseline}
    return [*argv, *(override(k, v) for k, v in {**space.fixed, **needed}.items())]


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def command_lines(argv: list[str], width: int = WIDTH, indent: str = "    ") -> list[str]:
    """A command as shell lines of at most ``width`` columns, continued with a backslash: copy-pasteable."""
    words, lines, line = [shlex.quote(a) for a in argv], [], ""
    for word in words:
        if line and len(line) + 1 + len(word) + 2 > width:
            lines.append(line + " \\")
            line = indent + word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line]


def title(h: Headline) -> str:
    """The headline's first line: what to use."""
    if h.kind == "none":
        return "no trial reached the objective: nothing to recommend"
    if h.changes is None:
        what = params_label(h.params)
    else:
        what = params_label(h.changes) if h.changes else "the baseline itself (nothing to change)"
    return {
        "winner": f"use trial {h.trial}'s config (the confirmed winner): {what}",
        "tied": f"use trial {h.trial}'s config (tied within noise with the best): {what}",
        "unconfirmed": f"best run: trial {h.trial} (unconfirmed: a single run's ranking): {what}",
    }[h.kind]


def facts(h: Headline) -> list[str]:
    """Its figure against the baseline's, its memory, and who else is as good."""
    if h.kind == "none":
        return []
    figure = f"{h.metric} {_number(h.value)}" + (f" (mean of {h.runs} runs)" if h.runs > 1 else " (one run)")
    if h.gain is not None and h.baseline_value is not None and h.changes:
        figure += f", {h.gain:.2f}x the baseline's {_number(h.baseline_value)}"
        if h.interval is not None:
            figure += f" (95% interval {h.interval[0]:.2f}-{h.interval[1]:.2f}x)"
    out = [figure]
    if h.alternative is not None:
        trial, changed, ratio, interval, runs = h.alternative
        alt = f"the best alternative confirmed, trial {trial} ({params_label(changed)}): {ratio:.2f}x the baseline"
        out.append(alt + (f" (95% interval {interval[0]:.2f}-{interval[1]:.2f}x, {runs} runs)" if interval else ""))
    if h.peak_bytes:
        memory = f"peak memory {h.peak_bytes / MiB:,.0f} MiB per rank"
        if h.memory_ratio is not None and h.changes:
            memory += f", {h.memory_ratio:.2f}x the baseline's"
        out.append(memory)
    if h.tied:
        which = f"trial {h.tied[0]}" if len(h.tied) == 1 else f"trials {', '.join(map(str, h.tied))}"
        out.append(f"as fast within noise: {which} (this machine's run-to-run noise is larger than their difference)")
    return out


def text(h: Headline) -> str:
    """The headline as the agent prints it, each line within ``WIDTH`` columns but the commands' long words."""

    def wrap(line: str, indent: str) -> str:
        return textwrap.fill(
            line, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ", break_long_words=False
        )

    lines = [wrap(title(h), ""), *(wrap(fact, "  ") for fact in facts(h))]
    if h.kind == "none":
        return lines[0]
    lines.append("  reproduce:")
    lines += ["    " + line for line in command_lines(h.reproduce, WIDTH - 4)]
    if h.exports:
        lines.append("  export:")
        lines += ["    " + e for e in h.exports]
    return "\n".join(lines)
