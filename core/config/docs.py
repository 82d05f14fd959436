"""Documentation generated from the schema: every field's docstring (the string under its declaration), and the
``python -m core.train --help`` text built from them, so the help cannot fall behind the config.

``field_docs`` reads a dataclass's source with ``ast``; the agent's CLI (``autoresearch.cli``) builds its
options' help the same way.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import textwrap
import types
import typing

from core.config.compose import group_options, load_config, to_dict
from core.config.overrides import scalar_text
from core.config.schema import SECTIONS, TrainConfig

EXAMPLES = """\
  python -m core.train model=tiny trial.max_steps=20
  python -m core.train model=small parallel.dp_shard=2 memory.limit_gb=4 trial.max_wall_time_sec=120
  python -m core.train model=small parallel.tp=2 parallel.sp=true trial.max_steps=20
  python -m core.train model=small parallel.pp=2 parallel.pp_schedule=interleaved parallel.pp_virtual=2 \\
      training.micro_batch_size=2 trial.max_steps=20
  python -m core.train model=moe-tiny parallel.dp_shard=2 parallel.ep=2 trial.max_steps=20"""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its docstring, whitespace folded} for a dataclass whose fields carry one."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in itertools.pairwise(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _is_docstring(after):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def type_text(annotation: typing.Any) -> str:
    """A field's type as the help shows it: int, float?, list[str]? (``?``: may be null)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return type_text(args[0]) + "?"
    return getattr(annotation, "__name__", None) if typing.get_origin(annotation) is None else str(annotation)


def key_lines(values: dict, width: int = 100) -> list[str]:
    """One entry per key: ``section.field  (type) = value`` and its docstring, wrapped; ``values`` are the
    composed config's (nested, as ``to_dict`` gives them)."""
    lines = []
    for section, cls in SECTIONS.items():
        lines += ["", *textwrap.wrap(f"{section}: {_plain(inspect.getdoc(cls))}", width)]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            lines += _entry(
                f"{section}.{f.name}", hints[f.name], values[section][f.name], field_docs(cls).get(f.name, ""), width
            )
    lines += ["", "top level:"]
    hints = typing.get_type_hints(TrainConfig)
    for name in ("seed", "device"):
        lines += _entry(name, hints[name], values[name], field_docs(TrainConfig).get(name, ""), width)
    return lines


def _plain(text: str) -> str:
    return " ".join(text.replace("``", "").split())


def _entry(key: str, annotation, value, doc: str, width: int) -> list[str]:
    head = f"  {key} ({type_text(annotation)}) = {scalar_text(value)}"
    return [head, *textwrap.wrap(_plain(doc), width, initial_indent="      ", subsequent_indent="      ")]


def usage(overrides: list[str] | tuple[str, ...] = (), *, exit_codes: str) -> str:
    """The text of ``python -m core.train --help [overrides]``: the values shown are those the overrides compose
    (e.g. ``--help model=small`` shows that preset's). ``exit_codes``: the trial contract's codes, as
    ``core.trial.contract.codes_text`` spells them (the contract sits above the config in the import order)."""
    groups = "  ".join(f"{g}={'|'.join(group_options(g))}" for g in SECTIONS if len(group_options(g)) > 1)
    values = to_dict(load_config(overrides))
    return "\n".join(
        [
            "usage: python -m core.train [key=value | group=option ...]",
            "",
            "Runs one bounded trial: it stops at trial.max_steps or trial.max_wall_time_sec, writes",
            "trial_summary.json into trial.dir and exits with a code that says how it ended.",
            f"Exit codes: {exit_codes}.",
            "",
            f"Config groups (presets in configs/<group>/): {groups}",
            "model=hf:<dir or config.json> reads a Hugging Face config instead of a preset (Llama, Mistral, "
            "Mixtral: core.config.hf).",
            "The parallel degrees dp_replicate * dp_shard * tp * pp * cp are the ranks this command starts.",
            "",
            "Examples:",
            EXAMPLES,
            "",
            "Keys (section.field (type; ? = may be null) = value"
            + (f" with {' '.join(overrides)}" if overrides else "")
            + "):",
            *key_lines(values),
        ]
    )
