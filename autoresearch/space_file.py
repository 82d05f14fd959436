"""A search-space YAML file: where it is, its lines, and the one declarative model (pydantic) of its contents.

The schema is documented in ``autoresearch.space`` and ``search_spaces/README.md``. ``SpaceDoc`` holds every
rule of a space: keys and types (no unknown keys anywhere), each param's rules (``autoresearch.param``), and
the rules between parts (a key is fixed or searched, constraints parse and name known keys). The YAML is read
twice over: once into data, once into nodes that give each dotted key its line (and catch duplicate keys, which
PyYAML would silently collapse). Every problem becomes ``SpaceError(file, key, reason, line)``.

This module does not import ``autoresearch.space`` (which builds a ``SearchSpace`` from a ``SpaceDoc``), so the
two do not import each other.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import yaml
from pydantic import AfterValidator, BeforeValidator, Field, PrivateAttr, ValidationError, model_validator

from autoresearch.expr import ExprError, parse
from autoresearch.param import PARAM_TYPES, ParamSpec
from autoresearch.schema import FieldError, StrictModel, first_problem, kind

__all__ = ["SpaceError", "SpaceDoc", "Lines", "read_space_file", "validate_doc", "resolve_space_path", "SPACES_DIR",
           "OBJECTIVE_METRICS", "TRIAL_COMMANDS", "CORE_COMMAND"]

SPACES_DIR = Path(__file__).resolve().parent.parent / "search_spaces"

# Keys of trial_summary.json "metrics" (DESIGN §3.4) an objective may name.
OBJECTIVE_METRICS = ("val_loss", "final_loss", "min_loss", "tokens_per_sec", "step_time_ms_median", "mfu",
                     "peak_memory_bytes", "grad_norm_last")
# What runs the trials. core.train: keys and values are checked against the core's config when the file loads
# (autoresearch.space_core); other: another trial command given to the agent with --command (tests' fake trial).
CORE_COMMAND = "core.train"
TRIAL_COMMANDS = (CORE_COMMAND, "other")
RESERVED_NAMES = {"world_size", "min", "max", "and", "or", "not", "true", "false"}
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


class SpaceError(ValueError):
    """A search space that cannot be used. ``file``, ``key`` (dotted, e.g. ``params.optim.lr.low``) and
    ``reason`` say where and why; ``line`` is the 1-based line in the file when known."""

    def __init__(self, file: str, key: str, reason: str, line: Optional[int] = None):
        self.file, self.key, self.reason, self.line = str(file), key, reason, line
        where = f" (line {line})" if line else ""
        super().__init__(f"{self.file}: {key}: {reason}{where}")


# ---------------------------------------------------------------------------------------------- the model

def _dotted_name(name: str) -> str:
    """Param and fixed keys are dotted identifiers: constraints refer to them by name, Hydra reads them as
    config paths."""
    if not _DOTTED.match(name):
        raise ValueError(f"{name!r} is not a dotted name like training.micro_batch_size")
    if name in RESERVED_NAMES:
        raise ValueError(f"{name!r} is reserved in constraints ({', '.join(sorted(RESERVED_NAMES))})")
    return name


def _scalar(value: Any) -> Any:
    if not (value is None or isinstance(value, (str, int, float, bool))):
        raise ValueError(f"must be a scalar override value (string, number, bool, null), got {kind(value)}")
    return value


def _metric(metric: str) -> str:
    if metric not in OBJECTIVE_METRICS:
        raise ValueError(f"{metric!r} is not a trial metric; one of {', '.join(OBJECTIVE_METRICS)}")
    return metric


def _study_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"must be a non-empty string of letters, digits, '_', '.', '-' (got {name!r}); it names "
                         "the study and its directory")
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
    trials: Optional[Annotated[int, Field(gt=0)]] = None
    hours: Optional[Annotated[float, Field(gt=0, allow_inf_nan=False)]] = None
    dollars: Optional[Annotated[float, Field(ge=0, allow_inf_nan=False)]] = None


class SpaceDoc(StrictModel):
    """A search-space file (the schema in ``autoresearch.space``)."""

    name: Annotated[str, AfterValidator(_study_name)]
    description: str = ""
    trial_command: Literal["core.train", "other"] = CORE_COMMAND
    objective: Objective
    world_size: Annotated[int, Field(gt=0)] = 1
    fixed: Annotated[dict[DottedName, Annotated[Any, AfterValidator(_scalar)]], _none_as({})] = {}
    params: Annotated[dict[DottedName, ParamSpec], AfterValidator(_some_params)]
    constraints: Annotated[list[str], _none_as([])] = []
    budget: Annotated[Budget, _none_as({})] = Budget()
    _exprs: list = PrivateAttr(default_factory=list)  # the parsed constraints, in order

    @model_validator(mode="after")
    def _between_parts(self):
        for key in self.fixed:
            if key in self.params:
                raise FieldError(f"fixed.{key}", f"{key} is also a param; a key is either fixed or searched")
        known = set(self.params) | set(self.fixed) | {"world_size"}
        for i, text in enumerate(self.constraints):
            key = f"constraints[{i}]"
            try:
                expr = parse(text)
            except ExprError as exc:
                raise FieldError(key, f"{text!r} does not parse: {exc}") from None
            unknown = sorted(expr.names - known)
            if unknown:
                raise FieldError(key, f"{text!r} uses unknown name(s) {', '.join(unknown)}; constraints may use "
                                      "params, fixed keys and world_size")
            if not expr.is_boolean:
                raise FieldError(key, f"{text!r} is not a condition; write a comparison such as a <= b")
            self._exprs.append(expr)
        return self

    @property
    def exprs(self) -> list:
        return list(self._exprs)


def _without_union_tag(loc: list) -> list:
    """pydantic puts the chosen param model's tag into the location (params, lr, float, low); the file has no
    such level."""
    if len(loc) > 2 and loc[0] == "params" and loc[2] in PARAM_TYPES:
        return loc[:2] + loc[3:]
    return loc


def validate_doc(data: Any, file: str, lines: "Lines | None" = None) -> SpaceDoc:
    """``data`` validated into a SpaceDoc; raises SpaceError for the topmost problem in the file."""
    lines = lines if lines is not None else Lines()
    try:
        return SpaceDoc.model_validate(data)
    except ValidationError as exc:
        key, reason = first_problem(exc, order=lines.of, loc_filter=_without_union_tag)
        raise SpaceError(file, key, reason, lines.of(key)) from None


# ---------------------------------------------------------------------------------------------- the file

class _Loader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, where ``1e-4`` (no dot) is a string. People write learning rates that way,
    so this loader also reads YAML 1.2 exponent floats. A copy of the resolver table keeps SafeLoader intact."""


_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


class Lines(dict):
    """Dotted key path ("params.optim.lr.low", "constraints[0]") -> its 1-based line in the file."""

    def of(self, key: str) -> Optional[int]:
        """The line of ``key``, or of its closest enclosing key that has one."""
        while key:
            if key in self:
                return self[key]
            cut = max(key.rfind("."), key.rfind("["))
            key = key[:cut] if cut > 0 else ""
        return None


def _index_lines(node: yaml.Node, file: str, prefix: str = "", lines: Lines | None = None) -> Lines:
    """Every key's line; a duplicate key is an error here, since the data would silently keep the last one."""
    lines = Lines() if lines is None else lines
    if isinstance(node, yaml.MappingNode):
        seen: set = set()
        for key_node, value_node in node.value:
            key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            if key_node.value in seen:
                raise SpaceError(file, key, "duplicate key; keep one", key_node.start_mark.line + 1)
            seen.add(key_node.value)
            lines[key] = key_node.start_mark.line + 1
            _index_lines(value_node, file, key, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            key = f"{prefix}[{i}]"
            lines[key] = item.start_mark.line + 1
            _index_lines(item, file, key, lines)
    return lines


def resolve_space_path(name_or_path: str | Path) -> Path:
    """As given (absolute or relative to the working directory), else in ``search_spaces/``; ``.yaml`` is
    added when the name has no suffix. Raises SpaceError listing where it looked."""
    given = Path(name_or_path)
    names = [given] if given.suffix in (".yaml", ".yml") else [given, given.with_name(given.name + ".yaml")]
    candidates = [*names, *(SPACES_DIR / n for n in names if not n.is_absolute())]
    for path in candidates:
        if path.is_file():
            return path
    looked = ", ".join(str(p) for p in candidates)
    available = ", ".join(sorted(p.name for p in SPACES_DIR.glob("*.yaml")))
    raise SpaceError(str(name_or_path), "file", f"not found (looked at {looked}); shipped spaces: {available}")


def read_space_file(path: Path) -> tuple[SpaceDoc, Lines]:
    """The validated contents of a space file and its line index; raises SpaceError."""
    file = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpaceError(file, "file", f"cannot be read: {exc}") from None
    try:
        root = yaml.compose(text, Loader=_Loader)
        lines = _index_lines(root, file) if root is not None else Lines()
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpaceError(file, "yaml", f"not valid YAML: {problem}", mark.line + 1 if mark else None) from None
    if not data:
        raise SpaceError(file, "file", "is empty; a space needs at least objective and params")
    if isinstance(data, dict):
        data.setdefault("name", path.stem)  # the study's name unless the file gives one
    return validate_doc(data, file, lines), lines
