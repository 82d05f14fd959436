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
  llm_usage, predicted/estimated_memory_bytes, agent (host, pid) and heartbeat_at while running, and ``ledger``
  (device-seconds split into start-up, compile and steps, LLM tokens and dollars: ``autoresearch.ledger``) once told;
  on a confirmation run (``autoresearch.confirm``) confirmation_of (the search trial whose config it repeats) and
  repeat.
- Study attributes: space, objective_metric, direction, param_names, space_path, world_size (the ranks a trial
  is given: the ledger's ranks for a trial that left no summary).
- ``--trials N`` means: the study holds N COMPLETE or PRUNED trials, not counting points rejected by the
  space's constraints nor repeats of a config that ran ok (status ``duplicate``; after a few of either in a row the
  agent enqueues an unseen valid random config, so a sampler stuck on one point, or on points the space's
  constraints reject, cannot spend the budget or the session). FAILed trials don't count; the config of a trial abandoned by its agent (``reaped``
  after a crash, ``interrupted`` by Ctrl-C) is enqueued again, once.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from autoresearch import ledger
from autoresearch.outcomes import CONSTRAINT_KEYS, FAILURE_KINDS, TrialResult
from autoresearch.runner import kill_group

REAP_REASON = "agent died while running; reaped on resume"
HEARTBEAT_GRACE_SEC = 600.0  # a trial of another host whose agent was silent this long is stale
# study.ask and mark_running's tag are two writes: an agent that starts between them (another agent, same study)
# must not take the trial for one whose agent died (seen under load: its owner then crashed telling the result)
UNTAGGED_GRACE_SEC = 60.0


def default_storage(trials_dir: str | Path, study_name: str) -> str:
    path = Path(trials_dir) / study_name / "study.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def storage_url(url: str) -> str:
    """The SQLAlchemy URL to open. A PostgreSQL URL without a driver (``postgresql://``) means psycopg2 to
    SQLAlchemy; the project ships psycopg 3, so such a URL is opened with ``postgresql+psycopg://``."""
    scheme, sep, rest = url.partition("://")
    return f"postgresql+psycopg://{rest}" if sep and scheme in ("postgresql", "postgres") else url


def _rdb_storage(url: str, attempts: int = 5) -> optuna.storages.RDBStorage:
    """Optuna creates its tables when it first opens a database. Agents started together on a fresh PostgreSQL
    database race on that (measured: "duplicate key ... CREATE TYPE studydirection"); the loser tries again and
    then finds the tables made."""
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    for attempt in range(1, attempts):
        try:
            return optuna.storages.RDBStorage(url)
        except (IntegrityError, ProgrammingError):
            time.sleep(0.2 * attempt)
    return optuna.storages.RDBStorage(url)


def open_study(space, study_name: str, storage: str, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """Create the study or load it to resume; refuse to mix two spaces or directions in one study."""
    storage = _rdb_storage(storage_url(storage))
    study = optuna.create_study(study_name=study_name, storage=storage, sampler=sampler,
                                direction=space.direction, load_if_exists=True)
    known = study.user_attrs.get("space")
    if known is not None and known != space.name:
        raise SystemExit(f"study {study_name!r} holds trials of space {known!r}, not {space.name!r}; "
                         "pick another --study")
    if study.direction.name.lower() != space.direction:
        raise SystemExit(f"study {study_name!r} {study.direction.name.lower()}s; space {space.name!r} "
                         f"{space.direction}s its objective")
    for key, value in (("space", space.name), ("objective_metric", space.objective_metric),
                       ("direction", space.direction), ("param_names", list(space.params)),
                       ("space_path", str(space.path)), ("world_size", space.world_size)):
        study.set_user_attr(key, value)
    return study


# --- this agent, and whether the agent that owns a RUNNING trial is still alive ---

def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks (/proc), to tell a live process from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]  # a zombie is dead; fields[19] = starttime


def _alive(pid: int | None, start: str | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now = _process_start(pid)
    if os.path.exists("/proc/self/stat") and now is None:
        return False  # gone or a zombie
    return start is None or now == start


def identity(pid: int | None = None) -> dict:
    pid = os.getpid() if pid is None else pid
    return {"host": socket.gethostname(), "pid": pid, "start": _process_start(pid)}


def mark_running(trial: Trial, **attrs: Any) -> None:
    """Tag a trial with its agent first thing, so that a restart can tell whether its owner is alive."""
    trial.set_user_attr("agent", identity())
    trial.set_user_attr("heartbeat_at", time.time())
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


def _is_stale(t: FrozenTrial, now: float) -> bool:
    agent = t.user_attrs.get("agent")
    if not agent:  # asked but not tagged: its agent died in between, or is about to tag it
        return t.datetime_start is None or now - t.datetime_start.timestamp() > UNTAGGED_GRACE_SEC
    if agent.get("host") == socket.gethostname():
        return not _alive(agent.get("pid"), agent.get("start"))
    return now - float(t.user_attrs.get("heartbeat_at") or 0.0) > HEARTBEAT_GRACE_SEC


def reap_stale(study: optuna.Study, now: float | None = None) -> list[str]:
    """FAIL the RUNNING trials whose agent is gone, end their orphaned processes, and enqueue them again."""
    notes, now = [], time.time() if now is None else now
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not _is_stale(t, now):
            notes.append(f"trial {t.number} is running under a live agent {t.user_attrs.get('agent')}; left alone")
            continue
        orphan = t.user_attrs.get("trial_pid") or {}
        if orphan.get("host") == socket.gethostname() and _alive(orphan.get("pid"), orphan.get("start")):
            kill_group(orphan["pid"])
        notes.append(f"trial {t.number}: {REAP_REASON}" + abandon(study, t, "reaped", REAP_REASON))
    return notes


def abandon(study: optuna.Study, t: FrozenTrial, status: str, reason: str) -> str:
    """FAIL a trial that did not end on its own (the agent died or was stopped) and queue its config again,
    once: a config that keeps killing its agent is not retried forever."""
    _set_attrs(study, t, status=status, reason=reason)
    study.tell(t.number, state=TrialState.FAIL)
    if not t.params or "retry_of" in t.user_attrs:
        return ""
    if is_confirmation(t):  # the confirmation phase counts what is missing and runs it again by itself
        return "; the confirmation phase will run it again"
    study.enqueue_trial(t.params, user_attrs={
        "proposer": t.user_attrs.get("proposer", "sampler"), "retry_of": t.number,
        "rationale": f"rerun of trial {t.number} ({status})"})
    return "; its config is queued to run again"


def _set_attrs(study: optuna.Study, t: FrozenTrial, **attrs: Any) -> None:
    # A FrozenTrial has no live handle; the storage API is the public way to annotate another agent's trial.
    for key, value in attrs.items():
        study._storage.set_trial_user_attr(t._trial_id, key, value)


# --- telling outcomes ---

def _constraints(trial: Trial, violated: str | None) -> None:
    for key in CONSTRAINT_KEYS:
        trial.set_constraint(key, 1.0 if key == violated else 0.0)
    trial.set_user_attr("failure_kind", violated)


def is_confirmation(t: FrozenTrial | Trial) -> bool:
    """A re-run of a front-runner's config after the search (``autoresearch.confirm``), not a search trial."""
    return "confirmation_of" in t.user_attrs


def feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and all(v <= 0.0 for v in t.constraints.values()) \
        and t.user_attrs.get("objective") is not None


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The search's best feasible trial, or None: unlike ``study.best_trial`` it never raises. Confirmation
    runs are left out: a repeat that happened to run fast is not a better config (``confirm.verdict`` says which
    config won)."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if feasible(t) and not is_confirmation(t)]
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


def tell_result(study: optuna.Study, trial: Trial, result: TrialResult) -> TrialState:
    """Record a trial that ran; returns the state it was told."""
    metrics = {k: v for k, v in result.metrics.items() if not isinstance(v, float) or v == v}
    reason = result.reason
    if result.status == "ok" and result.objective is None:
        reason = f"objective metric {study.user_attrs.get('objective_metric')!r} missing in the summary; {reason}"
    cost = ledger.trial_ledger(result.summary, result.wall_time, trial.user_attrs.get("llm_usage"),
                               study.user_attrs.get("world_size"))
    for key, value in (("status", result.status), ("exit_code", result.exit_code), ("reason", reason),
                       ("objective", result.objective), ("metrics", metrics),
                       ("wall_time_sec", round(result.wall_time, 3)), ("trial_dir", str(result.trial_dir)),
                       ("ledger", cost)):
        trial.set_user_attr(key, value)
    if result.status == "ok" and result.objective is not None:
        _constraints(trial, None)
        study.tell(trial, result.objective)
        return TrialState.COMPLETE
    if result.status in FAILURE_KINDS:
        _constraints(trial, result.status)
        study.tell(trial, worst_value(study))
        return TrialState.COMPLETE
    study.tell(trial, state=TrialState.FAIL)
    return TrialState.FAIL


def tell_skipped(study: optuna.Study, trial: Trial, status: str, reason: str, kind: str | None) -> None:
    """Record a proposal that did not run (``pruned``, ``duplicate`` or ``rejected``) with the constraint it broke."""
    trial.set_user_attr("status", status)
    trial.set_user_attr("reason", reason)
    trial.set_user_attr("ledger", ledger.skipped_ledger(trial.user_attrs.get("llm_usage")))
    _constraints(trial, kind)
    study.tell(trial, state=TrialState.PRUNED)


def counts_toward_budget(t: FrozenTrial) -> bool:
    return t.state in (TrialState.COMPLETE, TrialState.PRUNED) \
        and t.user_attrs.get("status") not in ("rejected", "duplicate") and not is_confirmation(t)


def finished_count(study: optuna.Study) -> int:
    return sum(counts_toward_budget(t) for t in study.get_trials(deepcopy=False))


def llm_cost(study: optuna.Study) -> float:
    """Dollars spent on LLM proposals over the whole study (every session), from each trial's usage."""
    total = 0.0
    for t in study.get_trials(deepcopy=False):
        usage = t.user_attrs.get("llm_usage") or {}
        total += float(usage.get("cost_usd") or 0.0)
    return total


def trial_rows(study: optuna.Study) -> list[dict]:
    """One plain dict per trial (not WAITING), in trial order: the table for proposers, CSV and reports."""
    rows, ranks = [], study.user_attrs.get("world_size")
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.WAITING:
            continue
        a, metrics = t.user_attrs, t.user_attrs.get("metrics") or {}
        rows.append({
            "number": t.number, "state": t.state.name, "status": a.get("status", t.state.name.lower()),
            "exit_code": a.get("exit_code"), "objective": a.get("objective"), "params": dict(t.params),
            "peak_memory_bytes": metrics.get("peak_memory_bytes"),
            "predicted_memory_bytes": a.get("predicted_memory_bytes"),
            "estimated_memory_bytes": metrics.get("estimated_memory_bytes") or a.get("estimated_memory_bytes"),
            "wall_time_sec": a.get("wall_time_sec"), "proposer": a.get("proposer"),
            "failure_kind": a.get("failure_kind"), "reason": a.get("reason", ""),
            "rationale": a.get("rationale", ""), "trial_dir": a.get("trial_dir"),
            "confirmation_of": a.get("confirmation_of"),
            "ledger": ledger.of_trial(a, t.state.is_finished(), ranks),
        })
    return rows
