"""What to tell a person about one trial beyond its row: the config it ran, in short, and its memory estimate by
component (the HTML report puts it beside the measured peak, the time split and the reason).

Used by the agent's progress lines (``params_label``) and by the HTML report (``breakdown_text``). The breakdown
is the core's own (``core_adapter.memory_breakdown``, no MindSpore): it needs a config the core knows, so a trial
of another command (the tests' fake trial, with its ``fake.*`` keys) gets a stated reason instead.
"""

from __future__ import annotations

from pathlib import Path

from autoresearch.core_adapter import SUMMARY, load_summary, memory_breakdown
from autoresearch.records import Attr, TrialRow
from autoresearch.space import SpaceError, load_space
from core.memory.breakdown import format_breakdown


def short_names(keys) -> dict[str, str]:
    """Each key's last dotted component (``training.micro_batch_size`` -> ``micro_batch_size``), or the whole key
    where two keys would share one."""
    keys = list(keys)
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last, strict=True)}


def _value(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def params_label(params: dict) -> str:
    """The searched values in one short line: ``tp=2 micro_batch_size=4 recompute=none lr=0.001``."""
    names = short_names(params)
    return " ".join(f"{names[k]}={_value(v)}" for k, v in params.items())


def core_overrides(row: TrialRow, space=None) -> list[str] | None:
    """The overrides a trial ran with (its summary's), else the ones the space gives its params (a skipped
    proposal), else None. ``trial.*`` keys are left out: they do not change the memory estimate."""
    summary = load_summary(Path(row.trial_dir) / SUMMARY) if row.trial_dir else None
    overrides = (summary or {}).get("overrides")
    if not overrides and space is not None:
        try:
            overrides = space.overrides(row.params)
        except ValueError:  # the space changed since this trial: its params are no longer the space's
            return None
    return None if not overrides else [o for o in overrides if not o.lstrip("+").startswith("trial.")]


def breakdown_text(row: TrialRow, space=None) -> tuple[str | None, str]:
    """(``core.memory.format_breakdown`` of a trial's config, "") or (None, why there is none), for one row of
    ``autoresearch.study.storage.trial_rows``; ``space`` (optional) gives skipped proposals a config to estimate."""
    overrides = core_overrides(row, space)
    breakdown, note = memory_breakdown(tuple(overrides) if overrides else None)
    return (format_breakdown(breakdown), "") if breakdown is not None else (None, note)


def study_space(study):
    """The study's space (``Attr.SPACE_PATH``), or None when its file is gone or no longer loads."""
    path = study.user_attrs.get(Attr.SPACE_PATH)
    try:
        return load_space(path) if path and Path(path).exists() else None
    except (SpaceError, ValueError):
        return None
