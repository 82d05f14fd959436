"""The configuration of one trial: the schema, its rules, how overrides compose into it, and its documentation.

    schema.py     TrainConfig: a dataclass per section (model, optim, parallel, memory, data, training, execution,
                  trial, checkpoint), each field documented where it is declared
    model.py      ModelConfig, the model section: the GPT's shape, filled by the presets in configs/model/
    hf.py         model=hf:<dir or config.json>: the model section from a Hugging Face config
    cluster.py    ClusterConfig: the devices a run is planned for (configs/cluster/), read by core.perf
    rules.py      ConfigError, and one named function per rule between sections
    compose.py    load_config(overrides): Hydra compose -> type check -> rules; to_dict / from_dict
    overrides.py  how a value is spelled in a ``key=value`` override, and how one is read back
    docs.py       field docstrings, and ``python -m core.train --help`` generated from them

No MindSpore anywhere in this package: the agent validates and estimates proposals with it.
"""

from core.config.cluster import ClusterConfig
from core.config.compose import CONFIG_DIR, compose, from_container, from_dict, group_options, load_config, to_dict
from core.config.model import ModelConfig
from core.config.overrides import (
    format_value,
    override,
    override_number,
    override_value,
    parse_overrides,
    scalar_text,
)
from core.config.rules import ConfigError
from core.config.schema import (
    DEFAULT_GRACE_SEC,
    PP_SCHEDULES,
    PRECISIONS,
    RECOMPUTE,
    SECTIONS,
    SWAP_OPS,
    CheckpointConfig,
    DataConfig,
    ExecutionConfig,
    MemoryConfig,
    OptimConfig,
    ParallelConfig,
    TrainConfig,
    TrainingConfig,
    TrialConfig,
)

__all__ = [
    "CONFIG_DIR",
    "DEFAULT_GRACE_SEC",
    "PP_SCHEDULES",
    "PRECISIONS",
    "RECOMPUTE",
    "SECTIONS",
    "SWAP_OPS",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "ExecutionConfig",
    "MemoryConfig",
    "ModelConfig",
    "ClusterConfig",
    "OptimConfig",
    "ParallelConfig",
    "TrainConfig",
    "TrainingConfig",
    "TrialConfig",
    "compose",
    "format_value",
    "from_container",
    "from_dict",
    "group_options",
    "load_config",
    "override",
    "override_number",
    "override_value",
    "parse_overrides",
    "scalar_text",
    "to_dict",
]
