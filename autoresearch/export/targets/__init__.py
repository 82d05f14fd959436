"""Where a study's winner goes: the training stacks ``autoresearch.export`` writes a config for.

Each target is a table (``mindformers``, ``torchtitan``) of rules from the core's resolved config to the target's
keys and back, plus the core keys it has no counterpart for, with why (``rules`` holds the machinery). The core's
own Hydra overrides are not a table: they are the config itself (``autoresearch.export.to_overrides``).

    rules.py        the machinery: rules, targets, the canonical config, export and import
    mindformers.py  MindFormers' YAML keys
    torchtitan.py   torchtitan 0.3.0's Trainer.Config fields (``autoresearch.export.recipe`` writes them)
"""

from autoresearch.export.targets.mindformers import MINDFORMERS
from autoresearch.export.targets.rules import (
    Exported,
    Target,
    canonical,
    export_config,
    flatten,
    import_config,
    unflatten,
)
from autoresearch.export.targets.torchtitan import TORCHTITAN

TARGETS: dict[str, Target] = {t.name: t for t in (MINDFORMERS, TORCHTITAN)}

__all__ = ["TARGETS", "Exported", "Target", "canonical", "export_config", "flatten", "import_config", "unflatten"]
