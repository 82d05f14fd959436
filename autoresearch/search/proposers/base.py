"""What every proposer implements, and what it is given.

A proposer suggests the next trial's parameters; the agent validates, enqueues and runs it. Returning None
hands the trial to the study's own sampler (TPE by default), so an LLM proposer that has nothing valid to say
costs nothing but a fallback. Proposals are data: the agent checks them against the space before any run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

    from autoresearch.space import SearchSpace


@dataclass
class Proposal:
    params: dict[str, Any]
    proposer: str
    rationale: str = ""
    usage: dict | None = None  # LLM calls behind it: tokens and cost_usd (the agent's cost ledger sums cost_usd)
    fallback_from: str | None = None  # the proposer that was asked first and declined ("claude" on a hybrid)


@dataclass
class ProposalContext:
    """What a proposer may look at.

    ``table`` has one row per trial so far, in order: {number, params, status, exit_code, objective,
    peak_memory_bytes, predicted_memory_bytes, reason, ...} (see ``autoresearch.study.storage.trial_rows``).
    ``check(params)`` says why the agent would skip these params without running them (out of the space,
    a duplicate, dominated by a known failure, predicted to exceed the memory limit), or None when they would run.
    ``risk(params)`` is P(failure) by kind ("oom", "nan") as the gate knows it before a run (``Gate.risk``).
    """

    space: SearchSpace
    table: list[dict] = field(default_factory=list)
    check: Callable[[dict], str | None] = lambda params: None
    risk: Callable[[dict], dict[str, float]] = lambda params: {}


class SearchExhausted(Exception):
    """Raised by a proposer that has nothing left to propose (e.g. a finished grid): the study stops."""


class SearchConverged(SearchExhausted):
    """Raised by a proposer whose model expects no config left to be worth a run: the search stops, with why."""


class Proposer(ABC):
    name: str = "proposer"

    @abstractmethod
    def propose(self, study: optuna.Study, ctx: ProposalContext) -> Proposal | None:
        """The next trial's params, or None to let the study's sampler choose them."""
