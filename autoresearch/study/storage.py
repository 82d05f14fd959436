"""The Optuna study as the agent's record: how outcomes are told, how a restart resumes, what a row holds.

Everything lives in an ordinary Optuna study (SQLite by default, any SQLAlchemy URL otherwise), so that
``optuna.load_study`` and optuna-dashboard read it as it is. The conventions on top of Optuna:

- Trial states. An ``ok`` trial is COMPLETE with the objective. A typed failure (oom, nan, compile_error,
  timeout) is COMPLETE too, told the worst feasible value seen so far and a violated constraint of its kind:
  TPE ignores FAILed trials, but it learns from infeasible COMPLETE ones (and ``study.best_trial`` skips them).
  A proposal skipped without running (feasibility memory, memory gate, duplicate) is PRUNED with the constraint
  that explains it. Errors (exit 1), core-rejected configs (exit 2) and reaped trials are FAIL.
- Constraints are set with ``Trial.set_constraint`` (Optuna 5's replacement for ``constraints_func``), one key
  per failure kind plus ``space`` for a sampler's point that breaks the space's own constraints; >0 = violated.
- User attributes: status, exit_code, reason, objective, metrics, wall_time_sec, trial_dir, proposer (who
  chose the config), fallback_from (``claude`` when Claude was asked, spent ``llm_usage`` and declined), rationale,
  llm_usage, predicted/estimated_memory_bytes, predicted_objective (the step-time model's, with ``--plan``), agent (host, pid) and heartbeat_at while running, and ``ledger``
  (device-seconds split into start-up, compile and steps, LLM tokens and dollars: ``autoresearch.study.ledger``)
  once told; on a confirmation run (``autoresearch.study.confirm``) confirmation_of (the search trial whose config
  it repeats) and repeat. Their names are ``autoresearch.records.Attr``'s.
- Study attributes: space, objective_metric, direction, param_names, space_path, world_size (the ranks a trial
  is given: the ledger's ranks for a trial that left no summary).
- ``--trials N`` means: the study holds N COMPLETE or PRUNED trials, not counting points rejected by the
  space's constraints nor repeats of a config that ran ok (status ``duplicate``; after a few of either in a row the
  agent enqueues an unseen valid random config, so a sampler stuck on one point, or on points the space's
  constraints reject, cannot spend the budget or the session). FAILed trials don't count; the config of a trial
  abandoned by its agent (``reaped`` after a crash, ``interrupted`` by Ctrl-C: ``autoresearch.study.reaper``) is
  enqueued again, once.

Only Optuna's public API: the study's, and the storage's (``BaseStorage``) for what a study object cannot do, such
as annotating a trial another agent asked for.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from autoresearch.records import (
    ABANDONED,
    CONSTRAINT_KEYS,
    FAILURE_KINDS,
    Attr,
    Skip,
    Status,
    TrialResult,
    TrialRow,
    config_key,
    diverged,
    gain,
    is_number,
)
from autoresearch.study import ledger
from autoresearch.study.connection import open_storage


def default_storage(trials_dir: str | Path, study_name: str) -> str:
    path = Path(trials_dir) / study_name / "study.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def open_study(
    space, study_name: str, storage: optuna.storages.BaseStorage, sampler: optuna.samplers.BaseSampler
) -> optuna.Study:
    """Create the study or load it to resume; refuse to mix two spaces or directions in one study."""
    study = optuna.create_study(
        study_name=study_name, storage=storage, sampler=sampler, direction=space.direction, load_if_exists=True
    )
    known = study.user_attrs.get(Attr.SPACE)
    if known is not None and known != space.name:
        raise SystemExit(
            f"study {study_name!r} holds trials of space {known!r}, not {space.name!r}; pick another --study"
        )
    if study.direction.name.lower() != space.direction:
        raise SystemExit(
            f"study {study_name!r} {study.direction.name.lower()}s; space {space.name!r} "
            f"{space.direction}s its objective"
        )
    for key, value in (
        (Attr.SPACE, space.name),
        (Attr.OBJECTIVE_METRIC, space.objective_metric),
        (Attr.DIRECTION, space.direction),
        (Attr.PARAM_NAMES, list(space.params)),
        (Attr.SPACE_PATH, str(space.path)),
        (Attr.WORLD_SIZE, space.world_size),
        (Attr.BASELINE, space.baseline_point),
    ):
        study.set_user_attr(key, value)
    return study


def load_study(path: str | Path | None = None, storage: str | None = None, study: str | None = None) -> optuna.Study:
    """The study in ``<path>/study.db`` (the agent's default), or ``study`` in ``storage``: for the readers of a
    finished study (report, export)."""
    if storage is None:
        if path is None:
            raise SystemExit("give a study directory (trials/<study>) or --storage URL --study NAME")
        db = Path(path) / "study.db"
        if not db.exists():
            raise SystemExit(f"{db} does not exist: is {path} a study directory written by autoresearch.agent?")
        storage = f"sqlite:///{db}"
    storage = open_storage(storage)
    if study is None:
        names = optuna.get_all_study_names(storage=storage)
        if len(names) != 1:
            wanted = Path(path).name if path is not None else None
            if wanted not in names:
                raise SystemExit(f"{storage.url} holds studies {names}; pick one with --study")
            names = [wanted]
        study = names[0]
    return optuna.load_study(study_name=study, storage=storage)


def status_of(t: FrozenTrial | Trial) -> str:
    """A trial's status: the one recorded, or its state's name while it runs or waits."""
    return t.user_attrs.get(Attr.STATUS) or t.state.name.lower()


def is_confirmation(t: FrozenTrial | Trial) -> bool:
    """A re-run of a front-runner's config after the search (``autoresearch.study.confirm``), not a search trial."""
    return Attr.CONFIRMATION_OF in t.user_attrs


def feasible(t: FrozenTrial) -> bool:
    return (
        t.state == TrialState.COMPLETE
        and all(v <= 0.0 for v in t.constraints.values())
        and t.user_attrs.get(Attr.OBJECTIVE) is not None
    )


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The search's best feasible trial, or None: unlike ``study.best_trial`` it never raises. Confirmation
    runs are left out: a repeat that happened to run fast is not a better config (``confirm.verdict`` says which
    config won)."""
    done = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if feasible(t) and not is_confirmation(t)
    ]
    if not done:
        return None
    pick = max if study.direction.name == "MAXIMIZE" else min
    return pick(done, key=lambda t: t.value)


def worst_value(study: optuna.Study) -> float:
    """The value told for typed failures: the worst feasible objective so far (infinitely bad before any)."""
    values = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if feasible(t)]
    maximize = study.direction.name == "MAXIMIZE"
    if not values:
        return -float("inf") if maximize else float("inf")
    return min(values) if maximize else max(values)


# --- telling outcomes ---


def _constraints(trial: Trial, violated: str | None) -> None:
    for key in CONSTRAINT_KEYS:
        trial.set_constraint(key, 1.0 if key == violated else 0.0)
    trial.set_user_attr(Attr.FAILURE_KIND, violated)


def tell_result(study: optuna.Study, trial: Trial, result: TrialResult) -> TrialState:
    """Record a trial that ran; returns the state it was told."""
    metrics = {k: v for k, v in result.metrics.items() if not isinstance(v, float) or v == v}
    reason = result.reason
    if result.status == Status.OK and result.objective is None:
        reason = f"objective metric {study.user_attrs.get(Attr.OBJECTIVE_METRIC)!r} missing in the summary; {reason}"
    cost = ledger.trial_ledger(
        result.summary, result.wall_time, trial.user_attrs.get(Attr.LLM_USAGE), study.user_attrs.get(Attr.WORLD_SIZE)
    )
    for key, value in (
        (Attr.STATUS, result.status),
        (Attr.EXIT_CODE, result.exit_code),
        (Attr.REASON, reason),
        (Attr.OBJECTIVE, result.objective),
        (Attr.METRICS, metrics),
        (Attr.WALL_TIME, round(result.wall_time, 3)),
        (Attr.TRIAL_DIR, str(result.trial_dir)),
        (Attr.LEDGER, cost),
    ):
        trial.set_user_attr(key, value)
    if result.status == Status.OK and result.objective is not None:
        _constraints(trial, None)
        study.tell(trial, result.objective)
        return TrialState.COMPLETE
    if result.status in FAILURE_KINDS:
        _constraints(trial, result.status)
        study.tell(trial, worst_value(study))
        return TrialState.COMPLETE
    study.tell(trial, state=TrialState.FAIL)
    return TrialState.FAIL


def tell_skipped(study: optuna.Study, trial: Trial, skip: Skip) -> None:
    """Record a proposal that did not run (``pruned``, ``duplicate`` or ``rejected``) with the constraint it broke."""
    trial.set_user_attr(Attr.STATUS, skip.status)
    trial.set_user_attr(Attr.REASON, skip.reason)
    trial.set_user_attr(Attr.LEDGER, ledger.skipped_ledger(trial.user_attrs.get(Attr.LLM_USAGE)))
    _constraints(trial, skip.kind)
    study.tell(trial, state=TrialState.PRUNED)


# --- counting ---


def counts_toward_budget(t: FrozenTrial) -> bool:
    return (
        t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        and status_of(t) not in (Status.REJECTED, Status.DUPLICATE)
        and not is_confirmation(t)
    )


def finished_count(study: optuna.Study) -> int:
    return sum(counts_toward_budget(t) for t in study.get_trials(deepcopy=False))


def llm_cost(study: optuna.Study) -> float:
    """Dollars spent on LLM proposals over the whole study (every session), from each trial's usage."""
    total = 0.0
    for t in study.get_trials(deepcopy=False):
        usage = t.user_attrs.get(Attr.LLM_USAGE) or {}
        total += float(usage.get("cost_usd") or 0.0)
    return total


def recorded_keys(study: optuna.Study) -> dict:
    """The first finished trial of each config, by config key (abandoned trials run again: not counted)."""
    out: dict = {}
    for t in study.get_trials(deepcopy=False):
        if t.state.is_finished() and status_of(t) not in ABANDONED:
            out.setdefault(config_key(t.params), t)
    return out


def trial_rows(study: optuna.Study) -> list[TrialRow]:
    """One row per trial (not WAITING), in trial order: the table for proposers, CSV and reports. Each row that
    reached the objective carries its ratio to the baseline (``records.gain``, against the mean of the baseline
    config's ok runs, search and confirmation alike: the baseline was not selected for being good) and its peak
    memory over the baseline's (their median)."""
    rows, ranks = [], study.user_attrs.get(Attr.WORLD_SIZE)
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.WAITING:
            continue
        a, metrics = t.user_attrs, t.user_attrs.get(Attr.METRICS) or {}
        rows.append(
            TrialRow(
                number=t.number,
                state=t.state.name,
                status=status_of(t),
                exit_code=a.get(Attr.EXIT_CODE),
                objective=a.get(Attr.OBJECTIVE),
                params=dict(t.params),
                peak_memory_bytes=metrics.get("peak_memory_bytes"),
                predicted_memory_bytes=a.get(Attr.PREDICTED_MEMORY),
                estimated_memory_bytes=metrics.get("estimated_memory_bytes") or a.get(Attr.ESTIMATED_MEMORY),
                predicted_objective=a.get(Attr.PREDICTED_OBJECTIVE),
                wall_time_sec=a.get(Attr.WALL_TIME),
                proposer=a.get(Attr.PROPOSER),
                failure_kind=a.get(Attr.FAILURE_KIND),
                reason=a.get(Attr.REASON, ""),
                rationale=a.get(Attr.RATIONALE, ""),
                trial_dir=a.get(Attr.TRIAL_DIR),
                confirmation_of=a.get(Attr.CONFIRMATION_OF),
                ledger=ledger.of_trial(a, t.state.is_finished(), ranks),
                diverged=diverged(metrics),
            )
        )
    _against_baseline(rows, study.user_attrs.get(Attr.BASELINE), study.direction.name == "MAXIMIZE")
    return rows


def _against_baseline(rows: list[TrialRow], baseline: dict | None, maximize: bool) -> None:
    if not baseline:
        return
    key = config_key(baseline)
    for r in rows:
        r.baseline = config_key(r.params) == key
    ran = [r for r in rows if r.baseline and r.status == Status.OK and is_number(r.objective)]
    if not ran:
        return
    value = statistics.fmean(r.objective for r in ran)
    peaks = [r.peak_memory_bytes for r in ran if is_number(r.peak_memory_bytes) and r.peak_memory_bytes > 0]
    peak = statistics.median(peaks) if peaks else None
    for r in rows:
        r.gain = gain(r.objective, value, maximize)
        if peak and is_number(r.peak_memory_bytes):
            r.memory_ratio = r.peak_memory_bytes / peak


def baseline_rows(rows: list[TrialRow]) -> list[TrialRow]:
    """The baseline config's ok runs (search and confirmation), in trial order."""
    return [r for r in rows if r.baseline and r.status == Status.OK and is_number(r.objective)]
