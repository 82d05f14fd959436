"""The text of an exported config: YAML (MindFormers), TOML, and the core's own overrides."""

from __future__ import annotations

import json
import math
from typing import Any

import yaml
from omegaconf import OmegaConf

from autoresearch.export.targets import flatten
from core.config import compose, format_value


class ExportError(ValueError):
    """A study or trial that has nothing to export; the message says what to do instead."""


class _PlainDumper(yaml.SafeDumper):
    def ignore_aliases(self, data):  # a config a person reads: no &id001 anchors for repeated lists
        return True


def yaml_text(doc: dict) -> str:
    return yaml.dump(doc, Dumper=_PlainDumper, sort_keys=False, default_flow_style=None, allow_unicode=True)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return ("nan" if math.isnan(v) else "inf" if v > 0 else "-inf") if not math.isfinite(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: JSON's escapes (ASCII output) are TOML's
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r} ({type(v).__name__})")


def toml_text(doc: dict) -> str:
    """Tables of scalars, strings and arrays: all a torchtitan fragment holds (tomllib reads it back)."""
    out = []
    for table, values in doc.items():
        if not isinstance(values, dict) or any(isinstance(v, dict) for v in values.values()):
            raise TypeError(f"[{table}]: only flat tables of values are written, got {values!r}")
        out += [f"[{table}]", *(f"{k} = {toml_value(v)}" for k, v in values.items()), ""]
    return "\n".join(out)


def to_overrides(config: dict) -> list[str]:
    """``key=value`` for every key of a resolved config but trial.dir (a re-run writes its own); ``++key=value``
    where the default composition has no such key (see the module docstring)."""
    flat = flatten(config)
    flat.pop("trial.dir", None)
    known = flatten(OmegaConf.to_container(compose([]), resolve=True))
    lines = []
    for key, value in flat.items():
        text = format_value(value)
        if any(ch.isspace() for ch in text):
            raise ExportError(
                f"{key}={text} holds whitespace, which `$(cat FILE)` would split; export another "
                "target or pass this key by hand"
            )
        lines.append(f"{'' if key in known else '++'}{key}={text}")
    return lines
