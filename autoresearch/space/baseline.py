"""A space's baseline: the config a study runs first and states every later result against.

A user who asks "which layout is fastest?" is really asking "how much faster than what I run now?". Karpathy's
autoresearch runs the baseline first and reports each change against it; PROMPTS and OptiCo report their gain over
the engineers' starting configuration. So a study here does the same: its first trial is the baseline, and every
result after it carries its ratio to the baseline (``records.gain``: the speed-up for a throughput, its inverse for
a time or a loss; the memory ratio beside it).

Which config that is:

- a space of the training core: the trial its fixed settings alone run, i.e. every parallel degree 1 and every
  other param at the core's default (a null default resolved as the core resolves it: ``training.micro_batch_size``
  null is the whole batch), with any value the file's ``baseline:`` names on top. Where the param does not offer
  the core's default, its nearest value stands in (on a log scale for positive numbers; a choice of names: its first
  value), and the agent says so (``substituted``): the whole batch of 32 where the space offers micro-batches 1 to
  4 is 4. A baseline that breaks the space's constraints (``cluster.nodes`` 8 where every layout must use all the
  nodes' devices) is an error naming the fix: name its values in ``baseline:``. The cluster spaces name the layout
  published for their model.
- a space of another trial command (``trial_command: other``): what ``baseline:`` names, every param; without it
  the study has no baseline, and says so once.

The baseline must be a point of the space (its values among the params' and every constraint holding). It is
formed when a study needs it (``SearchSpace.baseline_point``): planning a space asks nothing of it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from autoresearch.core_adapter import default_point

if TYPE_CHECKING:
    from autoresearch.space.space import SearchSpace

CORE_COMMAND = "core.train"  # (autoresearch.space.space's; not imported: it imports this module)


def resolve_baseline(space: SearchSpace) -> tuple[dict[str, Any] | None, dict[str, tuple[Any, Any]]]:
    """The baseline point of ``space`` (every param, in the space's order), or None for a space of another trial
    command that names none; and the params whose core default the space does not offer, each with (that default,
    the value standing in). Raises SpaceError at ``baseline`` (or ``baseline.<param>``) when it cannot be formed or
    is not a point of the space."""
    named = dict(space.baseline)
    substituted: dict[str, tuple[Any, Any]] = {}
    if space.trial_command != CORE_COMMAND:
        if not named:
            return None, substituted
        missing = [k for k in space.params if k not in named]
        if missing:
            raise space.error(
                "baseline",
                f"names no value for {', '.join(missing)}; a space of another trial command (trial_command: "
                "other) names every param's baseline value",
            )
        defaults = {}
    else:
        defaults = default_point(space.fixed, [k for k in space.params if k not in named])
    point = {}
    for name, param in space.params.items():
        value = named[name] if name in named else defaults.get(name)
        if (problem := param.problem(value)) is not None:
            if name in named:
                raise space.error(f"baseline.{name}", problem)
            substituted[name] = (value, nearest(param, value))
            value = substituted[name][1]
        point[name] = value
    point = space.coerce(point)
    problems = space.check(point)
    if problems:
        chosen = ", ".join(f"{k}={v!r} for the core's {d!r}" for k, (d, v) in substituted.items())
        raise space.error(
            "baseline",
            f"the baseline is not a point of the space: {problems[0]}"
            + (f" (with the nearest values the space offers: {chosen})" if chosen else "")
            + "; name values that satisfy it in `baseline:`",
        )
    return point, substituted


def nearest(param, value: Any) -> Any:
    """The param's grid value nearest ``value``: by ratio for positive numbers, by difference for other numbers;
    a param's first value where ``value`` is not a number (or the param offers none)."""
    options = param.grid_values()
    numbers = [v for v in options if _number(v)]
    if not _number(value) or not numbers:
        return options[0]
    if value > 0 and all(v > 0 for v in numbers):
        return min(numbers, key=lambda v: (abs(math.log(v / value)), -v))
    return min(numbers, key=lambda v: (abs(v - value), -v))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
