"""Model-based search over the configs predicted to run: the agent's default classical proposer (``gp``).

Why not TPE alone: TPE is told a failure as a bad objective value (or an infeasible trial) and models each param on
its own, so an OOM at a large batch on long sequences teaches it that a large batch is bad, while the best config
may be a large batch on short sequences at the edge of the memory budget. Measured on the suite of real-run tables
(``benchmarks/search_suite.py``, RESULTS.md "Search efficiency across tables"), it was no better than random there.

This proposer keeps failures out of the model of the objective. Each round:

1. **Candidates**: the space's configs (its grid; a sample of it plus random points when the grid is large or the
   space has floats) that the agent would run now: not run before, within the space's constraints, not dominated by
   a known OOM or NaN, and under the memory gate (``ProposalContext.check``). Failures shape this set only.
2. **Start-up**: until ``n_init`` runs ended ok, a scrambled Sobol sequence (a quasi-random design, Owen 1998)
   mapped to the nearest candidate: it covers the feasible set instead of drawing where random draws cluster, but
   only the safe half (``DESIGN_NAN_SHARE``) of each axis annotated ``nan``: the low learning rates of ``nan: up``.
3. **Then**: a Gaussian process of the ok runs' objectives (``autoresearch.search.surrogate``) ranks the candidates by
   expected improvement times the probability of not failing: estimated from the runs that failed (or diverged)
   nearby, times P(no OOM) by the calibrated memory model and P(no NaN) along the annotations (``ctx.risk``).
4. **Risk**: a candidate whose P(OOM) or P(NaN) passes ``RISK_LIMIT`` is held back while a safer one remains;
   run only when none does, as a bet the rationale names.

With a prior (``--plan``: ``autoresearch.search.prior.StepPrior``, the core's step-time model refitted to the runs),
the start-up is one run, the plan's best runnable candidate, and the Gaussian process models the log of each run's
measured objective over its prediction instead of the objective: where the model is right the search follows it,
where runs prove it wrong the GP's correction takes over.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import qmc

from autoresearch.records import RAN, Status, config_key, is_number
from autoresearch.search import surrogate
from autoresearch.search.feasibility import GATE_OOM
from autoresearch.search.prior import StepPrior
from autoresearch.search.proposers.base import Proposal, ProposalContext, Proposer, SearchConverged

MAX_GRID = 4096  # a grid up to this size is the candidate set; a larger one is sampled
SAMPLED = 1024  # candidates drawn per round otherwise (half from the grid, half uniformly at random)
# The scale of the step-time model's log error the GP of its corrections works in: the model's held-out median
# error on published runs is ~13% (benchmarks/RESULTS.md, "Step-time model"); the GP fits its own amplitude on top.
PRIOR_SCALE = 0.15
# The GP of the model's errors keeps at least this amplitude (in units of PRIOR_SCALE): far from any run, a config's
# objective is the model's figure give or take the model's error scale, however well the runs so far are reproduced
# (more where the model's leave-one-out errors on the study's runs say so).
MIN_SIGNAL = 1.0
# With a prior, the search stops when the best runnable candidate's expected improvement is below this share of the
# best objective (--min-gain): less than the run-to-run noise of a trial here (RESULTS.md, "Steady state"), which no
# confirmation could resolve.
MIN_GAIN = 0.01
# ... but not before this many runs ended ok: the baseline and at least two configs the plan ranked best, so that the
# model is checked against runs of more than one config before it may say that nothing is worth running, and the
# confirmation has a rival for its pick.
MIN_RUNS = 3
# A candidate whose P(OOM) or P(NaN) passes its limit is held back while a safer one remains. Chosen on the dev
# tables (benchmarks/RESULTS.md, "Search efficiency across tables"): holding back P(NaN) > 0.25 cut the runs that
# diverge; holding back P(OOM) > 0.25 cost runs where the best config sits at the budget's edge (tabular: 11 runs
# to the best against 3), so OOM is held back only where the gate's own line is (GATE_OOM) and otherwise weighs in
# the ranking.
RISK_LIMIT = {"oom": GATE_OOM, "nan": 0.25}
DESIGN_NAN_SHARE = 0.5  # of an axis annotated ``nan``, what the start-up design spans (from its safe end)
LOOKAHEAD = 16  # safe runnable candidates ranked again with their risk per round (each costs a memory estimate)


class ModelBasedProposer(Proposer):
    name = "gp"

    def __init__(
        self, seed: int | None = None, n_init: int = 4, prior: StepPrior | None = None, *, min_gain: float = MIN_GAIN
    ):
        self.seed = 0 if seed is None else seed
        self.n_init = n_init  # without a prior: with one, the plan's best is the only start-up point
        self.prior = prior
        self.min_gain = min_gain  # with a prior: the expected improvement below which the search has converged
        self._grid: list[dict] | None = None

    def propose(self, study, ctx: ProposalContext) -> Proposal | None:
        space = ctx.space
        # Runs of this space's params only (a resumed study may hold trials of an older version of the file).
        ran = [
            r
            for r in ctx.table
            if r.status in RAN
            and r.status != Status.INVALID
            and r.confirmation_of is None
            and set(r.params) == set(space.params)
        ]
        seen = {config_key(r.params) for r in ctx.table if r.params}  # config_key: 4 == 4.0
        candidates = [p for p in self._candidates(space, len(ctx.table)) if config_key(p) not in seen]
        if not candidates:
            return None  # the study's sampler tries; the agent ends the search when nothing new would run
        x = np.stack([surrogate.encode(space, p) for p in candidates])
        ok = [r for r in ran if r.status == Status.OK and is_number(r.objective)]
        if self.prior is not None:
            return self._propose_with_prior(ctx, candidates, x, ran, ok)
        if len(ok) < self.n_init:
            k = len(ran)
            low, high = _design_box(space)
            u = qmc.Sobol(x.shape[1], scramble=True, seed=self.seed).random(2 ** math.ceil(math.log2(k + 1)))[k]
            target = low + u * (high - low)
            order = np.argsort(((x - target) ** 2).sum(1), kind="stable")
            return self._first_runnable(
                ctx,
                candidates,
                order,
                lambda i, _: f"start-up design point {k + 1}/{self.n_init} (scrambled Sobol, nearest runnable config)",
            )
        sign = -1.0 if space.maximize else 1.0
        xo = np.stack([surrogate.encode(space, r.params) for r in ok])
        y = surrogate.copula(np.array([sign * r.objective for r in ok]))
        gp = surrogate.GaussianProcess(xo, y)
        mean, std = gp.predict(x)
        ei = surrogate.expected_improvement(mean, std, float(y.min()))
        xr = np.stack([surrogate.encode(space, r.params) for r in ran])
        failed = np.array([float(r.status != Status.OK or r.diverged) for r in ran])
        p_fail = surrogate.failure_probability(x, xr, failed, gp.lengths)
        score = ei * (1.0 - p_fail)
        return self._first_runnable(
            ctx,
            candidates,
            np.argsort(-score, kind="stable"),
            lambda i, survives: (
                f"expected improvement {ei[i]:.3g} x P(no failure) {(1 - p_fail[i]) * survives:.2f}: the best "
                f"runnable of {len(candidates)} candidates (GP of {len(ok)} ok runs)"
            ),
            score,
        )

    def _propose_with_prior(self, ctx, candidates: list[dict], x, ran: list, ok: list) -> Proposal | None:
        space, prior = ctx.space, self.prior
        sign = -1.0 if space.maximize else 1.0
        prior.refit(ok)
        predicted = [prior.predict(p) for p in candidates]
        logs = np.array([sign * math.log(v) if v else np.nan for v in predicted])
        known = ~np.isnan(logs)
        neutral = float(np.median(logs[known])) if known.any() else 0.0  # for a point the model cannot price
        logs[~known] = neutral
        if not ok:  # the plan's order; of points it predicts alike, the one nearest the core's defaults first
            order = np.lexsort((np.array([prior.changes(p) for p in candidates]), logs))
            return self._first_runnable(
                ctx,
                candidates,
                order,
                lambda i, _: (
                    f"the plan's best runnable of {len(candidates)} candidates: predicted {space.objective_metric} "
                    f"{predicted[i] or float('nan'):.4g}"
                ),
            )
        # The GP models sign * log(measured / predicted) in units of PRIOR_SCALE: zero where the model is right. Its
        # amplitude is at least the model's error out of sample: its error scale before two runs (MIN_SIGNAL), then
        # the mean square of its leave-one-out errors on this study's runs where that is larger. The runs' own
        # residuals cannot say it: the refitted model reproduces the runs it was fitted to, and a GP of those zeros
        # alone would trust the model near every run, however wrong it is between them.
        measured = np.array([sign * math.log(r.objective) for r in ok])
        at_runs = np.array([sign * math.log(v) if (v := prior.predict(r.params)) else neutral for r in ok])
        xo = np.stack([surrogate.encode(space, r.params) for r in ok])
        held_out = prior.held_out_errors(ok)
        amplitude = max(MIN_SIGNAL, float(np.mean(np.square(held_out))) / PRIOR_SCALE**2 if held_out else 0.0)
        gp = surrogate.GaussianProcess(xo, (measured - at_runs) / PRIOR_SCALE, min_signal=amplitude)
        correction, std = gp.predict(x)
        mean = logs / PRIOR_SCALE + correction
        ei = surrogate.expected_improvement(mean, std, float(measured.min() / PRIOR_SCALE))
        self._stop_when_converged(ctx, candidates, ei * PRIOR_SCALE, len(ok))
        xr = np.stack([surrogate.encode(space, r.params) for r in ran])
        failed = np.array([float(r.status != Status.OK or r.diverged) for r in ran])
        p_fail = surrogate.failure_probability(x, xr, failed, gp.lengths)
        cost = self._costs(candidates, ran)
        score = ei * (1.0 - p_fail) / cost
        return self._first_runnable(
            ctx,
            candidates,
            np.argsort(-score, kind="stable"),
            lambda i, survives: (
                f"expected improvement {100 * ei[i] * PRIOR_SCALE:.1f}% x P(no failure) {(1 - p_fail[i]) * survives:.2f}"
                f" per {cost[i]:.2g}x a run's device time, over the plan (predicted {space.objective_metric} "
                f"{predicted[i] or float('nan'):.4g}; model refitted to {len(ok)} runs: {prior.factors_text()}; GP of "
                "its errors)"
            ),
            score,
        )

    def _stop_when_converged(self, ctx, candidates: list[dict], gains: np.ndarray, runs: int) -> None:
        """Raise SearchConverged when the runnable candidate with the largest expected improvement (a share of the
        best's objective: the GP works in logs) expects less than ``min_gain``: no run left is worth its device
        time, by the model and what the runs taught it, once ``MIN_RUNS`` runs ended ok. Checked in that order, so
        only the first runnable one is gated (the memory estimate is the costly check)."""
        if not self.min_gain or runs < MIN_RUNS:
            return
        for i in np.argsort(-gains, kind="stable"):
            if ctx.check(candidates[i]) is None:
                if gains[i] < self.min_gain:
                    raise SearchConverged(
                        f"converged: no config left is expected to improve on the best by {100 * self.min_gain:g}% "
                        f"or more (the most, {100 * gains[i]:.2f}%, {_label(candidates[i])}; --min-gain)"
                    )
                return

    def _costs(self, candidates: list[dict], ran: list) -> np.ndarray:
        """Each candidate's expected device time relative to a one-rank run: its ranks (the plan's devices) times
        the mean wall time of the runs so far with as many ranks (of all runs, where none had as many). Expected
        improvement per unit of it ranks the candidates (Snoek, Larochelle & Adams 2012, "EI per second"): on a
        machine where a second rank costs more than it gains, the one-rank configs are tried first."""
        walls: dict[int, list[float]] = {}
        for r in ran:
            led = r.ledger or {}
            if is_number(led.get("wall_sec")) and isinstance(led.get("ranks"), int) and led["ranks"] > 0:
                walls.setdefault(led["ranks"], []).append(led["wall_sec"])
        every = [w for ws in walls.values() for w in ws]
        if not every:
            return np.ones(len(candidates))
        one = float(np.mean(walls.get(1, every)))
        out = []
        for p in candidates:
            ranks = self.prior.ranks(p) or 1
            out.append(ranks * float(np.mean(walls.get(ranks, every))) / one)
        return np.array(out)

    def _first_runnable(self, ctx: ProposalContext, candidates: list[dict], order, rationale, score=None):
        """The best-ranked candidate the agent would run (``ctx.check``: space, dominance, memory gate), checked
        in rank order: the memory estimate is the costly check, and most rounds need only a few.

        A candidate whose P(OOM) or P(NaN) (``ctx.risk``) passes ``RISK_LIMIT`` is held back while a safer one
        remains, and run only when none does (a bet, said in the rationale). With ``score`` (the GP's), the first
        ``LOOKAHEAD`` safe runnable candidates are ranked again by score x P(no OOM) x P(no NaN)."""
        held: list[tuple[int, dict]] = []
        safe: list[tuple[int, dict]] = []
        for i in order:
            if ctx.check(candidates[i]) is not None:
                continue
            risk = ctx.risk(candidates[i])
            (held if any(p > RISK_LIMIT[k] for k, p in risk.items()) else safe).append((i, risk))
            if len(safe) >= (1 if score is None else LOOKAHEAD):
                break
        pool = safe or held
        if not pool:
            return None  # every candidate would be skipped: the study's sampler tries, then the search ends

        def survives(risk: dict) -> float:
            return math.prod(1.0 - p for p in risk.values())

        i, risk = pool[0] if score is None else max(pool, key=lambda c: score[c[0]] * survives(c[1]))
        text = rationale(i, survives(risk))
        if risk:
            text += "; " + ", ".join(f"P({k.upper()}) {p:.2f}" for k, p in sorted(risk.items()))
        if held:
            text += (
                f"; {len(held)} better-ranked candidate(s) held back, {_limits_text()}"
                if safe
                else f"; a bet: every runnable candidate has {_limits_text()}"
            )
        return Proposal(candidates[i], self.name, rationale=text)

    def _candidates(self, space, round_: int) -> list[dict]:
        if self._grid is None:
            self._grid = space.grid()
        only_choices = all(p.discrete for p in space.params.values())
        if only_choices and len(self._grid) <= MAX_GRID:
            return self._grid
        rng = np.random.default_rng([self.seed, round_])
        picks = rng.choice(len(self._grid), size=min(len(self._grid), SAMPLED // 2), replace=False)
        out = [self._grid[i] for i in picks]
        for _ in range(SAMPLED - len(out)):
            try:
                out.append(space.sample_random(rng))
            except ValueError:
                break
        return out


def _limits_text() -> str:
    return " or ".join(f"P({k.upper()}) above {v}" for k, v in RISK_LIMIT.items())


def _design_box(space) -> tuple[np.ndarray, np.ndarray]:
    """Where the start-up design draws its targets, per feature of ``surrogate.encode``: the unit cube, but only the
    lower ``DESIGN_NAN_SHARE`` of each axis annotated ``nan: up`` (the upper, for ``down``). The first runs know
    nothing, and the annotations say divergence comes from that end; the GP goes further when the trend says so."""
    low, high = [], []
    for p in space.params.values():
        width = len(p.encode(p.values[0] if hasattr(p, "values") else p.low))
        ordered = width == 1
        low += [1.0 - DESIGN_NAN_SHARE if ordered and p.nan == "down" else 0.0] * width
        high += [DESIGN_NAN_SHARE if ordered and p.nan == "up" else 1.0] * width
    return np.array(low), np.array(high)


def _label(params: dict) -> str:
    return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in params.items())
