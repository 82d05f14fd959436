"""Reading a search-space file: where it is, its lines, its YAML, and the space it describes.

    load_space("parallel.yaml")   # a path, or a name in search_spaces/; checked against the core's config

The YAML is read twice over: once into data, once into nodes that give each dotted key its line (and catch
duplicate keys, which PyYAML would silently collapse), so that every problem is a ``SpaceError(file, key, reason,
line)``. Numbers like ``1e-4`` are read as floats (YAML 1.2), not strings as PyYAML would by default.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from autoresearch.space.core_check import check_against_core
from autoresearch.space.schema import Lines, SpaceError
from autoresearch.space.space import CORE_COMMAND, SearchSpace

SPACES_DIR = Path(__file__).resolve().parents[2] / "search_spaces"


class _Loader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, where ``1e-4`` (no dot) is a string. People write learning rates that way,
    so this loader also reads YAML 1.2 exponent floats. A copy of the resolver table keeps SafeLoader intact."""


_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _index_lines(node: yaml.Node, file: str, prefix: str = "", lines: Lines | None = None) -> Lines:
    """Every key's line; a duplicate key is an error here, since the data would silently keep the last one."""
    lines = Lines() if lines is None else lines
    if isinstance(node, yaml.MappingNode):
        seen: set = set()
        for key_node, value_node in node.value:
            key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            if key_node.value in seen:
                raise SpaceError(file, key, "duplicate key; keep one", line=key_node.start_mark.line + 1)
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


def read_space_file(path: Path) -> tuple[Any, Lines]:
    """The data of a space file and its line index; raises SpaceError for what is not a space's YAML."""
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
        raise SpaceError(file, "yaml", f"not valid YAML: {problem}", line=mark.line + 1 if mark else None) from None
    if not data:
        raise SpaceError(file, "file", "is empty; a space needs at least objective and params")
    if isinstance(data, dict):
        data.setdefault("name", path.stem)  # the study's name unless the file gives one
        _anchor_hf_paths(data, path.parent)
    return data, lines


def _anchor_hf_paths(data: dict, folder: Path) -> None:
    """A relative ``hf:<dir>`` (a Hugging Face model, ``model=hf:...``) among the fixed values and the choices
    names a directory beside the space file, wherever the agent runs from: made absolute here."""

    def anchored(value):
        if isinstance(value, str) and value.startswith("hf:") and not Path(value[3:]).expanduser().is_absolute():
            return f"hf:{(folder / value[3:]).resolve()}"
        return value

    if isinstance(data.get("fixed"), dict):
        data["fixed"] = {k: anchored(v) for k, v in data["fixed"].items()}
    for spec in (data.get("params") or {}).values():
        if isinstance(spec, dict) and isinstance(spec.get("values"), list):
            spec["values"] = [anchored(v) for v in spec["values"]]


def load_space(name_or_path: str | Path) -> SearchSpace:
    """Load and validate a space file: ``name_or_path`` as given, else relative to the working directory,
    else in ``search_spaces/`` (``.yaml`` added when missing). A space of the training core (``trial_command:
    core.train``, the default) is also checked against the core's config: every key, type, group option and
    value the core refuses whatever the other params are. Raises SpaceError(file, key, reason, line=...)."""
    path = resolve_space_path(name_or_path)
    data, lines = read_space_file(path)
    space = SearchSpace.from_data(data, path=path, lines=lines)
    if space.trial_command == CORE_COMMAND:
        check_against_core(space)
    return space
