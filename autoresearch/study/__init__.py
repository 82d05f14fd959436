"""The study: every trial recorded in an ordinary Optuna study (SQLite by default, PostgreSQL to share it between
agents), read back by the agent on a restart and by the reports.

    connection.py  the storage's connection: a clear error when it cannot open, retries while it is down
    storage.py   opening a study, telling outcomes (states, constraints, user attributes), rows and counts
    reaper.py    trials whose agent is gone: reaped, their processes ended, their configs run again
    confirm.py   the front-runners re-run until their ranking says more than the machine's noise
    ledger.py    what each trial and the study spent: device-seconds (start-up, compile, steps), LLM tokens, dollars
"""

from autoresearch.study import confirm, ledger
from autoresearch.study.connection import StorageUnavailable, open_storage, storage_url
from autoresearch.study.reaper import abandon, mark_running, reap_stale
from autoresearch.study.storage import (
    best_trial,
    finished_count,
    is_confirmation,
    load_study,
    open_study,
    status_of,
    tell_result,
    tell_skipped,
    trial_rows,
)

__all__ = [
    "StorageUnavailable",
    "abandon",
    "best_trial",
    "confirm",
    "finished_count",
    "is_confirmation",
    "ledger",
    "load_study",
    "mark_running",
    "open_storage",
    "open_study",
    "reap_stale",
    "status_of",
    "storage_url",
    "tell_result",
    "tell_skipped",
    "trial_rows",
]
