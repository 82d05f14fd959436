"""Choosing the next trial, and deciding whether it runs.

chooser.py        who picks the config: a queued rerun, the proposer, the repeat policy, the study's sampler
gate.py           whether it runs: the space's rules, duplicates, the feasibility memory, the memory gate
feasibility.py    what past failures prove: OOM and NaN dominance along the space's annotations
memory_model.py   measured peaks against the core's estimate: the memory gate's prediction
surrogate.py      the Gaussian process and failure model behind the ``gp`` proposer
planner.py        every point of a space ranked by the core's step-time model, and why the others lost
prior.py          that model as the search's prior (--plan), refitted to the study's runs
proposers/        gp, grid, Claude, hybrid; TPE and random are the study's own Optuna samplers
"""

from autoresearch.search.chooser import HYBRID_SAMPLER, Chooser, build_proposer, sampler_for
from autoresearch.search.feasibility import FeasibilityMemory, Outcome
from autoresearch.search.gate import Gate
from autoresearch.search.memory_model import MemoryModel
from autoresearch.search.proposers.base import Proposal, ProposalContext, Proposer, SearchExhausted
from autoresearch.search.proposers.samplers import make_sampler

__all__ = [
    "HYBRID_SAMPLER",
    "Chooser",
    "FeasibilityMemory",
    "Gate",
    "MemoryModel",
    "Outcome",
    "Proposal",
    "ProposalContext",
    "Proposer",
    "SearchExhausted",
    "build_proposer",
    "make_sampler",
    "sampler_for",
]
