"""Proposers: where the next trial's params come from (see ``base`` for the contract).

``tpe`` and ``random`` are the study's own Optuna samplers (``samplers.make_sampler``); ``grid`` walks the space's
grid; ``claude`` and ``hybrid`` (``claude.py``, ``hybrid.py``) ask Claude and are imported only when used, so that
the classical proposers need no ``anthropic`` import.
"""

from autoresearch.search.proposers.base import Proposal, ProposalContext, Proposer, SearchExhausted
from autoresearch.search.proposers.samplers import GridProposer, make_sampler

__all__ = ["Proposal", "ProposalContext", "Proposer", "SearchExhausted", "GridProposer", "make_sampler"]
