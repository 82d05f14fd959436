"""Everything the agent knows about the training core: its command, what a trial leaves behind, its config schema
and rules, its memory estimate. The rest of the agent speaks in params, statuses and rows; a space of another
trial command (``trial_command: other``) never reaches the core's config through here.

No MindSpore: the core's config, estimate and trial contract are import-light on purpose.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_type_hints

from omegaconf import OmegaConf

from autoresearch.records import Status, TrialResult, is_number
from core.config import (
    CONFIG_DIR,
    DEFAULT_GRACE_SEC,
    ConfigError,
    TrainConfig,
    compose,
    from_container,
    from_dict,
    group_options,
    load_config,
    override_number,
)
from core.config import hf as hf_config
from core.memory.breakdown import breakdown
from core.memory.estimate import estimate_memory_bytes
from core.perf import StepEstimate, check_devices, estimate_step

DEFAULT_COMMAND: tuple[str, ...] = (sys.executable, "-m", "core.train")
SUMMARY = "trial_summary.json"
# Used when the overrides give no wall budget: a trial bounded only by steps still must not hang forever.
DEFAULT_WALL_SEC = 3600.0
STDERR_TAIL_CHARS = 2000


# ---- a trial's budget, and what it leaves behind ------------------------------------------------------------


def watchdog_seconds(overrides: Sequence[str]) -> float:
    """How long to let a trial run: its own wall budget and grace, plus a margin for start-up and writing."""
    wall = override_number(overrides, "trial.max_wall_time_sec", None) or DEFAULT_WALL_SEC
    grace = override_number(overrides, "trial.grace_sec", DEFAULT_GRACE_SEC)
    return wall + grace + max(10.0, 0.1 * wall)


def load_summary(path: Path) -> dict | None:
    """A trial summary, or None when it is missing or torn (the core writes atomically; a fake trial might not)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_result(
    trial_dir: str | Path, exit_code: int | None, objective_metric: str | None = None, wall_time: float | None = None
) -> TrialResult:
    """Build a TrialResult from a trial directory and the process's exit code (None when unknown)."""
    trial_dir = Path(trial_dir)
    summary = load_summary(trial_dir / SUMMARY)
    if summary is not None:
        status = (
            Status(summary["status"])
            if summary.get("status") in Status._value2member_map_
            else Status.of_exit(summary.get("exit_code"))
        )
        reason = str(summary.get("reason") or "")
        wall = summary.get("wall_time_sec") if wall_time is None else wall_time
    else:
        status, reason = _classify_without_summary(exit_code)
        tail = stderr_tail(trial_dir)
        if tail:
            reason = f"{reason}; stderr tail: {tail}"
        wall = wall_time
    objective = _objective(summary, objective_metric) if status == Status.OK else None
    return TrialResult(
        status=status,
        exit_code=exit_code,
        reason=reason,
        summary=summary,
        objective=objective,
        wall_time=float(wall or 0.0),
        trial_dir=trial_dir,
    )


def _classify_without_summary(exit_code: int | None) -> tuple[Status, str]:
    if exit_code is None:
        return Status.ERROR, f"no {SUMMARY} and no exit code"
    if exit_code < 0:
        name = signal.Signals(-exit_code).name if -exit_code in signal.Signals._value2member_map_ else -exit_code
        hint = " (possibly the host's OOM killer)" if exit_code == -signal.SIGKILL else ""
        return Status.ERROR, f"killed by signal {name}{hint}; no {SUMMARY}"
    status = Status.of_exit(exit_code)
    if status == Status.OK:
        return Status.ERROR, f"exited 0 but wrote no {SUMMARY}"
    return status, f"exited {exit_code} ({status}) without writing {SUMMARY}"


def stderr_tail(trial_dir: Path, limit: int = STDERR_TAIL_CHARS) -> str:
    try:
        with open(trial_dir / "stderr.log", "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _objective(summary: dict | None, metric: str | None) -> float | None:
    if summary is None or metric is None:
        return None
    value = (summary.get("metrics") or {}).get(metric)
    return float(value) if is_number(value) else None


# ---- the memory estimate -----------------------------------------------------------------------------------------


def estimate_with_core(overrides: Sequence[str]) -> int | None:
    """Per-rank memory estimate of a config from the core's analytic model, without MindSpore or a run.

    None when the core cannot estimate it (e.g. the config is invalid: the trial itself will say why). Cached in
    the process: composing the Hydra config takes a noticeable fraction of a second (benchmarks/RESULTS.md,
    "autoresearch/core_adapter.py"), and a proposer may rank hundreds of configs.
    """
    return _estimate(tuple(overrides))


@functools.lru_cache(maxsize=8192)
def _estimate(overrides: tuple[str, ...]) -> int | None:
    try:
        return int(estimate_memory_bytes(load_config(list(overrides))))
    except (ConfigError, ValueError):
        return None


@functools.lru_cache(maxsize=1024)
def memory_breakdown(overrides: tuple[str, ...] | None) -> tuple[dict | None, str]:
    """(``core.memory.breakdown`` of the config, "") or (None, why there is none). Cached: composing a config
    takes a noticeable fraction of a second (benchmarks/RESULTS.md, "autoresearch/core_adapter.py"), and a study
    repeats configs across its failures and skips."""
    if not overrides:
        return None, "no config to estimate (neither a trial summary nor the space file)"
    try:
        return breakdown(load_config(list(overrides))), ""
    except ValueError as exc:  # ConfigError: a key the core does not know, a rule broken
        return None, f"not a config the core knows ({exc})"


# ---- the config schema -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CoreSchema:
    """The keys ``python -m core.train`` accepts: each field with its type, and each config group with its
    options (the files under ``configs/<group>/``)."""

    fields: dict  # "training.micro_batch_size" -> Optional[int]; "seed" -> int
    groups: dict  # "model" -> ("medium", "moe-small", "moe-tiny", "small", "tiny")


@functools.cache
def core_schema() -> CoreSchema:
    fields: dict = {}
    hints = get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        section = hints[f.name]
        if dataclasses.is_dataclass(section):
            sub = get_type_hints(section)
            fields.update({f"{f.name}.{g.name}": sub[g.name] for g in dataclasses.fields(section)})
        else:
            fields[f.name] = section
    groups = {d.name: tuple(group_options(d.name)) for d in sorted(CONFIG_DIR.iterdir()) if d.is_dir()}
    return CoreSchema(fields, groups)


@functools.lru_cache(maxsize=64)
def composed(groups: tuple) -> dict:
    """``configs/train.yaml`` composed by Hydra with these group choices, as a plain tree."""
    return OmegaConf.to_container(compose([f"{k}={v}" for k, v in groups]), resolve=True)


def _items(settings: dict[str, Any]) -> tuple:
    """Settings as the cached helpers take them: (key, type name, value); the type name is part of the key, for
    True == 1 hash alike but the core may treat them apart. A list (a fixed value of a list key) as a tuple."""
    return tuple((k, type(v).__name__, tuple(v) if isinstance(v, list) else v) for k, v in settings.items())


def _tree(items: tuple) -> dict:
    """The composed tree of these (key, type name, value) settings; raises ConfigError for a key not in it."""
    schema = core_schema()
    groups = tuple(sorted((k, v) for k, _, v in items if k in schema.groups))
    tree = copy.deepcopy(composed(groups))
    for key, _, value in items:
        if key in schema.groups:
            continue
        head, _, rest = key.partition(".")
        node, leaf = (tree.get(head), rest) if rest else (tree, head)
        if not isinstance(node, dict) or leaf not in node:  # the composition holds every key of the schema
            raise ConfigError(key, f"{leaf} is not a key of the {head} section (python -m core.train --help)")
        node[leaf] = list(value) if isinstance(value, tuple) else value
    return tree


@functools.lru_cache(maxsize=4096)
def _config_error(items: tuple) -> ConfigError | None:
    """The core's ConfigError for these (key, type name, value) settings, or None when the config is valid."""
    try:
        from_container(_tree(items))
    except ConfigError as exc:
        return exc
    return None


def predict_step(settings: dict[str, Any], *, one_host: bool = False) -> StepEstimate:
    """``core.perf``'s prediction for these settings (``key -> value``) on the cluster they name, as
    ``python -m core.perf`` would give it for the same overrides (``planned``)."""
    return estimate_step(planned(settings, one_host=one_host))


def planned(settings: dict[str, Any], *, one_host: bool = False) -> TrainConfig:
    """The config of these settings (``key -> value``) as ``core.perf`` plans it on the cluster they name (the
    device is the cluster's; the ranks must be its devices); raises ConfigError naming the field. The values must
    have the schema's types, as a loaded space's have (``autoresearch.space.core_check.value_problem``; override
    text through ``core.config.parse_overrides`` first): the tree composed once per group choice is rebuilt with
    the dataclasses' own rules (``from_dict``), without OmegaConf's type pass, which would take most of the time
    of a plan of thousands of points.

    ``one_host``: settings that size no cluster (neither ``cluster.nodes`` nor ``cluster.devices_per_node``) are
    predicted on one node of as many devices as the layout has ranks, which is how the agent runs a trial of a
    space for this machine: every rank on this host."""
    tree = _tree(_items(settings))
    if "device" not in settings:
        tree["device"] = tree["cluster"]["device"]
    if one_host and not {"cluster.nodes", "cluster.devices_per_node"} & settings.keys():
        degrees = ("dp_replicate", "dp_shard", "tp", "pp", "cp")  # ParallelConfig.world_size's factors
        tree["cluster"]["nodes"], tree["cluster"]["devices_per_node"] = (
            1,
            math.prod(tree["parallel"][k] for k in degrees),
        )
    cfg = from_dict(tree)
    check_devices(cfg)
    return cfg


def cluster_device(settings: dict[str, Any]) -> str:
    """The device of the cluster these settings name (``CPU`` for cpu-local)."""
    return str(_tree(_items(settings))["cluster"]["device"])


def default_values(settings: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The value the core's config gives each of ``keys`` (dotted, not group choices) under these settings: what a
    trial that does not set the key runs with."""
    tree = _tree(_items(settings))
    out = {}
    for key in keys:
        head, _, rest = key.partition(".")
        node = tree.get(head) if rest else tree
        if isinstance(node, dict) and (rest or head) in node and not isinstance(node[rest or head], dict):
            out[key] = node[rest or head]  # (a group's choice composes to a section: not a value)
    return out


def default_point(settings: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """What a trial with only ``settings`` runs each of ``keys`` at: the config's value as the core resolves it (a
    null ``training.micro_batch_size`` is the whole per-rank batch), a group's default option (``optim``:
    ``adamw``). Where the settings alone break a rule (a cluster space's fixed part sizes no layout), the value
    the composition gives, unresolved. A key the core does not have is left out."""
    items = _items(settings)
    tree, schema = _tree(items), core_schema()
    try:
        cfg = from_dict(copy.deepcopy(tree))
    except (ConfigError, TypeError, ValueError):
        cfg = None
    out = {}
    for key in keys:
        if key in schema.groups:
            out[key] = settings.get(key, _default_groups().get(key))
            continue
        head, _, rest = key.partition(".")
        section = getattr(cfg, head, None) if rest else cfg
        if section is not None and hasattr(section, rest or head):
            out[key] = getattr(section, rest or head)
        elif isinstance(node := tree.get(head) if rest else tree, dict) and (rest or head) in node:
            out[key] = node[rest or head]
    return out


@functools.cache
def _default_groups() -> dict[str, str]:
    """Each config group's default option, from the defaults list of ``configs/train.yaml``."""
    doc = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "train.yaml"))
    return {k: v for entry in doc.get("defaults", []) if isinstance(entry, dict) for k, v in entry.items()}


def hf_model_problem(value: str) -> str | None:
    """Why ``model=<value>`` (``hf:<dir or config.json>``, a Hugging Face config in place of a preset) cannot
    run: unreadable, or an architecture or field the core does not build; None when it can."""
    try:
        hf_config.read(value)
    except ConfigError as e:
        return str(e)
    return None


def config_error(settings: dict[str, Any]) -> ConfigError | None:
    """``core.config``'s verdict on these settings (``key -> value``, as overrides would give them): the same
    rules ``load_config`` runs on a trial's overrides, on a tree composed once per group choice (several times
    faster per config than a full Hydra compose: benchmarks/RESULTS.md, "autoresearch/core_adapter.py")."""
    return _config_error(_items(settings))
