"""Running a study: a session's search and confirmation, trials side by side in their slots, one trial process.

options.py     AgentOptions: what one session is asked to do (the CLI is generated from it)
session.py     Session: the search, then the confirmation; returns an Outcome and prints nothing
scheduler.py   drive(work, slots): trials side by side, each in its slot, until the work stops
runner.py      run_trial: one trial on this machine (the local executor), its end classified
"""

from autoresearch.execute.base import Interrupted
from autoresearch.execute.slots import Slot, make_slots
from autoresearch.run.options import PROPOSERS, AgentOptions
from autoresearch.run.runner import run_trial
from autoresearch.run.session import Listener, Outcome, Phase, Session, TrialEvent

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
