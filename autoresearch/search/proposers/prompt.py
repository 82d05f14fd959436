"""What Claude is told: the system prompt and the per-trial user message.

Kept apart from the API plumbing in `claude.py` so that the wording can be read (and tested) on its own. Everything
here is plain text built from data the agent already has: the search space, the objective and the table of trials
so far. Nothing the model answers is ever executed; its answer is a tool call whose input is validated as data.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from typing import Any

from autoresearch.records import DIVERGENCE_RATIO, Status, TrialRow, config_key, is_number, plan_errors
from core.trial.contract import Exit

TOOL_NAME = "propose_trial"

# The core's exit codes (core.trial.contract). The model learns most from failures, so each code says what it
# implies for the next proposal.
MEANINGS = {
    Exit.OK: "finished its budget; the objective is valid",
    Exit.ERROR: "crashed for an unexpected reason; see the reason column, usually not a property of the config",
    Exit.INVALID: "configuration rejected before running (no compute spent); the reason names the field",
    Exit.OOM: "ran out of memory; anything needing at least as much memory on the same layout will OOM too",
    Exit.COMPILE_ERROR: "graph compilation or kernel selection failed for this combination",
    Exit.NAN: "loss or grad norm became NaN/Inf; typically the learning rate is too high for this setup",
    Exit.TIMEOUT: "the wall-clock budget ended before the step budget; this config is too slow",
}
EXIT_CODES: dict[int, tuple[str, str]] = {int(code): (code.status, MEANINGS[code]) for code in Exit}

SYSTEM_PROMPT = """\
You are the proposer in an automated study that tunes training configurations of a GPT model trained with \
MindSpore. Each trial runs one configuration for a bounded budget and reports an objective, its peak memory and \
an exit code. Your job: choose the single next configuration most likely to improve the objective, using what \
the earlier trials showed.

Answer only by calling the tool `{tool}` once. Its input must be a configuration inside the search space (every \
parameter, allowed values only, constraints satisfied) plus a short rationale. Proposals are validated; an invalid \
one is returned to you with the reason, and you should then propose a corrected configuration.

Exit codes and what they mean:
{codes}
A trial with status "{pruned}" was skipped without running because it was a duplicate or dominated by an earlier \
failure; its reason says which.

Guidance:
- Never repeat a configuration that already ran or was pruned.
- Avoid configurations dominated by an OOM: on the same layout, a larger micro-batch, less recomputation or no \
offload needs at least as much memory and will fail again. Compare measured peak memory with the predicted \
memory to judge how much headroom a layout has.
- Avoid configurations dominated by a NaN: a learning rate at or above one that diverged, with the same optimizer \
and batch, will diverge again. A run that ended ok but whose loss rose above {ratio:g}x its first value diverged \
too (its objective is poor and pruned proposals cite it as "divergence").
- A parameter marked "(memory: up)" needs at least as much memory at larger values (later values of a choice); \
"(nan: up)" is at least as likely to diverge at larger values; "down" means the reverse.
- Balance exploiting the best region with exploring parameters the table has not covered yet.
"""


def exit_code_lines() -> str:
    return "\n".join(f"- {code} ({status}): {meaning}" for code, (status, meaning) in EXIT_CODES.items())


def system_prompt() -> str:
    return SYSTEM_PROMPT.format(
        tool=TOOL_NAME, codes=exit_code_lines(), ratio=DIVERGENCE_RATIO, pruned=Status.PRUNED.value
    )


def _mib(value: Any) -> str:
    # Bytes are unreadable at a glance and cost tokens; MiB with no decimals is precise enough to compare layouts.
    if value is None:
        return "-"
    try:
        return f"{float(value) / 2**20:.0f}"
    except (TypeError, ValueError):
        return "-"


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def _cell(text: str, limit: int) -> str:
    # A markdown table breaks on pipes and newlines; long tracebacks only cost tokens.
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _select_rows(table: list[TrialRow], max_rows: int, direction: str) -> tuple[list[TrialRow], int]:
    """The most recent `max_rows` rows, plus the best finished row if it is older: bounds the prompt's size."""
    if len(table) <= max_rows:
        return list(table), 0
    recent = table[-max_rows:]
    best = best_row(table, direction)
    if best is not None and best not in recent:
        recent = [best] + recent
    return recent, len(table) - len(recent)


def trial_table(
    table: list[TrialRow], direction: str = "minimize", max_rows: int = 200, reason_chars: int = 160
) -> str:
    """The trials so far as a markdown table, one row per trial, oldest first."""
    if not table:
        return "(no trials yet: this is the first one)"
    rows, omitted = _select_rows(table, max_rows, direction)
    lines = [
        "| # | params | status | exit | objective | peak MiB | predicted MiB | reason |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        params = json.dumps(r.params or {}, sort_keys=True, separators=(",", ":"), default=str)
        lines.append(
            "| {n} | {p} | {s} | {e} | {o} | {pk} | {pr} | {why} |".format(
                n=_number(r.number),
                p=_cell(params, 400),
                s=_cell(r.status or "-", 20),
                e=_number(r.exit_code),
                o=_number(r.objective),
                pk=_mib(r.peak_memory_bytes),
                pr=_mib(r.predicted_memory_bytes),
                why=_cell(r.reason or "", reason_chars) or "-",
            )
        )
    if omitted:
        lines.append(f"({omitted} older trials omitted; they are in the study and duplicates of them are rejected)")
    return "\n".join(lines)


def best_row(table: list[TrialRow], direction: str) -> TrialRow | None:
    scored = [r for r in table if r.status == Status.OK and is_number(r.objective)]
    if not scored:
        return None
    pick = max if direction == "maximize" else min
    return pick(scored, key=lambda r: r.objective)


def plan_section(prior: Any, space: Any, table: list[TrialRow], top: int = 10, limit: int = 4096) -> str:
    """``--plan``: the step-time model's best predicted configs not run yet (of the space's grid, or of a fixed
    sample of ``limit`` points of a larger one), refitted to the runs, with its factors and its error so far."""
    prior.refit(table)
    grid = prior.grid
    if len(grid) > limit:
        grid = [grid[i] for i in sorted(random.Random(0).sample(range(len(grid)), limit))]
    ran = {config_key(r.params) for r in table if r.params}
    scored = [(v, p) for p in grid if config_key(p) not in ran and (v := prior.predict(p)) is not None]
    scored.sort(key=lambda vp: -vp[0] if space.maximize else vp[0])
    metric = space.objective_metric
    lines = [f"| params | predicted {metric} |", "|---|---|"]
    for value, params in scored[:top]:
        lines.append(
            f"| {_cell(json.dumps(params, sort_keys=True, separators=(',', ':'), default=str), 400)} | {value:.4g} |"
        )
    errors = plan_errors(table)
    accuracy = (
        f"Its predictions before each run were off by {100 * statistics.median(errors):.0f}% at the median "
        f"over {len(errors)} runs."
        if errors
        else "No run has checked it yet."
    )
    unpriced = (
        f" It does not price {', '.join(sorted(prior.unpriced))}: their effect is for the runs to show."
        if prior.unpriced
        else ""
    )
    return (
        f"A step-time model of the hardware (python -m core.perf) predicts {metric} for every config before it runs; "
        f"it is refitted to the runs (factors on its profile: {prior.factors_text()}). {accuracy}{unpriced} Its best predicted "
        f"configs not run yet:\n" + "\n".join(lines)
    )


def user_prompt(space: Any, table: list[TrialRow], plan: str = "") -> str:
    """The request for one trial: the space, the objective, everything measured so far, and the plan's best
    predictions when there is one (``plan_section``)."""
    direction = getattr(space, "direction", "minimize")
    metric = getattr(space, "objective_metric", "objective")
    goal = "lower is better" if direction == "minimize" else "higher is better"
    best = best_row(table, direction)
    best_text = (
        f"Best so far: trial {best.number} with {metric} = {_number(best.objective)}."
        if best
        else "No trial has finished with an objective yet."
    )
    return "\n\n".join(
        [
            f"# Search space\n{space.describe()}",
            f"# Objective\n{direction} `{metric}` ({goal}). {best_text}",
            f"# Trials so far ({len(table)})\n{trial_table(table, direction)}",
            *([f"# The plan\n{plan}"] if plan else []),
            f"Propose the next trial by calling `{TOOL_NAME}`.",
        ]
    )


def invalid_feedback(error: str, attempt: int, max_attempts: int) -> str:
    """What the model is told when its proposal was rejected: the exact reason, and that it must try again."""
    left = max_attempts - attempt
    return (
        f"Rejected: {error}\n"
        f"Propose a different configuration that is inside the search space, satisfies the constraints and is not "
        f"a duplicate of (or dominated by) an earlier trial. {left} attempt(s) left."
    )
