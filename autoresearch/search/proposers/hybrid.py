"""Hybrid: a classical proposer keeps the search state, Claude proposes a fixed fraction of the trials.

Why: on a fixed space classical methods beat a pure-LLM agent, while a hybrid where the LLM proposes some trials from
the optimiser's state did best (Ferreira et al. 2026, benchmark on karpathy/autoresearch; LLAMBO, Liu et al. 2024).
Claude's proposals are enqueued into the same Optuna study by the agent, so the classical half learns from them as
from its own. That half (``sampler_half``; the agent gives it ``chooser.HYBRID_SAMPLER``, the search suite's winner)
also takes a Claude turn that Claude declines, and the trial records ``fallback_from: claude``.

The schedule is deterministic in the trial number k: trial k is Claude's when floor((k+1)·f) > floor(k·f). That
spreads Claude's turns evenly (f = 0.3 gives trials 3, 6, 9, 13, ...), leaves the very first trials to the classical
start-up, and gives the same split after a resume, because k comes from the study rather than from a counter.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from autoresearch.search.proposers.base import Proposal, ProposalContext, Proposer
from autoresearch.search.proposers.claude import ClaudeProposer


def is_claude_turn(k: int, fraction: float) -> bool:
    """Whether trial number k (0-based) is proposed by Claude when Claude proposes `fraction` of the trials."""
    # Exact rational arithmetic: 0.29 * 100 is 28.999999999999996 in floats, which would skip a turn.
    return _turn(k, Fraction(str(fraction)))


def _turn(k: int, f: Fraction) -> bool:
    return math.floor((k + 1) * f) > math.floor(k * f)


class HybridProposer(Proposer):
    name = "hybrid"

    def __init__(
        self,
        claude: ClaudeProposer,
        *,
        fraction: float = 0.3,
        every: int | None = None,
        sampler_half: Proposer | None = None,
    ):
        """`every=n` is shorthand for fraction 1/n (Claude proposes every n-th trial); it overrides `fraction`.
        ``sampler_half``: the proposer of the other turns and of a turn Claude declines (None: the study's
        sampler)."""
        if every is not None:
            if every < 1:
                raise ValueError(f"every must be a positive integer, got {every}")
            fraction = 1 / every
            self._fraction = Fraction(1, every)
        else:
            if not 0.0 <= fraction <= 1.0:
                raise ValueError(f"fraction must be within [0, 1], got {fraction}")
            self._fraction = Fraction(str(fraction))
        self.claude = claude
        self.fraction = fraction
        self.sampler_half = sampler_half

    def is_claude_turn(self, k: int) -> bool:
        return _turn(k, self._fraction)

    def propose(self, study: Any, ctx: ProposalContext) -> Proposal | None:
        # The sampler half's turns; on Claude's turns Claude's own fallback (None) also hands the trial to it.
        half = self.sampler_half
        if not self.is_claude_turn(_trial_index(study, ctx)):
            return half.propose(study, ctx) if half is not None else None
        proposal = self.claude.propose(study, ctx)
        if proposal is None and half is not None:
            proposal = half.propose(study, ctx)
            if proposal is not None:
                proposal.fallback_from = self.claude.name
        return proposal

    @property
    def total_cost_usd(self) -> float | None:
        return self.claude.total_cost_usd

    @property
    def last_usage(self) -> dict | None:
        return self.claude.last_usage

    def __repr__(self) -> str:
        return f"HybridProposer({self.claude!r}, fraction={self.fraction})"


def _trial_index(study: Any, ctx: ProposalContext) -> int:
    """The number the next trial will get: every trial already in the study, whatever its state."""
    if study is not None:
        try:
            return len(study.get_trials(deepcopy=False))
        except AttributeError:
            pass
    return len(ctx.table)
