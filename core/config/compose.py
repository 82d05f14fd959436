"""From overrides to a checked ``TrainConfig``, and back to plain data.

    load_config(["model=small", "parallel.tp=2"])   # Hydra compose -> OmegaConf type check -> dataclass rules
    from_container(tree)                             # a plain dict (a resolved config.yaml) -> TrainConfig
    to_dict(cfg) / from_dict(d)                      # what a supervisor hands its workers, without Hydra

Every failure is a ``ConfigError`` naming the key and the fix; Hydra's and OmegaConf's own messages are turned
into that form here.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from core.config import hf
from core.config.rules import ConfigError
from core.config.schema import SECTIONS, TrainConfig

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def compose(overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """Hydra-compose ``configs/train.yaml`` with ``overrides`` (``model=hf:<path>`` expanded first:
    ``core.config.hf``); returns the raw OmegaConf tree."""
    # function-level: Hydra and OmegaConf stay out of a worker's start-up (workers get their config from_dict)
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    _register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name="train", overrides=hf.expand(overrides))


SCHEMA = "train_schema"  # the first entry of configs/train.yaml's defaults


def _register_schema() -> None:
    """TrainConfig as the base of the composition, so that every key of the schema exists before the presets
    merge in: ``model=small model.n_experts=8`` overrides a key the preset's file leaves out."""
    # function-level: as in compose
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA, node=TrainConfig)


def group_options(group: str) -> list[str]:
    """The options of a config group: the files under ``configs/<group>/``."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def _config_error_from_omegaconf(exc: Exception) -> ConfigError:
    key = getattr(exc, "full_key", None) or "config"
    msg = str(exc).splitlines()[0]
    return ConfigError(key, f"{msg} (check the key's spelling and type: `python -m core.train --help`)")


def _unknown_override(exc: Exception) -> ConfigError:
    """Hydra says "Could not override 'model.foo'" or "Key 'foo' is not in struct"; name the key either way."""
    text = str(exc)
    missing = re.search(r"Could not find '(\w+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        return ConfigError(
            group, f"no option {option!r} in configs/{group}/; choose one of {', '.join(group_options(group))}"
        )
    cause = exc.__cause__ or exc.__context__
    if getattr(cause, "full_key", None) and "not in" not in str(cause):  # a value of the wrong type
        return _config_error_from_omegaconf(cause)
    m = re.search(r"override '([^']+)'", text) or re.search(r"Key '([^']+)'", text)
    key = m.group(1) if m else "overrides"
    detail = (str(cause) if cause else text).splitlines()[0]
    return ConfigError(key, f"{detail}. Unknown keys are rejected: check the spelling against configs/train.yaml")


def from_container(raw: dict) -> TrainConfig:
    """Validate a plain dict (e.g. a resolved config.yaml) into a TrainConfig."""
    # function-level: as in compose
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), raw)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise _config_error_from_omegaconf(exc) from exc


def load_config(overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Compose, type-check and cross-check; raises ConfigError naming the field and the fix."""
    # function-level: as in compose
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        raw = compose(overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise _unknown_override(exc) from exc
    return from_container(OmegaConf.to_container(raw, resolve=True))


def to_dict(cfg: TrainConfig) -> dict:
    return asdict(cfg)


def from_dict(d: dict) -> TrainConfig:
    """The TrainConfig that ``to_dict`` made ``d`` from, rebuilt (and re-checked) without Hydra or OmegaConf: how
    a supervisor hands its validated config to its workers, each of which would otherwise spend about a second of
    CPU composing it again."""
    return TrainConfig(**{k: SECTIONS[k](**v) if k in SECTIONS else v for k, v in d.items()})
