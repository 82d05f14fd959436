"""Carry a study's winner into the training stack you run.

    python -m autoresearch.export trials/<study> --to mindformers     # YAML fragment for MindFormers
    python -m autoresearch.export trials/<study> --to torchtitan --out tuned_recipe.py   # torchtitan recipe
    torchrun ... -m torchtitan.train --module tuned_recipe --config tuned   # torchtitan 0.3.0, once BASE is set
    python -m autoresearch.export trials/<study> --to overrides --out winner.txt
    python -m core.train $(cat winner.txt) trial.dir=trials/manual/rerun   # the winner again, on the core
    python -m autoresearch.export --storage postgresql://... --study NAME --to ... [--trial N]

The trial is ``--trial N`` or ``winner(study)``. Its config is the resolved one the core ran (the ``config`` of its
trial_summary.json), else composed from the summary's overrides, else from the study's space and the trial's
params; the output's header says which. The MindFormers fragment and the torchtitan recipe follow the tables in
``autoresearch.export.targets``; their headers list every core key the target has no counterpart for, once per
reason (the model's forty keys share one line: the base recipe holds the model). The torchtitan recipe is a Python module (torchtitan 0.3.0 reads no TOML): ``apply(config)`` sets the tuned
fields on any ``Trainer.Config``, and ``tuned()`` applies them to the base recipe named by its ``BASE`` line, which
holds the model, data and tokenizer the study did not tune (``autoresearch.export.recipe``).

``--to overrides`` writes every key of the resolved config (trial.dir aside), not only those that differ from the
defaults: the defaults live in configs/*.yaml and move with the code, and a key set only by a group preset
(``model=moe-tiny``) would otherwise be lost. The file holds overrides only,
one per line, because ``$(cat FILE)`` hands every word to core.train; its header goes to stderr instead.

Modules:

    targets/     the tables from the core's config to each stack's keys, and back
    formats.py   the text of the YAML fragment and of the core's overrides
    recipe.py    the torchtitan recipe (a Python module), and the way back from a loaded one
    __main__.py  the command line
"""

from __future__ import annotations

import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autoresearch.core_adapter import SUMMARY, load_summary
from autoresearch.export.formats import ExportError, to_overrides, yaml_text
from autoresearch.export.recipe import recipe_text
from autoresearch.export.targets import TARGETS, export_config, flatten
from autoresearch.records import Attr, Status
from autoresearch.space import SpaceError, load_space
from autoresearch.study.confirm import recorded_verdict
from autoresearch.study.storage import best_trial, status_of
from core.config import ConfigError, from_container, load_config, scalar_text, to_dict

CHOICES = (*TARGETS, "overrides")
HEADER_WIDTH = 120  # a header's comment lines wrap here


def winner(study: optuna.Study) -> FrozenTrial | None:
    """The trial whose config the study recommends: the search trial of the confirmed winner when the
    confirmation named one (``autoresearch.study.confirm``), else the search's best run (the header says which)."""
    v = recorded_verdict(study)
    if v is not None and v.winner is not None:
        return study.get_trials(deepcopy=False)[v.winner.trial]
    return best_trial(study)


def standing(study: optuna.Study, trial: FrozenTrial) -> str:
    """What the study's confirmation says of this trial's config, for the header."""
    v = recorded_verdict(study)
    if v is None:
        return "not confirmed (the study has no confirmation runs: a single run's ranking)"
    if v.winner is not None and v.winner.trial == trial.number:
        return f"the confirmed winner: {v.line}"
    return f"not the confirmed winner: {v.line}"


def pick_trial(study: optuna.Study, number: int | None = None) -> FrozenTrial:
    """Trial ``number``, or the winner; it must have run ok (a failed trial's config is not a result)."""
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    if number is None:
        trial = winner(study)
        if trial is None:
            statuses = Counter(status_of(t) for t in trials.values())
            seen = ", ".join(f"{n} {s}" for s, n in statuses.most_common()) or "no trials"
            raise ExportError(
                f"study {study.study_name!r} has no feasible trial (none ran ok with an objective; "
                f"{seen}): run more trials, or pick one with --trial N"
            )
    elif number not in trials:
        span = f"trials 0..{max(trials)}" if trials else "no trials"
        raise ExportError(f"--trial {number}: study {study.study_name!r} has no such trial ({span})")
    else:
        trial = trials[number]
    status = status_of(trial)
    if status != Status.OK:
        reason = trial.user_attrs.get(Attr.REASON) or "no reason recorded"
        raise ExportError(
            f"trial {trial.number} did not run ok (status {status}: {reason}); only an ok trial's "
            "config is a result: pick another with --trial (python -m autoresearch.report lists them)"
        )
    return trial


@dataclass
class Resolved:
    config: dict  # the core's resolved config, nested as in a trial summary
    source: str  # where it came from, for the header


def resolved_config(study: optuna.Study, trial: FrozenTrial) -> Resolved:
    """The config the trial ran, validated by the core's schema and rules (core.config)."""
    problems = []
    trial_dir = trial.user_attrs.get(Attr.TRIAL_DIR)
    summary_path = Path(trial_dir) / SUMMARY if trial_dir else None
    summary = load_summary(summary_path) if summary_path is not None else None
    if summary is not None:
        if summary.get("config"):
            try:
                return Resolved(to_dict(from_container(summary["config"])), f"{summary_path} (its resolved config)")
            except ConfigError as exc:
                problems.append(f"the config in {summary_path} is not the core's: {exc}")
        try:
            return Resolved(
                to_dict(load_config(summary.get("overrides") or [])), f"{summary_path} (composed from its overrides)"
            )
        except ConfigError as exc:
            problems.append(f"the overrides in {summary_path} do not compose: {exc}")
    else:
        problems.append(f"trial {trial.number} has no trial summary ({summary_path or 'no trial_dir recorded'})")
    space_path = study.user_attrs.get(Attr.SPACE_PATH)
    if space_path:
        try:
            overrides = load_space(space_path).overrides(dict(trial.params))
            return Resolved(to_dict(load_config(overrides)), f"the space {space_path} with the trial's params")
        except (SpaceError, ValueError, OSError) as exc:  # ConfigError is a ValueError
            problems.append(f"the space {space_path} does not give it: {exc}")
    else:
        problems.append("the study records no space_path")
    raise ExportError(f"cannot resolve trial {trial.number}'s config: " + "; ".join(problems))


# --- output ------------------------------------------------------------------------------------------------------


def value_text(v: Any) -> str:
    """A value as configs write it: null, true, 0.001, [1,2]."""
    return "[" + ",".join(value_text(x) for x in v) + "]" if isinstance(v, list) else scalar_text(v)


def header(
    study: optuna.Study, trial: FrozenTrial, resolved: Resolved, title: str, dropped: dict[str, tuple[Any, str]]
) -> list[str]:
    metric = study.user_attrs.get(Attr.OBJECTIVE_METRIC, "objective")
    direction = study.direction.name.lower()
    objective = trial.user_attrs.get(Attr.OBJECTIVE, trial.value)
    measured = "not recorded" if objective is None else f"{objective:.6g}"
    lines = [
        title,
        f"exported by autoresearch.export from study {study.study_name!r}, trial {trial.number}: "
        f"{metric} = {measured} ({direction})",
        f"config: {resolved.source}",
        f"standing: {standing(study, trial)}",
    ]
    by_reason: dict[str, list[str]] = {}
    for key, (value, reason) in dropped.items():
        by_reason.setdefault(reason, []).append(f"{key}={value_text(value)}")
    out = ["# " + line for line in lines]
    for reason, keys in by_reason.items():  # once per reason: the model's 40 keys share one
        out += textwrap.wrap(
            f"not exported ({reason}): {', '.join(keys)}",
            HEADER_WIDTH,
            initial_indent="# ",
            subsequent_indent="#   ",
            break_long_words=False,
            break_on_hyphens=False,
        )
    return out


@dataclass
class Output:
    text: str  # what goes to the file (or stdout)
    header: list[str]  # the comment header; inside ``text`` except for overrides


def export_trial(study: optuna.Study, trial: FrozenTrial, to: str) -> Output:
    resolved = resolved_config(study, trial)
    if to == "overrides":
        dropped = {"trial.dir": (resolved.config["trial"]["dir"], "a re-run writes its own: add trial.dir=...")}
        head = header(study, trial, resolved, "core.train overrides: python -m core.train $(cat FILE)", dropped)
        return Output("\n".join(to_overrides(resolved.config)) + "\n", head)
    target = TARGETS[to]
    exported = export_config(target, flatten(resolved.config))
    head = header(study, trial, resolved, target.title, exported.dropped)
    if to == "torchtitan":
        return Output(recipe_text(exported.doc, head), head)
    return Output("\n".join(head) + "\n" + yaml_text(exported.doc), head)
