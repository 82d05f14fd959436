"""The torchtitan export as the file torchtitan 0.3.0 reads: a Python module with a zero-argument function that
returns a ``Trainer.Config`` (``--module <module> --config tuned``), and the way back from a loaded config to the
target's flat fields (``autoresearch.export.targets.torchtitan``).

torchtitan 0.3.0 reads no TOML (0.2.2 was the last release that did). The study tuned only part of a run, so the
recipe goes on top of a base recipe that holds the model, data, tokenizer and loss: ``apply(config)`` sets the tuned
fields on any Trainer.Config and leaves the rest alone; ``tuned()`` applies them to ``BASE`` ("module:function", a
line the user edits), or to ``Trainer.Config()`` when BASE is None. Those defaults name no model: the file loads and
its fields can be checked, but a run needs a BASE.

Most fields are attribute assignments of a Python literal (``math.inf`` for an infinity). Two are objects built
from their flat keys: ``activation_checkpoint`` (none, selective, full: None, SelectiveAC.Config(), FullAC.Config())
and ``optimizer`` (its AdamW kwargs: ``default_adamw(...)``, one AdamW group over every parameter; the param groups
must be set, as Trainer.Config() has none). The lr_scheduler's fields are set one by one, so that a base recipe's
total_steps stays.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import Any

from autoresearch.export.targets import flatten
from autoresearch.export.targets.rules import Flat

WIDTH = 120  # an assignment longer than this lists one element a line
AC_OBJECTS = {"none": "None", "selective": "SelectiveAC.Config()", "full": "FullAC.Config()"}
AC_MODES = {"SelectiveAC.Config": "selective", "FullAC.Config": "full"}  # the way back, by class
OPTIMIZER = "optimizer."  # the flat keys that are default_adamw's kwargs

MODULE_DOC = '''"""The study's tuned settings as a torchtitan 0.3.0 recipe, written by autoresearch.export (the
comments above say from which trial, and what it could not carry).

Run it from the directory that holds this file (or with that directory on PYTHONPATH):
    torchrun --nproc_per_node=<ranks> -m torchtitan.train --module <this file's name, no .py> --config tuned
``apply(config)`` sets the tuned fields on any Trainer.Config and leaves everything else (model, data, tokenizer,
loss, steps, checkpoints) to it; ``tuned()`` applies them to BASE below. Flags after --config still override a
field: --training.steps 1000.
"""'''

BASE_LINES = [
    '# The recipe the tuned fields go on top of, as "module:function": set it to your model\'s, e.g.',
    '# BASE = "torchtitan.models.llama3.config_registry:llama3_8b". None: Trainer.Config()\'s defaults, which name',
    "# no model (the file loads and its fields can be checked, but a run needs a BASE).",
    "BASE = None",
]

FUNCTIONS = '''def base() -> Trainer.Config:
    """BASE's recipe, or Trainer.Config()'s defaults."""
    if BASE is None:
        return Trainer.Config()
    module, _, function = BASE.partition(":")
    return getattr(importlib.import_module(module), function)()


def tuned() -> Trainer.Config:
    """The tuned fields on BASE: what ``--config tuned`` loads."""
    return apply(base())'''


def literal(value: Any) -> str:
    """Python source for a value (repr, but an infinity is math.inf: repr gives ``inf``, which is no literal)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "math.nan" if math.isnan(value) else "math.inf" if value > 0 else "-math.inf"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(literal(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    raise TypeError(f"no Python literal for {value!r} ({type(value).__name__})")


def non_finite(value: Any) -> bool:
    """Whether the value's literal needs ``import math``."""
    if isinstance(value, list | tuple):
        return any(non_finite(v) for v in value)
    return isinstance(value, float) and not math.isfinite(value)


def assignment(target: str, value: Any) -> list[str]:
    """``target = value`` in apply's body; a long list one element a line (a pipeline's stages)."""
    line = f"    {target} = {literal(value)}"
    if len(line) <= WIDTH or not isinstance(value, list):
        return [line]
    return [f"    {target} = [", *(f"        {literal(v)}," for v in value), "    ]"]


def optimizer_lines(fields: Flat) -> list[str]:
    """One statement for all the optimizer keys: Trainer.Config()'s optimizer has no param group to set them on."""
    kwargs = ", ".join(
        f"{k.removeprefix(OPTIMIZER)}={literal(v)}" for k, v in fields.items() if k.startswith(OPTIMIZER)
    )
    return [
        "    # one AdamW group over every parameter (the core's AdamW does not decay 1-D weights)",
        f"    config.optimizer = default_adamw({kwargs})",
    ]


def field_lines(path: str, value: Any) -> list[str]:
    lines = []
    if path == "training.disable_cuda_graphs":
        lines.append("    # Trainer.Config rejects CUDA graphs with pipeline parallelism")
    if path == "parallelism.module_fqns_per_model_part" and value is not None:
        blocks = sum(1 for part in value for m in part if m.startswith("layers."))
        lines.append(
            f"    # the stages of the study's model ({blocks} blocks): for another depth write its own, or None for "
            "torchtitan's split"
        )
    return lines + assignment(f"config.{path}", value)


def body(fields: Flat) -> list[str]:
    """apply's statements, in the table's order: objects for activation_checkpoint and the optimizer (one for all
    of its keys), attribute assignments for the rest."""
    statements: dict[str, list[str]] = {}
    for path, value in fields.items():
        if path.startswith(OPTIMIZER):
            statements.setdefault("optimizer", optimizer_lines(fields))
        elif path == "activation_checkpoint":
            statements[path] = [f"    config.activation_checkpoint = {AC_OBJECTS[value]}"]
        else:
            statements[path] = field_lines(path, value)
    return [line for lines in statements.values() for line in lines]


def imports(fields: Flat) -> list[str]:
    """What apply and tuned use, and nothing else."""
    values = fields.values()
    lines = ["import importlib", *(["import math"] if any(non_finite(v) for v in values) else []), ""]
    if any(k.startswith(OPTIMIZER) for k in fields):
        lines.append("from torchtitan.components.optimizer import default_adamw")
    mode = fields.get("activation_checkpoint", "none")
    if mode != "none":
        lines.append(f"from torchtitan.distributed.activation_checkpoint import {AC_OBJECTS[mode].split('.')[0]}")
    return [*lines, "from torchtitan.trainer import Trainer"]


def recipe_text(doc: dict, header: list[str]) -> str:
    """The recipe module for an exported document (nested, as ``export_config`` gives it), under the export's
    comment header."""
    fields = flatten(doc)
    apply = [
        "def apply(config: Trainer.Config) -> Trainer.Config:",
        '    """Set the tuned fields on ``config`` (any Trainer.Config) and return it; every other field stays."""',
        *body(fields),
        "    return config",
    ]
    parts = [*header, MODULE_DOC, "", *imports(fields), "", *BASE_LINES, "", "", *apply, "", "", FUNCTIONS]
    return "\n".join(parts) + "\n"


# --- the way back ---------------------------------------------------------------------------------------------


def ac_mode(policy: Any) -> str:
    if policy is None:
        return "none"
    name = type(policy).__qualname__
    if name not in AC_MODES:
        raise ValueError(f"activation_checkpoint {name} has no core counterpart (none, selective or full)")
    return AC_MODES[name]


def adamw_kwargs(optimizer: Any) -> dict:
    """The kwargs of the optimizer's one AdamW group over every parameter (what the recipe writes)."""
    groups = list(optimizer.param_groups)
    if len(groups) != 1 or groups[0].optimizer_name != "AdamW" or groups[0].pattern != ".*":
        raise ValueError(f"optimizer param groups {groups} are not one AdamW group over every parameter")
    return dict(groups[0].optimizer_kwargs)


def read_recipe(config: Any, paths: Iterable[str]) -> Flat:
    """The target's flat fields of a loaded config (torchtitan's Trainer.Config, or any object of that shape):
    what ``import_config`` takes back to the core's config, and what the tests hold the written recipe to."""
    out: Flat = {}
    for path in paths:
        if path == "activation_checkpoint":
            out[path] = ac_mode(config.activation_checkpoint)
        elif path.startswith(OPTIMIZER):
            out[path] = adamw_kwargs(config.optimizer)[path.removeprefix(OPTIMIZER)]
        else:
            out[path] = functools.reduce(getattr, path.split("."), config)
    return out
