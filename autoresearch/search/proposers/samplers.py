"""The classical proposers: Optuna's TPE and random samplers, and an ordered grid.

TPE and random need no Proposer object: the agent asks the study, whose sampler they are. TPE learns where
failures live from the constraints the agent sets on each trial (``Trial.set_constraint``: Optuna 5 reads them
in TPE and in ``study.best_trial``; the older ``constraints_func`` is deprecated in Optuna 5). The grid walks
``space.grid()`` in order and proposes the first point the study has not seen.
"""

from __future__ import annotations

import math
import warnings

import optuna
from optuna.trial import TrialState

from autoresearch.records import ABANDONED, config_key
from autoresearch.search.proposers.base import Proposal, ProposalContext, Proposer, SearchExhausted
from autoresearch.study.storage import status_of


def tpe_gamma(n: int) -> int:
    """How many of n finished trials TPE counts as "good": a quarter, as in Hyperopt's original TPE (Bergstra
    et al. 2011), capped at 25 like Optuna's default (which takes a tenth). Over the tens of trials a study runs,
    a tenth is 1-3 trials: the "good" density is then mostly prior, and TPE keeps sampling regions it already
    knows to be infeasible."""
    return min(math.ceil(0.25 * n), 25)


def make_sampler(
    name: str, seed: int | None = None, n_startup_trials: int = 10, concurrent: bool = False
) -> optuna.samplers.BaseSampler:
    """The study's sampler for a proposer name. Grid and LLM proposals are enqueued; when an LLM proposer
    declines a trial, TPE chooses it. ``concurrent``: trials run side by side, so TPE treats the running ones as
    already bad (the "constant liar", Ginsbourger et al. 2010) instead of proposing the same point again."""
    if name in ("random", "grid"):  # grid: never consulted, every grid point is enqueued
        return optuna.samplers.RandomSampler(seed=seed)
    # Independent rather than Optuna 5's default multivariate TPE, and gamma 0.25: on the fake trial's OOM space
    # this combination ran the fewest OOM trials of random, default TPE and multivariate TPE with the same gamma,
    # and on an hparams-like space with a NaN boundary both gamma-0.25 variants cut the NaN share and found the
    # best (benchmarks/RESULTS.md, "autoresearch/search/proposers/samplers.py").
    # ``gamma`` is deprecated since Optuna 4.9 (removal planned for 6.0; pyproject pins 5.0): when it goes,
    # tests/unit/test_agent.py::test_tpe_with_typed_constraints_avoids_the_oom_region says what that costs.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*`gamma` has been deprecated", category=FutureWarning)
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=n_startup_trials, multivariate=False, gamma=tpe_gamma, constant_liar=concurrent
        )


class GridProposer(Proposer):
    """Every point of ``space.grid(points_per_float)`` once, in order; then the study stops."""

    name = "grid"

    def __init__(self, points_per_float: int = 4):
        self.points_per_float = points_per_float
        self._grid: list[dict] | None = None

    def propose(self, study: optuna.Study, ctx: ProposalContext) -> Proposal | None:
        if self._grid is None:
            self._grid = ctx.space.grid(self.points_per_float)
        # Abandoned trials (reaped, interrupted) are queued again by the agent; don't count them as seen.
        seen = {
            config_key(t.params)
            for t in study.get_trials(deepcopy=False)
            if t.state != TrialState.WAITING and status_of(t) not in ABANDONED
        }
        for i, point in enumerate(self._grid):
            if config_key(ctx.space.coerce(point)) not in seen:
                return Proposal(params=point, proposer=self.name, rationale=f"grid point {i + 1}/{len(self._grid)}")
        raise SearchExhausted(f"all {len(self._grid)} grid points have been tried")
