"""Trials whose agent is gone: telling them from trials another live agent runs, ending their orphaned processes,
and running their configs again. Killing an agent loses nothing: a restart with the same study reaps what it left
RUNNING, and a trial the agent itself stops (Ctrl-C, SIGTERM) is abandoned the same way.

Whose is a RUNNING trial: every trial is tagged with its agent (host, pid, the process's start time, to tell a
live agent from a reused pid) the moment it is asked, and heartbeats while its process runs. On this host the
agent is checked directly; on another, a trial whose heartbeat is older than ``HEARTBEAT_GRACE_SEC`` is stale.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from autoresearch.records import Attr, Status
from autoresearch.study.storage import is_confirmation
from core.trial.processes import kill_group

REAP_REASON = "agent died while running; reaped on resume"
HEARTBEAT_GRACE_SEC = 600.0  # a trial of another host whose agent was silent this long is stale
# study.ask and mark_running's tag are two writes: an agent that starts between them (another agent, same study)
# must not take the trial for one whose agent died (seen under load: its owner then crashed telling the result)
UNTAGGED_GRACE_SEC = 60.0


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks (/proc), to tell a live process from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]  # a zombie is dead; fields[19] = starttime


def alive(pid: int | None, start: str | None) -> bool:
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
    trial.set_user_attr(Attr.AGENT, identity())
    trial.set_user_attr(Attr.HEARTBEAT, time.time())
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


def _is_stale(t: FrozenTrial, now: float) -> bool:
    agent = t.user_attrs.get(Attr.AGENT)
    if not agent:  # asked but not tagged: its agent died in between, or is about to tag it
        return t.datetime_start is None or now - t.datetime_start.timestamp() > UNTAGGED_GRACE_SEC
    if agent.get("host") == socket.gethostname():
        return not alive(agent.get("pid"), agent.get("start"))
    return now - float(t.user_attrs.get(Attr.HEARTBEAT) or 0.0) > HEARTBEAT_GRACE_SEC


def reap_stale(
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    now: float | None = None,
    adopt: Callable[[FrozenTrial], str | None] | None = None,
) -> list[str]:
    """FAIL the RUNNING trials whose agent is gone, end their orphaned processes, and enqueue them again; returns
    a line on each RUNNING trial for the agent to show. ``adopt(trial)`` is asked first: a trial whose job still
    runs (or ended unseen) under a scheduler is taken over by this agent instead (it returns the line to show)."""
    notes, now = [], time.time() if now is None else now
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not _is_stale(t, now):
            notes.append(f"trial {t.number} is running under a live agent {t.user_attrs.get(Attr.AGENT)}; left alone")
            continue
        if adopt is not None and (note := adopt(t)):
            set_trial_attrs(study, storage, t.number, **{Attr.AGENT: identity(), Attr.HEARTBEAT: time.time()})
            notes.append(note)
            continue
        orphan = t.user_attrs.get(Attr.TRIAL_PID) or {}
        if orphan.get("host") == socket.gethostname() and alive(orphan.get("pid"), orphan.get("start")):
            kill_group(orphan["pid"])
        notes.append(f"trial {t.number}: {REAP_REASON}" + abandon(study, storage, t, Status.REAPED, REAP_REASON))
    return notes


def abandon(
    study: optuna.Study, storage: optuna.storages.BaseStorage, t: FrozenTrial, status: Status, reason: str
) -> str:
    """FAIL a trial that did not end on its own (its agent died or was stopped, its node failed, it was preempted
    or a person cancelled it) and queue its config again, once: a config that keeps killing its agent is not
    retried forever, and one a person cancelled is not retried. Returns what happens to the config."""
    set_trial_attrs(study, storage, t.number, **{Attr.STATUS: status, Attr.REASON: reason})
    study.tell(t.number, state=TrialState.FAIL)
    if status == Status.CANCELLED:
        return "; a person cancelled it, so its config is not queued again"
    if not t.params or Attr.RETRY_OF in t.user_attrs:
        return ""
    if is_confirmation(t):  # the confirmation phase counts what is missing and runs it again by itself
        return "; the confirmation phase will run it again"
    study.enqueue_trial(
        t.params,
        user_attrs={
            Attr.PROPOSER: t.user_attrs.get(Attr.PROPOSER, "sampler"),
            Attr.RETRY_OF: t.number,
            Attr.RATIONALE: f"rerun of trial {t.number} ({status})",
        },
    )
    return "; its config is queued to run again"


def set_trial_attrs(study: optuna.Study, storage: optuna.storages.BaseStorage, number: int, **attrs: Any) -> None:
    """Annotate trial ``number`` of ``study`` through the storage's public API: a trial another agent asked for has
    no ``Trial`` handle here."""
    trial_id = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)
    for key, value in attrs.items():
        storage.set_trial_user_attr(trial_id, key, value)
