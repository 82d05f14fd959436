"""Reading a search-space YAML file into a ``SearchSpace``, rejecting malformed files with the line and reason.

The schema is documented in ``autoresearch.space`` and ``search_spaces/README.md``. This module checks the
file's *shape* (unknown keys, types, required keys, duplicate keys); the rules between values (``low < high``,
constraints that parse and name known keys, ...) live on ``Param`` and ``SearchSpace`` so that spaces built
in code obey them too. Every error becomes ``SpaceError(file, key, reason, line)``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from autoresearch.param import ANNOTATIONS, PARAM_TYPES, Param, ParamError
from autoresearch.space import OBJECTIVE_METRICS, SPACES_DIR, SearchSpace, SpaceError

__all__ = ["load_space_file", "resolve_space_path", "TOP_LEVEL_KEYS", "PARAM_KEYS"]

TOP_LEVEL_KEYS = ("name", "description", "objective", "world_size", "fixed", "params", "constraints", "budget")
PARAM_KEYS = {
    "choice": ("type", "values", "memory", "nan", "description"),
    "int": ("type", "low", "high", "step", "log", "memory", "nan", "description"),
    "float": ("type", "low", "high", "step", "log", "memory", "nan", "description"),
}
OBJECTIVE_KEYS = ("metric", "direction")
BUDGET_KEYS = ("trials", "hours", "dollars")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


class _Loader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, where ``1e-4`` (no dot) is a string. People write learning rates that way,
    so this loader also reads YAML 1.2 exponent floats. A copy of the resolver table keeps SafeLoader intact."""


_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


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


def _line_index(node: yaml.Node, file: str, prefix: str = "", lines: dict | None = None) -> dict[str, int]:
    """Map each dotted key path ("params.optim.lr.low", "constraints[0]") to its 1-based line, and reject
    duplicate keys, which PyYAML would silently collapse to the last one."""
    lines = {} if lines is None else lines
    if isinstance(node, yaml.MappingNode):
        seen: set = set()
        for key_node, value_node in node.value:
            key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            if key_node.value in seen:
                raise SpaceError(file, key, "duplicate key", key_node.start_mark.line + 1)
            seen.add(key_node.value)
            lines[key] = key_node.start_mark.line + 1
            _line_index(value_node, file, key, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            key = f"{prefix}[{i}]"
            lines[key] = item.start_mark.line + 1
            _line_index(item, file, key, lines)
    return lines


def _line_of(lines: dict[str, int], key: str) -> int | None:
    """The line of ``key``, or of its closest enclosing key that has one."""
    while key:
        if key in lines:
            return lines[key]
        cut = max(key.rfind("."), key.rfind("["))
        key = key[:cut] if cut > 0 else ""
    return None


class _File:
    """The parsed document with its line index; ``fail`` raises a SpaceError pointing into the file."""

    def __init__(self, path: Path):
        self.file = str(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise SpaceError(self.file, "file", f"cannot be read: {exc}") from None
        try:
            root = yaml.compose(text, Loader=_Loader)
            self.lines = _line_index(root, self.file) if root is not None else {}
            self.data = yaml.load(text, Loader=_Loader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise SpaceError(self.file, "yaml", f"not valid YAML: {problem}",
                             mark.line + 1 if mark else None) from None

    def fail(self, key: str, reason: str) -> SpaceError:
        return SpaceError(self.file, key, reason, _line_of(self.lines, key))

    def mapping(self, value: Any, key: str, allowed: tuple | None = None) -> dict:
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a mapping (got {_kind(value)})")
        for k in value:
            if not isinstance(k, str):
                raise self.fail(key, f"keys must be strings (got {k!r})")
            if allowed is not None and k not in allowed:
                raise self.fail(f"{key}.{k}" if key else k, f"unknown key; allowed: {', '.join(allowed)}")
        return value


def _kind(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"


def _number(f: _File, value: Any, key: str, *, integer: bool = False, positive: bool = True) -> Any:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or (isinstance(value, float) and not math.isfinite(value)):
        raise f.fail(key, f"must be {'an integer' if integer else 'a number'} (got {_kind(value)})")
    if positive and value <= 0 or not positive and value < 0:
        raise f.fail(key, f"must be {'> 0' if positive else '>= 0'} (got {value})")
    return value


def _param(f: _File, name: str, spec: Any) -> Param:
    key = f"params.{name}"
    if not isinstance(spec, dict):
        raise f.fail(key, f"must be a mapping with a type (choice, int or float), got {_kind(spec)}")
    kind = spec.get("type")
    if kind not in PARAM_TYPES:
        raise f.fail(f"{key}.type" if "type" in spec else key,
                     f"type must be one of {', '.join(PARAM_TYPES)} (got {_kind(kind)})")
    f.mapping(spec, key, PARAM_KEYS[kind])
    for a in ("memory", "nan"):
        if a in spec and spec[a] not in ANNOTATIONS:
            raise f.fail(f"{key}.{a}", f"must be up, down or none (got {_kind(spec[a])}); omit it to mean "
                                       "'must be equal when comparing configs'")
    if "description" in spec and not isinstance(spec["description"], str):
        raise f.fail(f"{key}.description", "must be a string")
    try:
        return Param(name=name, **{k: v for k, v in spec.items()})
    except ParamError as exc:
        raise f.fail(f"{key}.{exc.field}", str(exc)) from None


def _budget(f: _File, raw: Any) -> dict:
    budget = f.mapping({} if raw is None else raw, "budget", BUDGET_KEYS)
    return {
        "budget_trials": _number(f, budget["trials"], "budget.trials", integer=True) if "trials" in budget else None,
        "budget_hours": float(_number(f, budget["hours"], "budget.hours")) if "hours" in budget else None,
        "budget_dollars": (float(_number(f, budget["dollars"], "budget.dollars", positive=False))
                           if "dollars" in budget else None),
    }


def load_space_file(name_or_path: str | Path) -> SearchSpace:
    path = resolve_space_path(name_or_path)
    f = _File(path)
    doc = f.mapping(f.data, "", TOP_LEVEL_KEYS) if f.data is not None else None
    if not doc:
        raise f.fail("file", "is empty; a space needs at least objective and params")
    for required in ("objective", "params"):
        if required not in doc:
            raise f.fail(required, "is required")

    name = doc.get("name", path.stem)
    if not isinstance(name, str) or not _NAME.match(name):
        raise f.fail("name", f"must be a non-empty string of letters, digits, '_', '.', '-' (got {_kind(name)}); "
                             "it names the study and its directory")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise f.fail("description", f"must be a string (got {_kind(description)})")

    objective = f.mapping(doc["objective"], "objective", OBJECTIVE_KEYS)
    for key in OBJECTIVE_KEYS:
        if key not in objective:
            raise f.fail("objective", f"needs {key}")
    if objective["metric"] not in OBJECTIVE_METRICS:
        raise f.fail("objective.metric", f"{_kind(objective['metric'])} is not a trial metric; one of "
                                         f"{', '.join(OBJECTIVE_METRICS)}")
    world_size = _number(f, doc.get("world_size", 1), "world_size", integer=True)

    fixed = f.mapping({} if doc.get("fixed") is None else doc["fixed"], "fixed")
    for key, value in fixed.items():
        if not (value is None or isinstance(value, (str, int, float, bool))):
            raise f.fail(f"fixed.{key}", f"must be a scalar override value (got {_kind(value)})")

    params_raw = f.mapping(doc["params"], "params")
    if not params_raw:
        raise f.fail("params", "needs at least one param; a space with nothing to vary is a single trial")
    params = {name: _param(f, name, spec) for name, spec in params_raw.items()}

    constraints = [] if doc.get("constraints") is None else doc["constraints"]
    if not isinstance(constraints, list):
        raise f.fail("constraints", f"must be a list of expressions (got {_kind(constraints)})")

    try:
        return SearchSpace(name=name, description=description, objective_metric=objective["metric"],
                           direction=objective["direction"], world_size=world_size, fixed=dict(fixed),
                           params=params, constraints=list(constraints), path=str(path),
                           **_budget(f, doc.get("budget")))
    except SpaceError as exc:
        # The space's own rules do not know about lines; point into the file.
        raise f.fail(exc.key, exc.reason) from None
