"""A search space: what a study may vary, under which constraints, toward which objective. ``SearchSpace`` is the
one model of a space file (pydantic, strict: no unknown keys, no silent conversions) and the object the agent
works with; ``autoresearch.space.file.load_space`` reads one from YAML.

```yaml
name: hparams                       # [A-Za-z0-9_.-]+; default: the file's stem. Default study name.
description: free text for people and the LLM proposer
trial_command: core.train           # default; "other": trials run another --command (keys not checked)
objective: {metric: val_loss, direction: minimize}   # metric: a key of trial_summary.json "metrics"
world_size: 1                       # ranks available to a trial (a name constraints may use); default 1
fixed:                              # Hydra overrides applied to every trial, key -> scalar or list of scalars
  model: tiny
  trial.max_steps: 30
params:                             # what varies; each is choice | int | float (autoresearch.space.params)
  optim.lr: {type: float, low: 1.0e-4, high: 3.0e-2, log: true, nan: up, memory: none}
  optim: {type: choice, values: [adamw, muon]}
  training.micro_batch_size: {type: int, low: 2, high: 8, step: 2, memory: up}
  memory.recompute: {type: choice, values: [full, none], memory: up}
constraints:                        # each must hold; names: params, fixed keys and world_size
  - "training.global_batch_size % training.micro_batch_size == 0"
baseline: {training.micro_batch_size: 2}   # the config the study runs first and measures against; by default
                                    # (core.train) the core's defaults: every degree 1 (autoresearch.space.baseline)
budget: {trials: 12, hours: 0.5, dollars: 1.0}     # defaults for the agent; each optional
resources: {nodes: 1, devices_per_node: 8, cores_per_node: 32}   # what a trial asks its executor for; optional
slurm: {partition: gpu, account: llm, gres: npu, options: ["--qos=high"]}  # --executor slurm's site; optional
```

Param keys: ``type`` (required); ``values`` (choice: a non-empty list of distinct scalars); ``low``/``high``
(int/float, inclusive, ``low < high``); ``step`` (int: default 1; float: optional grid); ``log`` (log scale,
needs ``low > 0``; not with a float ``step`` or an int ``step`` other than 1); ``description`` (free text).
Feasibility annotations ``memory`` and ``nan`` (``up`` | ``down`` | ``none``): ``autoresearch.space.params``.

Constraints are data, never code: they go through the safe evaluator of ``autoresearch.space.expr``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, BeforeValidator, Field, PrivateAttr, ValidationError, model_validator

from autoresearch.space.baseline import resolve_baseline
from autoresearch.space.expr import Expr, ExprError, parse
from autoresearch.space.params import PARAM_TYPES, Param
from autoresearch.space.schema import FieldError, Lines, SpaceError, StrictModel, first_problem, kind
from core.config import format_value, override, scalar_text

# Keys of trial_summary.json "metrics" an objective may name.
OBJECTIVE_METRICS = (
    "val_loss",
    "final_loss",
    "min_loss",
    "tokens_per_sec",
    "step_time_ms_median",
    "mfu",
    "peak_memory_bytes",
    "grad_norm_last",
)
# What runs the trials. core.train: keys and values are checked against the core's config when the file loads
# (autoresearch.space.core_check); other: another trial command given to the agent with --command.
CORE_COMMAND = "core.train"
RESERVED_NAMES = {"world_size", "min", "max", "and", "or", "not", "true", "false"}
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def _dotted_name(name: str) -> str:
    """Param and fixed keys are dotted identifiers: constraints refer to them by name, Hydra reads them as
    config paths."""
    if not _DOTTED.match(name):
        raise ValueError(f"{name!r} is not a dotted name like training.micro_batch_size")
    if name in RESERVED_NAMES:
        raise ValueError(f"{name!r} is reserved in constraints ({', '.join(sorted(RESERVED_NAMES))})")
    return name


def _fixed_value(value: Any) -> Any:
    """A fixed override: a scalar, or a list of scalars for the core's list keys (memory.recompute_stages)."""
    for item in value if isinstance(value, list) else [value]:
        if not (item is None or isinstance(item, (str, int, float, bool))):
            raise ValueError(f"must be a scalar (string, number, bool, null) or a list of them, got {kind(item)}")
    return value


def _metric(metric: str) -> str:
    if metric not in OBJECTIVE_METRICS:
        raise ValueError(f"{metric!r} is not a trial metric; one of {', '.join(OBJECTIVE_METRICS)}")
    return metric


def _study_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(
            f"must be a non-empty string of letters, digits, '_', '.', '-' (got {name!r}); it names "
            "the study and its directory"
        )
    return name


def _none_as(empty: Any):
    """YAML reads a key with nothing under it (``fixed:``) as null: the same as empty."""
    return BeforeValidator(lambda v: type(empty)() if v is None else v)


def _some_params(params: dict) -> dict:
    if not params:
        raise ValueError("needs at least one param; a space with nothing to vary is a single trial")
    return params


DottedName = Annotated[str, AfterValidator(_dotted_name)]


class Objective(StrictModel):
    metric: Annotated[str, AfterValidator(_metric)]
    direction: Literal["minimize", "maximize"]


class Budget(StrictModel):
    """Defaults for the agent's stop conditions; each optional."""

    trials: Annotated[int, Field(gt=0)] | None = None
    hours: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    dollars: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None


class Resources(StrictModel):
    """What one trial asks its executor for: ``nodes`` hosts with ``devices_per_node`` ranks each (default: the
    space's world_size over the nodes), ``cores_per_node`` CPU cores each (default: the executor's)."""

    nodes: Annotated[int, Field(gt=0)] = 1
    devices_per_node: Annotated[int, Field(gt=0)] | None = None
    cores_per_node: Annotated[int, Field(gt=0)] | None = None


class Slurm(StrictModel):
    """The site's Slurm settings for ``--executor slurm`` (the agent's ``--slurm-*`` flags win): partition,
    account, the devices' generic resource name (``gres``: ``npu`` on most Ascend clusters) and further ``sbatch``
    options, passed as given."""

    partition: str | None = None
    account: str | None = None
    gres: str | None = None
    options: Annotated[list[str], _none_as([])] = []


def _without_union_tag(loc: list) -> list:
    """pydantic puts the chosen param model's tag into the location (params, lr, float, low); the file has no
    such level."""
    if len(loc) > 2 and loc[0] == "params" and loc[2] in PARAM_TYPES:
        return loc[:2] + loc[3:]
    return loc


class SearchSpace(StrictModel):
    """A search space (the schema in the module docstring). Built in code or read from a file, it obeys the same
    rules: a broken one raises ``SpaceError(file, key, reason, line=...)``."""

    name: Annotated[str, AfterValidator(_study_name)]
    description: str = ""
    trial_command: Literal["core.train", "other"] = CORE_COMMAND
    objective: Objective
    world_size: Annotated[int, Field(gt=0)] = 1
    fixed: Annotated[dict[DottedName, Annotated[Any, AfterValidator(_fixed_value)]], _none_as({})] = {}
    params: Annotated[dict[DottedName, Param], AfterValidator(_some_params)]
    constraints: Annotated[list[str], _none_as([])] = []
    baseline: Annotated[dict[DottedName, Annotated[Any, AfterValidator(_fixed_value)]], _none_as({})] = {}
    budget: Annotated[Budget, _none_as({})] = Budget()
    resources: Annotated[Resources, _none_as({})] = Resources()
    slurm: Annotated[Slurm, _none_as({})] = Slurm()
    _exprs: list[Expr] = PrivateAttr(default_factory=list)  # the parsed constraints, in order
    _path: str | None = PrivateAttr(default=None)
    _lines: Lines | None = PrivateAttr(default=None)
    _baseline: tuple | None = PrivateAttr(default=None)  # (point, substituted) once resolved

    @classmethod
    def _error_from(cls, exc: ValidationError, data: dict) -> Exception:
        return _space_error(exc, f"<space {data.get('name')}>", None)

    @classmethod
    def from_data(cls, data: Any, *, path: Path | None = None, lines: Lines | None = None) -> SearchSpace:
        """The space a file's data describe; a problem is a SpaceError at the file's line."""
        file = str(path) if path is not None else "<space>"
        try:
            space = cls.model_validate(data)
        except ValidationError as exc:
            raise _space_error(exc, file, lines) from None
        space._path, space._lines = (str(path) if path is not None else None), lines
        return space

    @model_validator(mode="after")
    def _between_parts(self):
        for key in self.fixed:
            if key in self.params:
                raise FieldError(f"fixed.{key}", f"{key} is also a param; a key is either fixed or searched")
        known = set(self.params) | set(self.fixed) | {"world_size"}
        self._exprs = []
        for i, text in enumerate(self.constraints):
            key = f"constraints[{i}]"
            try:
                expr = parse(text)
            except ExprError as exc:
                raise FieldError(key, f"{text!r} does not parse: {exc}") from None
            unknown = sorted(expr.names - known)
            if unknown:
                raise FieldError(
                    key,
                    f"{text!r} uses unknown name(s) {', '.join(unknown)}; constraints may use "
                    "params, fixed keys and world_size",
                )
            if not expr.is_boolean:
                raise FieldError(key, f"{text!r} is not a condition; write a comparison such as a <= b")
            self._exprs.append(expr)
        for name, param in self.params.items():
            param._name = name
        for key in self.baseline:
            if key not in self.params:
                raise FieldError(
                    f"baseline.{key}",
                    f"{key} is not a param; the baseline names values of params ({', '.join(self.params)})",
                )
        res = self.resources
        if res.devices_per_node is None and self.world_size % res.nodes:
            raise FieldError(
                "resources.nodes",
                f"world_size {self.world_size} does not split evenly over {res.nodes} nodes; give "
                "resources.devices_per_node or change the node count",
            )
        if res.devices_per_node is not None and res.nodes * res.devices_per_node != self.world_size:
            raise FieldError(
                "resources.devices_per_node",
                f"{res.nodes} nodes x {res.devices_per_node} devices is not the space's world_size "
                f"{self.world_size}; make them agree",
            )
        return self

    # ---- what it is -----------------------------------------------------------------------------------------

    @property
    def path(self) -> str | None:
        return self._path

    @property
    def lines(self) -> Lines | None:
        return self._lines

    @property
    def exprs(self) -> list[Expr]:
        """The parsed constraints (``autoresearch.space.expr.Expr``), in order."""
        return list(self._exprs)

    @property
    def file(self) -> str:
        return self._path or f"<space {self.name}>"

    @property
    def objective_metric(self) -> str:
        return self.objective.metric

    @property
    def direction(self) -> str:
        return self.objective.direction

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"

    @property
    def baseline_point(self) -> dict | None:
        """The config a study runs first and states every result against (``autoresearch.space.baseline``), or
        None for a space of another trial command that names none. Resolved once; a SpaceError when it cannot be."""
        if self._baseline is None:
            self._baseline = resolve_baseline(self)
        point = self._baseline[0]
        return dict(point) if point is not None else None

    @property
    def baseline_substituted(self) -> dict:
        """The params whose core default the space does not offer: {param: (the default, the value standing in)}."""
        self.baseline_point  # noqa: B018 (resolves it)
        return dict(self._baseline[1])

    @property
    def devices_per_node(self) -> int:
        """Ranks on each of a trial's nodes (``resources``)."""
        return self.resources.devices_per_node or self.world_size // self.resources.nodes

    def error(self, key: str, reason: str) -> SpaceError:
        """A SpaceError at ``key``, with its line when the space came from a file."""
        return SpaceError(self.file, key, reason, line=self._lines.of(key) if self._lines else None)

    # ---- points ------------------------------------------------------------------------------------------------

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
        reasons += [
            f"unknown param {k} (the space has: {', '.join(self.params)})" for k in params if k not in self.params
        ]
        reasons += [r for k, v in params.items() if k in self.params and (r := self.params[k].problem(v))]
        if reasons:
            return reasons  # constraints over broken values would only repeat the same news
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
        """One value per constraint: 0.0 when it holds, else a positive violation (``|lhs - rhs|`` for one numeric
        comparison, else 1.0; 1.0 when it cannot be evaluated)."""
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
        return [override(k, v) for k, v in [*self.fixed.items(), *((k, params[k]) for k in self.params)]]

    def grid(self, points_per_float: int = 4, max_points_per_int: int = 16) -> list[dict]:
        """Every combination of each param's grid values that satisfies the constraints, in a deterministic
        order (first param varies slowest)."""
        # Depth first, each constraint checked as soon as the params it reads are bound: a violated prefix prunes
        # every completion of it. The same points as filtering the full product with ``satisfies`` (a test holds
        # the two equal), but a 300k-point product whose constraints tie the first few params costs seconds, not
        # tens of seconds.
        names = list(self.params)
        axes = [self.params[n].grid_values(points_per_float, max_points_per_int) for n in names]
        position = {n: i for i, n in enumerate(names)}
        checks: list[list[Expr]] = [[] for _ in names]
        for expr in self._exprs:  # its other names (fixed keys, world_size) are bound from the start
            checks[max((position[n] for n in expr.names if n in position), default=0)].append(expr)
        points: list[dict] = []

        def extend(depth: int, env: dict) -> None:
            if depth == len(names):
                points.append({n: env[n] for n in names})
                return
            for value in axes[depth]:
                env[names[depth]] = value
                if all(_holds(expr, env) for expr in checks[depth]):
                    extend(depth + 1, env)
            env.pop(names[depth], None)

        if not names:
            return [{}] if self.satisfies({}) else []
        extend(0, self.env({}))
        return points

    def sample_random(self, rng: np.random.Generator, max_tries: int = 10_000) -> dict:
        """A uniformly random (log-uniform where log) valid point, by rejection against the constraints."""
        for _ in range(max_tries):
            point = {name: p.sample(rng) for name, p in self.params.items()}
            if self.satisfies(point):
                return point
        raise ValueError(
            f"space {self.name}: no point satisfied the constraints in {max_tries} random tries; "
            "they may be unsatisfiable"
        )

    # ---- text ----------------------------------------------------------------------------------------------

    def json_schema(self) -> dict:
        """Input schema for an LLM tool that proposes one trial: every param plus a ``rationale``."""
        properties = {name: p.json_schema() for name, p in self.params.items()}
        properties["rationale"] = {
            "type": "string",
            "description": "One or two sentences: why this config is worth a trial now, given the results so far.",
        }
        description = self.description.strip()
        if self.constraints:
            description += (" " if description else "") + "Constraints (all must hold): " + "; ".join(self.constraints)
        return {
            "type": "object",
            "description": description,
            "properties": properties,
            "required": [*self.params, "rationale"],
            "additionalProperties": False,
        }

    def describe(self) -> str:
        """A compact description for people and for the LLM's prompt."""
        goal = f"{self.direction} {self.objective_metric}"
        lines = [
            f"space {self.name}: {self.description.strip()}" if self.description.strip() else f"space {self.name}",
            f"objective: {goal}; world_size: {self.world_size}",
        ]
        if self.fixed:
            lines.append("fixed: " + ", ".join(f"{k}={format_value(v)}" for k, v in self.fixed.items()))
        lines.append("params:")
        lines += [f"  {name}: {p.describe()}" for name, p in self.params.items()]
        if self.constraints:
            lines.append("constraints:")
            lines += [f"  - {c}" for c in self.constraints]
        b = self.budget
        budget = [
            f"{b.trials} trials" if b.trials else "",
            f"{b.hours:g} h" if b.hours else "",
            f"${b.dollars:.2f} LLM" if b.dollars is not None else "",
        ]
        if any(budget):
            lines.append("budget: " + ", ".join(x for x in budget if x))
        return "\n".join(lines)


def _holds(expr: Expr, env: dict) -> bool:
    """Whether one constraint holds, as ``Space.satisfies`` reads it: one that cannot be evaluated does not."""
    try:
        return expr.violation(env) <= 0
    except ExprError:
        return False


def _space_error(exc: ValidationError, file: str, lines: Lines | None) -> SpaceError:
    """The topmost problem of a space (by line, when the space came from a file) as a SpaceError."""
    lines = lines if lines is not None else Lines()
    key, reason = first_problem(exc, order=lines.of, loc_filter=_without_union_tag)
    return SpaceError(file, key, reason, line=lines.of(key))
