"""Carry a study's winner into the training stack you run.

    python -m autoresearch.export trials/<study> --to mindformers     # YAML fragment for MindFormers
    python -m autoresearch.export trials/<study> --to torchtitan      # TOML fragment for torchtitan
    python -m autoresearch.export trials/<study> --to overrides --out winner.txt
    python -m core.train $(cat winner.txt) trial.dir=trials/manual/rerun   # the winner again, on the core
    python -m autoresearch.export --storage postgresql://... --study NAME --to ... [--trial N]

The trial is ``--trial N`` or ``winner(study)``. Its config is the resolved one the core ran (the ``config`` of its
trial_summary.json), else composed from the summary's overrides, else from the study's space and the trial's
params; the output's header says which. The MindFormers and torchtitan fragments follow the tables in
``autoresearch.targets``; their headers list every core key the target has no counterpart for, with the reason.

``--to overrides`` writes every key of the resolved config (trial.dir aside), not only those that differ from the
defaults: the defaults live in configs/*.yaml and move with the code, and a key set only by a group preset
(``model=moe-tiny``) would otherwise be lost. Keys the default composition lacks (an MoE model's keys on top of the
default dense preset) are written ``++key=value``, which Hydra adds or overrides. The file holds overrides only,
one per line, because ``$(cat FILE)`` hands every word to core.train; its header goes to stderr instead.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import FrozenTrial

from autoresearch.confirm import recorded_verdict
from autoresearch.param import format_override_value, scalar_text
from autoresearch.report import load_study
from autoresearch.storage import best_trial
from autoresearch.targets import TARGETS, export_config, flatten
from core.config import ConfigError, compose, from_container, load_config, to_dict

CHOICES = (*TARGETS, "overrides")


class ExportError(ValueError):
    """A study or trial that has nothing to export; the message says what to do instead."""


def winner(study: optuna.Study) -> FrozenTrial | None:
    """The trial whose config the study recommends: the search trial of the confirmed winner when the
    confirmation named one (``autoresearch.confirm``), else the search's best run (the header says which)."""
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
            statuses = Counter(t.user_attrs.get("status", t.state.name.lower()) for t in trials.values())
            seen = ", ".join(f"{n} {s}" for s, n in statuses.most_common()) or "no trials"
            raise ExportError(f"study {study.study_name!r} has no feasible trial (none ran ok with an objective; "
                              f"{seen}): run more trials, or pick one with --trial N")
    elif number not in trials:
        span = f"trials 0..{max(trials)}" if trials else "no trials"
        raise ExportError(f"--trial {number}: study {study.study_name!r} has no such trial ({span})")
    else:
        trial = trials[number]
    status = trial.user_attrs.get("status", trial.state.name.lower())
    if status != "ok":
        reason = trial.user_attrs.get("reason") or "no reason recorded"
        raise ExportError(f"trial {trial.number} did not run ok (status {status}: {reason}); only an ok trial's "
                          "config is a result: pick another with --trial (python -m autoresearch.report lists them)")
    return trial


@dataclass
class Resolved:
    config: dict   # the core's resolved config, nested as in a trial summary
    source: str    # where it came from, for the header


def resolved_config(study: optuna.Study, trial: FrozenTrial) -> Resolved:
    """The config the trial ran, validated by the core's schema and rules (core.config)."""
    problems = []
    trial_dir = trial.user_attrs.get("trial_dir")
    summary_path = Path(trial_dir) / "trial_summary.json" if trial_dir else None
    if summary_path is not None and summary_path.exists():
        summary = json.loads(summary_path.read_text())
        if summary.get("config"):
            try:
                return Resolved(to_dict(from_container(summary["config"])), f"{summary_path} (its resolved config)")
            except ConfigError as exc:
                problems.append(f"the config in {summary_path} is not the core's: {exc}")
        try:
            return Resolved(to_dict(load_config(summary.get("overrides") or [])),
                            f"{summary_path} (composed from its overrides)")
        except ConfigError as exc:
            problems.append(f"the overrides in {summary_path} do not compose: {exc}")
    else:
        problems.append(f"trial {trial.number} has no trial summary ({summary_path or 'no trial_dir recorded'})")
    space_path = study.user_attrs.get("space_path")
    if space_path:
        from autoresearch.space import SpaceError, load_space

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


def header(study: optuna.Study, trial: FrozenTrial, resolved: Resolved, title: str,
           dropped: dict[str, tuple[Any, str]]) -> list[str]:
    metric = study.user_attrs.get("objective_metric", "objective")
    direction = study.direction.name.lower()
    objective = trial.user_attrs.get("objective", trial.value)
    measured = "not recorded" if objective is None else f"{objective:.6g}"
    lines = [title,
             f"exported by autoresearch.export from study {study.study_name!r}, trial {trial.number}: "
             f"{metric} = {measured} ({direction})",
             f"config: {resolved.source}",
             f"standing: {standing(study, trial)}"]
    lines += [f"not exported: {key}={value_text(value)} — {reason}" for key, (value, reason) in dropped.items()]
    return ["# " + line for line in lines]


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
    from omegaconf import OmegaConf

    known = flatten(OmegaConf.to_container(compose([]), resolve=True))
    lines = []
    for key, value in flat.items():
        text = "[" + ",".join(format_override_value(x) for x in value) + "]" if isinstance(value, list) \
            else format_override_value(value)
        if any(ch.isspace() for ch in text):
            raise ExportError(f"{key}={text} holds whitespace, which `$(cat FILE)` would split; export another "
                              "target or pass this key by hand")
        lines.append(f"{'' if key in known else '++'}{key}={text}")
    return lines


@dataclass
class Output:
    text: str            # what goes to the file (or stdout)
    header: list[str]    # the comment header; inside ``text`` except for overrides


def export_trial(study: optuna.Study, trial: FrozenTrial, to: str) -> Output:
    resolved = resolved_config(study, trial)
    if to == "overrides":
        dropped = {"trial.dir": (resolved.config["trial"]["dir"], "a re-run writes its own: add trial.dir=...")}
        head = header(study, trial, resolved, "core.train overrides: python -m core.train $(cat FILE)", dropped)
        return Output("\n".join(to_overrides(resolved.config)) + "\n", head)
    target = TARGETS[to]
    exported = export_config(target, flatten(resolved.config))
    head = header(study, trial, resolved, target.title, exported.dropped)
    body = toml_text(exported.doc) if to == "torchtitan" else yaml_text(exported.doc)
    return Output("\n".join(head) + "\n" + body, head)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autoresearch.export", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("study_dir", nargs="?", help="a study directory, trials/<study> (reads its study.db)")
    ap.add_argument("--storage", help="SQLAlchemy URL of the study storage instead of <study_dir>/study.db")
    ap.add_argument("--study", help="study name (default: the only study in the storage, or the dir's name)")
    ap.add_argument("--to", required=True, choices=CHOICES, help="the config to write")
    ap.add_argument("--trial", type=int, help="export this trial (default: the study's winner)")
    ap.add_argument("--out", help="write to this file (default: stdout)")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_study(args.study_dir, args.storage, args.study)
    try:
        output = export_trial(study, pick_trial(study, args.trial), args.to)
    except (ExportError, ConfigError) as exc:
        print(f"autoresearch.export: {exc}", file=sys.stderr)
        return 2
    if args.to == "overrides":
        print("\n".join(output.header), file=sys.stderr)
    if args.out:
        Path(args.out).write_text(output.text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(output.text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
