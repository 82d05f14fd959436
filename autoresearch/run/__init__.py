"""Running a study: a session's search and confirmation, trials side by side in their slots, one trial process.

options.py     AgentOptions: what one session is asked to do (the CLI is generated from it)
session.py     Session: the search, then the confirmation; returns an Outcome and prints nothing
scheduler.py   drive(work, slots): trials side by side, each in its slot, until the work stops
runner.py      run_trial: one trial as a subprocess, its end classified
slots.py       each concurrent trial's share of the cores (taskset) or devices
"""

from autoresearch.run.options import PROPOSERS, AgentOptions
from autoresearch.run.runner import Interrupted, run_trial
from autoresearch.run.session import Listener, Outcome, Phase, Session, TrialEvent
from autoresearch.run.slots import Slot, make_slots

__all__ = [
    "PROPOSERS",
    "AgentOptions",
    "Interrupted",
    "Listener",
    "Outcome",
    "Phase",
    "Session",
    "Slot",
    "TrialEvent",
    "make_slots",
    "run_trial",
]
