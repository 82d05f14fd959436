"""Search spaces: what a study may vary, under which constraints, toward which objective.

A space is a YAML file in ``search_spaces/`` (schema below; also in ``search_spaces/README.md``). It is data,
never code: constraints go through the safe evaluator in ``autoresearch.expr``. ``load_space`` reads it
(``autoresearch.space_file``: one pydantic model of the whole file) and, for a space of the training core,
checks every key and value against the core's own config before any trial runs (``autoresearch.space_core``).

```yaml
name: hparams                       # [A-Za-z0-9_.-]+; default: the file's stem. Default study name.
description: free text for people and the LLM proposer
trial_command: core.train           # default; "other": trials run another --command (keys not checked)
objective: {metric: val_loss, direction: minimize}   # metric: a key of trial_summary.json "metrics"
world_size: 1                       # ranks available to a trial (a name constraints may use); default 1
fixed:                              # Hydra overrides applied to every trial, key -> scalar
  model: tiny
  trial.max_steps: 30
params:                             # what varies; each is choice | int | float
  optim.lr: {type: float, low: 1.0e-4, high: 3.0e-2, log: true, nan: up, memory: none}
  optim: {type: choice, values: [adamw, muon]}
  training.micro_batch_size: {type: int, low: 2, high: 8, step: 2, memory: up}
  memory.recompute: {type: choice, values: [full, none], memory: up}
constraints:                        # each must hold; names: params, fixed keys and world_size
  - "training.global_batch_size % training.micro_batch_size == 0"
budget: {trials: 12, hours: 0.5, dollars: 1.0}     # defaults for the agent; each optional
```

Param keys: ``type`` (required); ``values`` (choice: a non-empty list of distinct scalars); ``low``/``high``
(int/float, inclusive, ``low < high``); ``step`` (int: default 1; float: optional grid); ``log`` (log scale,
needs ``low > 0``; not with a float ``step`` or an int ``step`` other than 1); ``description`` (free text).

Feasibility annotations (``autoresearch.learn``): ``memory`` and ``nan`` take ``up`` | ``down`` | ``none``.
``up``: a larger value (for a choice: a later value in ``values``) needs at least as much memory / is at least
as likely to diverge; ``down``: the reverse; ``none``: does not matter. Absent means "unknown": two configs are
comparable only when that param is equal — the conservative default.

Numbers like ``1e-4`` are read as floats (YAML 1.2), not strings as PyYAML would by default.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from autoresearch.expr import ExprError
from autoresearch.param import ANNOTATIONS, PARAM_TYPES, Param, ParamError, format_override_value, scalar_text
from autoresearch.space_core import check_against_core
from autoresearch.space_file import (CORE_COMMAND, OBJECTIVE_METRICS, SPACES_DIR, Lines, SpaceDoc, SpaceError,
                                     read_space_file, resolve_space_path, validate_doc)

__all__ = ["SpaceError", "Param", "ParamError", "SearchSpace", "load_space", "SPACES_DIR", "OBJECTIVE_METRICS",
           "ANNOTATIONS", "PARAM_TYPES", "format_override_value", "CORE_COMMAND"]


# ---------------------------------------------------------------------------------------------- SearchSpace

@dataclass
class SearchSpace:
    """A loaded space. Build it with ``load_space``; direct construction is checked by the same model
    (``autoresearch.space_file.SpaceDoc``)."""

    name: str
    description: str
    objective_metric: str
    direction: str                 # minimize | maximize
    world_size: int
    fixed: dict                    # Hydra key -> scalar, applied to every trial
    params: dict                   # name -> Param, in file order
    constraints: list              # constraint texts, in file order
    budget_trials: Optional[int] = None
    budget_hours: Optional[float] = None     # None: no time budget
    budget_dollars: Optional[float] = None   # None: no LLM spending limit
    path: Optional[str] = None
    trial_command: str = CORE_COMMAND        # core.train | other (autoresearch.space_file.TRIAL_COMMANDS)
    lines: Optional[Lines] = field(default=None, repr=False, compare=False)  # key -> line in the file
    _exprs: list = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self):
        for name, param in self.params.items():
            if not isinstance(param, Param) or param.name != name:
                raise self.error(f"params.{name}", "must be a Param with the same name")
        doc = validate_doc(self.as_doc(), self.file, self.lines)
        self._exprs = doc.exprs

    @property
    def exprs(self) -> list:
        """The parsed constraints (``autoresearch.expr.Expr``), in order."""
        return list(self._exprs)

    @property
    def file(self) -> str:
        return self.path or f"<space {self.name}>"

    def error(self, key: str, reason: str) -> SpaceError:
        """A SpaceError at ``key``, with its line when the space came from a file."""
        return SpaceError(self.file, key, reason, self.lines.of(key) if self.lines else None)

    def as_doc(self) -> dict:
        """This space as the data of a space file (what ``SpaceDoc`` validates)."""
        budget = {"trials": self.budget_trials, "hours": self.budget_hours, "dollars": self.budget_dollars}
        return {"name": self.name, "description": self.description, "trial_command": self.trial_command,
                "objective": {"metric": self.objective_metric, "direction": self.direction},
                "world_size": self.world_size, "fixed": self.fixed,
                "params": {name: p.spec() for name, p in self.params.items()}, "constraints": self.constraints,
                "budget": {k: v for k, v in budget.items() if v is not None}}

    @classmethod
    def from_doc(cls, doc: SpaceDoc, path: Optional[Path] = None, lines: Optional[Lines] = None) -> "SearchSpace":
        return cls(name=doc.name, description=doc.description, objective_metric=doc.objective.metric,
                   direction=doc.objective.direction, world_size=doc.world_size, fixed=dict(doc.fixed),
                   params={name: Param.from_spec(name, spec) for name, spec in doc.params.items()},
                   constraints=list(doc.constraints), budget_trials=doc.budget.trials,
                   budget_hours=doc.budget.hours, budget_dollars=doc.budget.dollars,
                   path=str(path) if path is not None else None, trial_command=doc.trial_command, lines=lines)

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"

    def env(self, params: dict) -> dict:
        """The names constraints see: world_size, the fixed values and ``params``."""
        return {"world_size": self.world_size, **self.fixed, **params}

    def distributions(self) -> dict:
        return {name: p.distribution() for name, p in self.params.items()}

    def coerce(self, params: dict) -> dict:
        """A copy of ``params`` with each known param converted to its type; unknown keys pass through for
        ``check`` to report. Raises ValueError naming the param and what is wrong."""
        if not isinstance(params, dict):
            raise ValueError(f"a proposal must be a mapping of param -> value, got {type(params).__name__}")
        return {k: (self.params[k].coerce(v) if k in self.params else v) for k, v in params.items()}

    def check(self, params: dict) -> list[str]:
        """Every reason ``params`` cannot run (empty when it can): missing or unknown keys, values out of
        range, off the step grid, not among the choices or of the wrong type, constraints violated."""
        if not isinstance(params, dict):
            return [f"a proposal must be a mapping of param -> value, got {type(params).__name__}"]
        reasons = [f"missing param {k}" for k in self.params if k not in params]
        reasons += [f"unknown param {k} (the space has: {', '.join(self.params)})" for k in params
                    if k not in self.params]
        reasons += [r for k, v in params.items() if k in self.params and (r := self.params[k].problem(v))]
        if reasons:
            return reasons          # constraints over broken values would only repeat the same news
        env = self.env(params)
        for expr in self._exprs:
            try:
                if not expr.evaluate(env):
                    values = ", ".join(f"{n}={scalar_text(env[n])}" for n in sorted(expr.names))
                    reasons.append(f"constraint violated: {expr.text} (with {values})")
            except ExprError as exc:
                reasons.append(f"constraint {expr.text} cannot be evaluated: {exc}")
        return reasons

    def constraint_values(self, params: dict) -> list[float]:
        """One value per constraint for Optuna's ``constraints_func``: 0.0 when it holds, else a positive
        violation (``|lhs - rhs|`` for one numeric comparison, else 1.0; 1.0 when it cannot be evaluated)."""
        env = self.env(params)
        values = []
        for expr in self._exprs:
            try:
                values.append(expr.violation(env))
            except ExprError:
                values.append(1.0)
        return values

    def satisfies(self, params: dict) -> bool:
        return all(v <= 0 for v in self.constraint_values(params))

    def overrides(self, params: dict) -> list[str]:
        """Hydra overrides ``key=value``: the fixed ones, then every param in the space's order."""
        missing = [k for k in self.params if k not in params]
        unknown = [k for k in params if k not in self.params]
        if missing or unknown:
            raise ValueError(f"overrides need exactly the space's params (missing: {missing}, unknown: {unknown})")
        pairs = list(self.fixed.items()) + [(k, params[k]) for k in self.params]
        return [f"{k}={format_override_value(v)}" for k, v in pairs]

    def json_schema(self) -> dict:
        """Input schema for an LLM tool that proposes one trial: every param plus a ``rationale``."""
        properties = {name: p.json_schema() for name, p in self.params.items()}
        properties["rationale"] = {"type": "string",
                                   "description": "One or two sentences: why this config is worth a trial now, "
                                                  "given the results so far."}
        description = self.description.strip()
        if self.constraints:
            description += (" " if description else "") + "Constraints (all must hold): " + "; ".join(self.constraints)
        return {"type": "object", "description": description, "properties": properties,
                "required": [*self.params, "rationale"], "additionalProperties": False}

    def grid(self, points_per_float: int = 4, max_points_per_int: int = 16) -> list[dict]:
        """Every combination of each param's grid values (``Param.grid_values``) that satisfies the
        constraints, in a deterministic order (first param varies slowest)."""
        names = list(self.params)
        axes = [self.params[n].grid_values(points_per_float, max_points_per_int) for n in names]
        points = (dict(zip(names, combo)) for combo in itertools.product(*axes))
        return [p for p in points if self.satisfies(p)]

    def sample_random(self, rng: np.random.Generator, max_tries: int = 10_000) -> dict:
        """A uniformly random (log-uniform where log) valid point, by rejection against the constraints."""
        for _ in range(max_tries):
            point = {name: p.sample(rng) for name, p in self.params.items()}
            if self.satisfies(point):
                return point
        raise ValueError(f"space {self.name}: no point satisfied the constraints in {max_tries} random tries; "
                         "they may be unsatisfiable")

    def describe(self) -> str:
        """A compact description for people and for the LLM's prompt."""
        goal = f"{self.direction} {self.objective_metric}"
        lines = [f"space {self.name}: {self.description.strip()}" if self.description.strip() else
                 f"space {self.name}", f"objective: {goal}; world_size: {self.world_size}"]
        if self.fixed:
            lines.append("fixed: " + ", ".join(f"{k}={scalar_text(v)}" for k, v in self.fixed.items()))
        lines.append("params:")
        lines += [f"  {name}: {p.describe()}" for name, p in self.params.items()]
        if self.constraints:
            lines.append("constraints:")
            lines += [f"  - {c}" for c in self.constraints]
        budget = [f"{self.budget_trials} trials" if self.budget_trials else "",
                  f"{self.budget_hours:g} h" if self.budget_hours else "",
                  f"${self.budget_dollars:.2f} LLM" if self.budget_dollars is not None else ""]
        if any(budget):
            lines.append("budget: " + ", ".join(b for b in budget if b))
        return "\n".join(lines)


def load_space(name_or_path: str | Path) -> SearchSpace:
    """Load and validate a space file: ``name_or_path`` as given, else relative to the working directory,
    else in ``search_spaces/`` (``.yaml`` added when missing). A space of the training core (``trial_command:
    core.train``, the default) is also checked against the core's config: every key, type, group option and
    value the core refuses whatever the other params are. Raises SpaceError(file, key, reason, line)."""
    path = resolve_space_path(name_or_path)
    doc, lines = read_space_file(path)
    space = SearchSpace.from_doc(doc, path, lines)
    if space.trial_command == CORE_COMMAND:
        check_against_core(space)
    return space
