"""Proposers: where the next trial's params come from.

    base.py          the contract: Proposer, Proposal, ProposalContext, SearchExhausted
    model_based.py   the default classical proposer: a model of the outcome over the configs predicted to run
    samplers.py      Optuna's TPE and random samplers; the grid
    claude.py        Claude via the ``anthropic`` SDK, asked with the study's history
    prompt.py        what Claude is told and how its answer is read
    hybrid.py        a classical proposer keeps the search state; Claude proposes a fixed fraction of the trials

``tpe`` and ``random`` are the study's own Optuna samplers (``samplers.make_sampler``); ``grid`` walks the space's
grid; ``claude`` and ``hybrid`` (``claude.py``, ``hybrid.py``) ask Claude and are imported only when used, so that
the classical proposers need no ``anthropic`` import.
"""

from autoresearch.search.proposers.base import Proposal, ProposalContext, Proposer, SearchConverged, SearchExhausted
from autoresearch.search.proposers.samplers import GridProposer, make_sampler

__all__ = [
    "Proposal",
    "ProposalContext",
    "Proposer",
    "SearchConverged",
    "SearchExhausted",
    "GridProposer",
    "make_sampler",
]
