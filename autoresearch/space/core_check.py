"""A space of the training core checked against the core's own config before any trial runs.

Without this, a space with a misspelt key, a group option that does not exist or a negative batch loads fine,
and then every trial it proposes exits 2 (invalid config) one by one. ``check_against_core`` refuses such a
space at load, with the file, the key, the line and the fix (``SpaceError``; the agent exits 2).

What is checked, each value on its own (a space's values are combined by the proposer, so a value is refused
only if the core refuses it *whatever the other params are*; a clash that only some combinations have is the
trial's business, or a constraint's):

1. keys: every fixed and searched key is a field of ``core.config.TrainConfig`` (``training.micro_batch_size``,
   ``seed``) or a config group (``model``, ``optim``: a file under ``configs/<group>/``);
2. types: every fixed value, choice and bound has the field's type (strictly: ``2.5`` is not an int, ``1`` is
   not ``true``, ``"4"`` is not a number), and a group's value names one of its files;
3. rules: each choice and each bound of a param must pass the core's field and group checks (``load_config``'s
   dataclass rules) in at least one config of the space that has it: fixed values + that value + the other
   params at values the space's constraints allow. Configs come from a randomized depth-first search that
   prunes on the constraints; when the core refuses one, the next changes a param the core's message names
   (a local search that the core's own messages guide). Up to ``TRIES`` are composed per value, and each
   config that passes clears every value in it, so a space that is fine costs a handful of compositions. A
   value no allowed config contains is not the core's concern (nothing would run it). The search leans to
   accepting: a value is refused only when every config tried fails.

Composing is the core's own (``autoresearch.core_adapter.config_error``): the space's values set into the tree
Hydra composed for their group choices, every rule of ``core.config`` run on it.

Only spaces whose ``trial_command`` is ``core.train`` (the default) are checked: a space for another trial
command (``trial_command: other``, e.g. ``tests/fake_trial.py``'s ``fake.*`` keys) has keys the core does not
know. ``check_trial_command`` keeps the agent from running such a space with the core's own command.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin

import numpy as np
from pydantic import TypeAdapter, ValidationError

from autoresearch.core_adapter import DEFAULT_COMMAND, composed, config_error, core_schema, hf_model_problem
from autoresearch.space.expr import ExprError
from autoresearch.space.schema import kind
from core.config import scalar_text

if TYPE_CHECKING:
    from autoresearch.space.space import SearchSpace

CORE_COMMAND = "core.train"  # the trial_command of a space these checks apply to (autoresearch.space.space)
TRIES = 48  # configs composed for a value before it is refused (a value that passes needs one or two)
_NODE_BUDGET = 20_000  # assignments one depth-first search may try before it gives up on a value
_GRID_FLOATS = 3  # points of a float range the search combines (its bounds and middle)
_CMD_HINT = " (A space for another trial command, the agent's --command, says trial_command: other.)"


def key_problem(key: str) -> str | None:
    """Why ``key`` is not a key of the core's config (with the closest keys), or None."""
    schema = core_schema()
    if key in schema.groups or key in schema.fields:
        return None
    close = difflib.get_close_matches(key, [*schema.fields, *schema.groups], n=3, cutoff=0.75)
    if close:
        hint = f"did you mean {' or '.join(close)}?"
    else:
        sections = sorted({k.split(".")[0] for k in schema.fields if "." in k})
        choices = sorted(g for g, options in schema.groups.items() if len(options) > 1)
        hint = (
            f"keys are <section>.<field> (sections: {', '.join(sections)}) or a config group with options "
            f"({', '.join(choices)})"
        )
    return f"{key!r} is not a key of core.train's config (core/config/schema.py): {hint}{_CMD_HINT}"


def value_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be ``key``'s whatever the rest of the config is (its type, or a group option), or None."""
    schema = core_schema()
    if key == "model" and isinstance(value, str) and value.startswith("hf:"):
        return hf_model_problem(value)  # a Hugging Face config in place of a preset
    if key in schema.groups:
        options = schema.groups[key]
        if isinstance(value, str) and value in options:
            return None
        return (
            f"{scalar_text(value)} is not an option of the config group {key}; choose one of "
            f"{', '.join(options)} (the files in configs/{key}/)"
        )
    annotation = schema.fields[key]
    try:
        _adapter(annotation).validate_python(value, strict=True)
    except ValidationError:
        return f"must be {_type_text(annotation)}, the type of core.config's {key} (got {kind(value)})"
    return None


@functools.cache
def _adapter(annotation: Any) -> TypeAdapter:
    return TypeAdapter(annotation)


def _type_text(annotation: Any) -> str:
    if get_origin(annotation) in (Union, UnionType) and NoneType in get_args(annotation):
        inner = [a for a in get_args(annotation) if a is not NoneType]
        return f"{_type_text(inner[0])} or null"
    if get_origin(annotation) is list:  # a fixed value only: a choice is a scalar (autoresearch.space.params)
        return "a list of " + {int: "integers", str: "strings"}.get(get_args(annotation)[0], str(annotation))
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        annotation, str(annotation)
    )


# ---------------------------------------------------------------------------------------------- the search


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


class _Search:
    """For one value of one param, a config of the space that the core accepts: configs that satisfy the
    constraints come from a depth-first search (values in a random order, each constraint tested as soon as its
    last param is set); when the core refuses one, the next changes a param its message names (``training.mode``
    in "memory.swap: needs training.mode=pynative"), keeping the rest where the constraints allow."""

    def __init__(self, space: SearchSpace, rng: np.random.Generator):
        self.space, self.rng = space, rng
        self.domains = {n: p.grid_values(points_per_float=_GRID_FLOATS) for n, p in space.params.items()}
        self.defaults = _defaults(space)

    def passing_config(self, name: str, value: Any) -> tuple[dict | None, list]:
        """A config with ``name=value`` that the core accepts, or None and the core's errors for the configs tried
        (none when the constraints allow no config with this value).

        The first config keeps the other params at the core's defaults where the space and its constraints allow
        (one process, no pipeline, no recompute: the config most likely to be valid). From a config the core
        refuses, the walk goes on as a person fixing it would: it tries the configs that change one other param
        (those the core's message names first), and moves to the first that passes, or that the core refuses
        for another reason which does not name the param just changed (the old rule holds there, and the change
        broke no new one); when no change gets anywhere, it starts afresh from a random config."""
        self.tried: list[dict] = []
        self.errors: list = []
        current = self.complete({name: value}, self.defaults)
        while current is not None and len(self.errors) < TRIES:
            error = self._verdict(current)
            if error is None:
                return current, self.errors
            current = self._next(name, value, current, str(error))
        return None, self.errors

    def _verdict(self, config: dict):
        """The core's error for ``config`` (None: it passes), recorded once however often it is asked."""
        error = config_error({**self.space.fixed, **config})
        if config not in self.tried:
            self.tried.append(config)
            if error is not None:
                self.errors.append(error)
        return error

    def _next(self, name: str, value: Any, config: dict, message: str) -> dict | None:
        for changed, candidate in self._neighbours(name, value, config, message):
            if len(self.errors) >= TRIES:
                return None
            other = self._verdict(candidate)
            if other is None or (str(other) != message and not _mentions(str(other), changed)):
                return candidate
        for _ in range(TRIES):
            candidate = self.complete({name: value}, prefer={})
            if candidate is None or candidate not in self.tried:
                return candidate
        return None

    def _neighbours(self, name: str, value: Any, config: dict, message: str):
        """(param, config) for the untried configs that change one param of ``config`` other than ``name`` (the
        params ``message`` names first); the constraints may make a change of one param change others too."""
        others = self._shuffled([n for n in config if n != name])
        others.sort(key=lambda n: not _mentions(message, n))  # stable: the named ones first, in a random order
        for param in others:
            for other in self._shuffled(self.domains[param]):
                if _same(other, config[param]):
                    continue
                candidate = self.complete({name: value, param: other}, prefer=config)
                if candidate is not None and candidate not in self.tried:
                    yield param, candidate

    def _shuffled(self, values: list) -> list:
        return [values[int(i)] for i in self.rng.permutation(len(values))]

    def complete(self, pinned: dict, prefer: dict) -> dict | None:
        """A config with the ``pinned`` values that satisfies the constraints, keeping ``prefer``'s values where
        it can; None when there is none (or the search ran out of its budget)."""
        order = [*pinned, *(n for n in self.space.params if n not in pinned)]
        domains = {}
        for n in order:
            values = [pinned[n]] if n in pinned else self._shuffled(self.domains[n])
            if n in prefer:
                values.sort(key=lambda v, want=prefer[n]: not _same(v, want))  # stable: the preferred first
            domains[n] = values
        depth = {n: i for i, n in enumerate(order)}
        checks: list[list] = [[] for _ in order]
        for expr in self.space.exprs:
            checks[max((depth[n] for n in expr.names if n in depth), default=0)].append(expr)
        self.nodes = 0
        found = self._descend(order, domains, checks, 0, dict(self.space.env({})))
        return {n: found[n] for n in self.space.params} if found else None  # in the space's order

    def _descend(self, order, domains, checks, d, env):
        """A config completing ``env`` from depth ``d``; None if none exists, False if the budget ran out."""
        if d == len(order):
            return {n: env[n] for n in order}
        name = order[d]
        exhausted = True
        for value in domains[name]:
            self.nodes += 1
            if self.nodes > _NODE_BUDGET:
                return False
            env[name] = value
            if all(_holds(e, env) for e in checks[d]):
                found = self._descend(order, domains, checks, d + 1, env)
                if found:
                    return found
                exhausted = exhausted and found is None
        del env[name]
        return None if exhausted else False


def _defaults(space: SearchSpace) -> dict:
    """The core's default value of each param of ``space`` (with the space's fixed group choices), where the
    param's own values include it."""
    schema = core_schema()
    tree = composed(tuple(sorted((k, v) for k, v in space.fixed.items() if k in schema.groups)))
    defaults = {}
    for name in space.params:
        head, _, rest = name.partition(".")
        node = tree.get(head) if rest else tree
        if name not in schema.groups and isinstance(node, dict) and (rest or head) in node:
            defaults[name] = node[rest or head]
    return defaults


def _mentions(message: str, key: str) -> bool:
    """Whether the core's message names ``key``, in full or by its last part ("micro_batch_size * data-parallel
    degree"); ``parallel.pp`` is not named by "parallel.pp_virtual"."""
    field = key.rsplit(".", 1)[-1]
    return re.search(rf"(?<!\w){re.escape(field)}(?!\w)", message) is not None


def _holds(expr, env: dict) -> bool:
    try:
        return bool(expr.evaluate(env))
    except ExprError:
        return False  # as SearchSpace.satisfies: a constraint that cannot be evaluated does not hold


def check_against_core(space: SearchSpace) -> None:
    """Raise SpaceError at the first key or value of ``space`` that ``core.train`` refuses (see the module
    docstring for what "refuses" means); return quietly when there is none."""
    for key, value in space.fixed.items():
        problem = key_problem(key) or value_problem(key, value)
        if problem:
            raise space.error(f"fixed.{key}", problem)
    for name, param in space.params.items():
        if problem := key_problem(name):
            raise space.error(f"params.{name}", problem)
        for where, value in param.extremes():
            if problem := value_problem(name, value):
                raise space.error(f"params.{name}.{where}", problem)
    _check_rules(space)


@dataclass
class _Refusal:
    """A value of a param that no config tried let through, and the core's errors for those configs."""

    name: str
    where: str  # values[i] | low | high
    value: Any
    errors: list

    @property
    def error(self):
        """The refusal the configs tried agree on most: the rule no change of the other params got past (the first
        config's error may be a rule its default values break, which others fixed)."""
        texts = [str(e) for e in self.errors]
        return self.errors[max(range(len(texts)), key=lambda i: (texts.count(texts[i]), -i))]


def _search_values(space: SearchSpace) -> tuple[list[dict], list[_Refusal]]:
    """The configs that passed, and the values no config tried let through, in file order. Stops at the first
    value refused for its own sake (the core's message is about its param) once some config has passed: that is
    the one to report."""
    search = _Search(space, np.random.default_rng(0))
    passed: list[dict] = []
    refused: list[_Refusal] = []
    for name, param in space.params.items():
        for where, value in param.extremes():
            if any(_same(p[name], value) for p in passed):
                continue
            config, errors = search.passing_config(name, value)
            if config is not None:
                passed.append(config)
            elif errors:
                refused.append(_Refusal(name, where, value, errors))
                if passed and refused[-1].error.field == name:
                    return passed, refused
    return passed, refused


def _check_rules(space: SearchSpace) -> None:
    passed, refused = _search_values(space)
    if not refused:
        return
    if not passed and (error := config_error(space.fixed)) is not None:
        raise space.error(
            f"fixed.{error.field}" if error.field in space.fixed else "fixed",
            f"core.train refuses the fixed values whatever the params are: {error}",
        )
    # When one param has no value the core accepts, every config fails and every value of the others is refused
    # too: blame a value the core's message is about.
    r = next((r for r in refused if r.error.field == r.name), refused[0])
    fix = f"remove {scalar_text(r.value)} from values" if r.where.startswith("values") else f"choose another {r.where}"
    raise space.error(
        f"params.{r.name}.{r.where}",
        f"{r.name}={scalar_text(r.value)} is refused by core.train's config whatever the other params are "
        f"(in each of the {len(r.errors)} configs tried that the constraints allow): {r.error}; {fix}",
    )


def check_trial_command(space: SearchSpace, command: Sequence[str]) -> None:
    """The agent's default command runs ``core.train``: a space that says its keys are another command's
    (``trial_command: other``) was not checked against the core, and its trials would exit 2."""
    if tuple(command) == DEFAULT_COMMAND and space.trial_command != CORE_COMMAND:
        raise space.error(
            "trial_command",
            f"is {space.trial_command}, but the agent runs its trials with "
            "python -m core.train; pass the space's trial command with --command, "
            "or set trial_command: core.train to check the space against the core",
        )
