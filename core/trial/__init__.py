"""The trial contract and everything that keeps it: every run is a bounded trial that stops at a step or wall
budget, leaves ``trial_summary.json`` whatever its end, and exits with a code that says what happened.

    contract.py     Exit codes and statuses, failure classification, reasons a person can act on
    recorder.py     TrialRecorder: what a rank has done, and the summary it becomes (written atomically)
    watchdog.py     ends a rank from the side: memory over budget, alive past its wall budget plus grace, or its
                    supervisor gone
    processes.py    kill_group: ending a trial and every process it started
    supervisor.py   supervise(): a multi-rank trial's scheduler and workers, started as msrun would, their ends
                    merged into one summary (on N nodes, one supervisor per node)
    nodes.py        how the supervisors of a multi-node trial talk: node 0 follows the others, tells them to abort
    fork_server.py  warm starts: trial processes forked from a server that imported MindSpore once

No MindSpore at import: the supervisor and the agent use this package without loading it.
"""

from core.trial.contract import (
    CLASSIFIED,
    SCHEMA,
    STATUS,
    Exit,
    NonFinite,
    OutOfMemory,
    OutOfTime,
    TrialFailure,
    classify,
)
from core.trial.processes import kill_group
from core.trial.recorder import TrialRecorder, write_invalid_summary, write_json_atomic
from core.trial.watchdog import Watchdog

__all__ = [
    "CLASSIFIED",
    "SCHEMA",
    "STATUS",
    "Exit",
    "NonFinite",
    "OutOfTime",
    "OutOfMemory",
    "TrialFailure",
    "TrialRecorder",
    "Watchdog",
    "classify",
    "kill_group",
    "write_invalid_summary",
    "write_json_atomic",
]
