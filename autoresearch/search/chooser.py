"""Who chooses the next trial's config, and what that cost: the proposer, the study's sampler, the repeat policy.

In order: a queued config (a reaped trial's rerun); the proposer (Claude, the grid; on a hybrid only on Claude's
turns); the repeat policy's unseen random config; the study's sampler (TPE, random). The trial's ``proposer``
attribute names who chose; a proposer that was asked and declined is named in ``fallback_from``, beside the LLM
usage it spent (``llm_usage``).
"""

from __future__ import annotations

import logging

import numpy as np
import optuna
from optuna.trial import TrialState

from autoresearch.records import Attr, Skip, Status
from autoresearch.search.gate import Gate
from autoresearch.search.prior import StepPrior
from autoresearch.search.proposers.base import ProposalContext, SearchExhausted
from autoresearch.search.proposers.model_based import MIN_GAIN, ModelBasedProposer
from autoresearch.search.proposers.samplers import GridProposer
from autoresearch.space import SearchSpace
from autoresearch.study.reaper import mark_running
from autoresearch.study.storage import recorded_keys, trial_rows

log = logging.getLogger("autoresearch")

# The sampler may repeat a config, or propose one the space's constraints reject, this often in a row (neither
# costs a run or budget: asking again keeps its own preference) before the agent enqueues an unseen valid random
# config instead. Rejections count because independent TPE models each param alone and cannot learn a joint rule
# such as "the parallel degrees multiply to at most world_size": on parallel.yaml (6 valid of 32 degree
# combinations) every one of its first few dozen proposals was rejected (benchmarks/RESULTS.md,
# "autoresearch/search/chooser.py").
REPEATS_BEFORE_RANDOM = 3

# The classical method behind ``--proposer hybrid`` on the turns that are not Claude's, and when Claude declines:
# the one that won the search suite (benchmarks/search_suite.py; RESULTS.md "Search efficiency across tables").
HYBRID_SAMPLER = "gp"


def sampler_for(proposer: str) -> str:
    """The study's own sampler, which chooses a trial no proposer took: random behind ``gp`` (it proposes every
    trial it can, and declines only when no candidate would run), TPE behind Claude."""
    proposer = HYBRID_SAMPLER if proposer == "hybrid" else proposer
    return {"grid": "grid", "random": "random", "gp": "random"}.get(proposer, "tpe")


def build_proposer(
    name: str,
    model: str | None = None,
    claude_fraction: float = 0.3,
    seed: int | None = None,
    prior: StepPrior | None = None,
    min_gain: float = MIN_GAIN,
):
    """The Proposer for a name (None: the study's sampler chooses every trial). ``prior`` (``--plan``): the
    step-time model the gp proposer starts from (alone or as a hybrid's classical half) and whose best
    predictions Claude is shown; ``min_gain``: with it, the expected improvement below which the gp ends the
    search."""
    if name == "grid":
        return GridProposer()
    if name == "gp":
        return ModelBasedProposer(seed=seed, prior=prior, min_gain=min_gain)
    if name in ("claude", "hybrid"):
        # function-level: imports anthropic, only for the proposers that ask Claude
        from autoresearch.search.proposers.claude import ClaudeProposer
        from autoresearch.search.proposers.hybrid import HybridProposer

        claude = ClaudeProposer(model=model, prior=prior)
        if name == "claude":
            return claude
        return HybridProposer(
            claude,
            fraction=claude_fraction,
            sampler_half=build_proposer(HYBRID_SAMPLER, seed=seed, prior=prior, min_gain=min_gain),
        )
    return None


class Chooser:
    def __init__(self, space: SearchSpace, gate: Gate, *, proposer, sampler_name: str, seed: int | None = None):
        self.space, self.gate, self.proposer = space, gate, proposer
        self.sampler_name = sampler_name
        self.seed = seed
        self.repeats_in_a_row = 0  # proposals that repeated a config or broke the space, since the last new one
        self.repeat_kind = ""  # what the last of them did, for the label of the random config that follows
        self._seen_usage = None

    @property
    def uses_llm(self) -> bool:
        return hasattr(self.proposer, "last_usage")

    def ask(self, study: optuna.Study) -> optuna.Trial:
        """A new RUNNING trial whose params were chosen, tagged with who chose them (and what an LLM spent)."""
        waiting = bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        usage = declined = None
        if not waiting and self.proposer is not None:
            recorded = recorded_keys(study)  # once per round: a proposer may check hundreds of candidates
            ctx = ProposalContext(
                self.space,
                trial_rows(study),
                lambda p: self.gate.skip_reason(study, p, recorded),
                self.gate.risk,
            )
            proposal = self.proposer.propose(study, ctx)
            usage = self._new_usage(proposal)
            problems = self.space.check(proposal.params) if proposal is not None else []
            if problems:  # a proposer's output is data: it never runs unchecked
                log.info(
                    "%s proposal ignored (%s); another chooser takes this trial", proposal.proposer, "; ".join(problems)
                )
            if proposal is not None and not problems:
                study.enqueue_trial(
                    self.space.coerce(proposal.params),
                    user_attrs={Attr.PROPOSER: proposal.proposer, Attr.RATIONALE: proposal.rationale},
                )
                waiting, declined = True, proposal.fallback_from
            elif usage is not None:  # Claude (the one LLM proposer) was asked, spent tokens, and declined
                declined = "claude"
        if not waiting and self.repeats_in_a_row >= REPEATS_BEFORE_RANDOM:
            self._enqueue_unseen(study)
        trial = study.ask(self.space.distributions())
        mark_running(
            trial, **({Attr.LLM_USAGE: usage} if usage else {}), **({Attr.FALLBACK_FROM: declined} if declined else {})
        )
        if Attr.PROPOSER not in trial.user_attrs:
            trial.set_user_attr(Attr.PROPOSER, self.sampler_name)
        return trial

    def note(self, skipped: Skip | None) -> None:
        """The repeat policy: a sampler that keeps repeating itself (TPE on a small discrete space does), or keeps
        breaking the space's constraints, gets an unseen valid config after ``REPEATS_BEFORE_RANDOM`` of them."""
        repeated = skipped is not None and skipped.status in (Status.DUPLICATE, Status.REJECTED)
        self.repeats_in_a_row = self.repeats_in_a_row + 1 if repeated else 0
        if repeated:
            self.repeat_kind = (
                "repeated a config" if skipped.status == Status.DUPLICATE else "broke the space's constraints"
            )

    def _enqueue_unseen(self, study: optuna.Study) -> None:
        """Enqueue a random config that would run (not a duplicate, not dominated), or end the search."""
        rng = np.random.default_rng([self.seed or 0, len(study.trials)])
        recorded = recorded_keys(study)  # once: a draw is then checked without reading the study again
        for _ in range(500):
            try:
                params = self.space.sample_random(rng)
            except ValueError:
                break
            if self.gate.skip(study, params, recorded) is None:
                study.enqueue_trial(
                    self.space.coerce(params),
                    user_attrs={Attr.PROPOSER: f"random ({self.sampler_name} {self.repeat_kind})"},
                )
                return
        raise SearchExhausted("no config left that is new and not dominated by a known failure")

    def _new_usage(self, proposal) -> dict | None:
        """LLM usage of this round, counted once. Claude's proposers expose ``last_usage``, which is also set
        when its answers were rejected and TPE took the trial (tokens were still spent); on a hybrid's TPE turn
        it still points at an earlier round's usage, hence the identity check."""
        current = getattr(self.proposer, "last_usage", None)
        if current is None:
            return dict(proposal.usage) if proposal is not None and proposal.usage else None
        if current is self._seen_usage:
            return None
        self._seen_usage = current
        return dict(current)
