"""The text of an exported config: YAML (MindFormers) and the core's own overrides; torchtitan's Python recipe is
``autoresearch.export.recipe``."""

from __future__ import annotations

import yaml

from autoresearch.export.targets import flatten
from core.config import format_value


class ExportError(ValueError):
    """A study or trial that has nothing to export; the message says what to do instead."""


class _PlainDumper(yaml.SafeDumper):
    def ignore_aliases(self, data):  # a config a person reads: no &id001 anchors for repeated lists
        return True


def yaml_text(doc: dict) -> str:
    return yaml.dump(doc, Dumper=_PlainDumper, sort_keys=False, default_flow_style=None, allow_unicode=True)


def to_overrides(config: dict) -> list[str]:
    """``key=value`` for every key of a resolved config but trial.dir (a re-run writes its own). Every key of the
    schema exists in the composition (``core.config.compose``), so a key a preset's file leaves out is set as
    plainly as any other."""
    flat = flatten(config)
    flat.pop("trial.dir", None)
    lines = []
    for key, value in flat.items():
        text = format_value(value)
        if any(ch.isspace() for ch in text):
            raise ExportError(
                f"{key}={text} holds whitespace, which `$(cat FILE)` would split; export another "
                "target or pass this key by hand"
            )
        lines.append(f"{key}={text}")
    return lines
