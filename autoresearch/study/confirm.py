"""Confirmation: re-run the search's front-runners until their ranking says more than the machine's noise.

A search ranks configs by one run each, and on a shared machine two runs of one config differ by tens of percent
in tokens/s (benchmarks/RESULTS.md, "Steady state"), so a raw winner is often only the luckiest run. After the
search, the best ``k`` distinct configs are re-run ``repeats`` times each in fresh processes, interleaved (round
r of every config before round r+1) so that a change of load hits all of them alike; where the objective is a
loss, each repeat uses another seed, so that the figure is the config's and not one initialisation's.

The baseline (``autoresearch.space.baseline``) is confirmed beside them when it is not one of them: every result is
stated against it, and a speed-up needs the baseline's own spread. Its search run counts toward its mean (it ran
first by design, not because it was good). Rounds stop early for a config that is already decisively behind the
leader (the same test as the verdict's, each with at least two runs): successive elimination, as in best-arm
identification (Even-Dar, Mannor & Mansour 2006), so that no device time goes to a config the runs have ruled out.

The verdict compares the two best confirmed means: the winner is named only when its lead exceeds 2σ of the
difference, σ = sqrt(s1²/n1 + s2²/n2) (Welch; 2σ as in karpathy/autoresearch PR #560's noise floor). σ itself is
estimated from a few runs, so "2σ" is taken at its confidence (95.45%, two-sided) on Student's t with Welch's
degrees of freedom: with 3 runs each the lead must exceed ~2.9σ, with 10 each ~2.3σ, with many 2σ. Without that
correction a plain 2σ rule names a winner between two identical configs about one time in ten at 3 runs each.
The search's own run of each config is left out of its mean: it was selected for being good, so it is biased
upward (the winner's curse).

Where no winner can be named, the configs tied with the best are named, and one of them is picked for the user
(``Verdict.pick``): the one that changes least from the baseline (nothing to gain by changing more), then the one
with the least peak memory (headroom), then the best mean. The pick's gain over the baseline is given with a 95%
interval (``Verdict.gain``: Welch's t on the logs of the runs, so the interval of a ratio is a ratio's).

Confirmation runs are ordinary trials of the study, marked with ``confirmation_of`` (the search trial whose config
they repeat) and ``repeat``; they do not count toward ``--trials`` and are never the search's best. What remains
to run is derived from the study each time, so a killed agent resumes its confirmation like any trial.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from statistics import NormalDist

import optuna
from optuna.trial import FrozenTrial, TrialState
from scipy import stats

from autoresearch import records
from autoresearch.records import RAN, Attr, config_key
from autoresearch.study import storage as st

LEAD_SIGMAS = 2.0


def varies_with_seed(metric: str) -> bool:
    """Whether repeats should change the seed: a loss depends on the initialisation and data order; a
    throughput does not, and a fixed seed keeps the run's work identical."""
    return "loss" in metric


def front_runners(study: optuna.Study, k: int) -> list[FrozenTrial]:
    """The search's best trial of each of its ``k`` best distinct configs, best first."""
    done = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if st.feasible(t) and not st.is_confirmation(t)
    ]
    done.sort(key=lambda t: (-t.value if study.direction.name == "MAXIMIZE" else t.value, t.number))
    out, seen = [], set()
    for t in done:
        key = config_key(t.params)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out[:k]


def runs_of(study: optuna.Study, running: bool = False) -> dict[tuple, list[FrozenTrial]]:
    """Confirmation trials that ran (any outcome; with ``running``, also those still running), by config key, in
    trial order. Abandoned runs (agent killed or stopped) are not among them: they run again."""
    out: dict[tuple, list[FrozenTrial]] = {}
    for t in study.get_trials(deepcopy=False):
        ran = t.state.is_finished() and st.status_of(t) in RAN
        if st.is_confirmation(t) and (ran or (running and t.state == TrialState.RUNNING)):
            out.setdefault(config_key(t.params), []).append(t)
    return out


def baseline_trial(study: optuna.Study) -> FrozenTrial | None:
    """The search trial of the baseline's config (``Attr.BASELINE``) that ran ok, or None."""
    base = study.user_attrs.get(Attr.BASELINE)
    if not base:
        return None
    key = config_key(base)
    return next(
        (
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if st.feasible(t) and not st.is_confirmation(t) and config_key(t.params) == key
        ),
        None,
    )


def candidates(study: optuna.Study, k: int) -> list[FrozenTrial]:
    """What the confirmation re-runs: the ``k`` front-runners, then the baseline's trial when it is not one."""
    leaders = front_runners(study, k)
    base = baseline_trial(study)
    if base is not None and all(config_key(t.params) != config_key(base.params) for t in leaders):
        leaders.append(base)
    return leaders


def done_runs(study: optuna.Study, k: int, repeats: int) -> int:
    """How many of the candidates' ``repeats`` confirmation runs have ended or will not run (a config eliminated
    counts as done): the progress bar's count."""
    runs, out = runs_of(study), eliminated(study, k)
    return sum(
        repeats if config_key(t.params) in out else min(repeats, len(runs.get(config_key(t.params), [])))
        for t in candidates(study, k)
    )


def next_run(study: optuna.Study, k: int, repeats: int) -> tuple[FrozenTrial, int] | None:
    """(candidate, repeat index) of the next confirmation run, or None when every candidate has its ``repeats``
    or is eliminated, or all but one are. Round-robin: every config's repeat r before anyone's repeat r+1."""
    runs = runs_of(study, running=True)  # a run in another worker's slot is not scheduled twice
    leaders, out = candidates(study, k), eliminated(study, k)
    if len(leaders) - len(out) < 2:  # one left standing: the runs have decided
        return None
    for r in range(repeats):
        for t in leaders:
            key = config_key(t.params)
            if key not in out and len(runs.get(key, [])) <= r:
                return t, len(runs.get(key, []))
    return None


def eliminated(study: optuna.Study, k: int) -> set[tuple]:
    """Config keys of the candidates decisively behind the best confirmed mean (each with at least two runs and a
    spread; the verdict's test): they run no more."""
    confirmed = [c for c in _confirmed(study, candidates(study, k)) if c.std is not None]
    if len(confirmed) < 2:
        return set()
    sign = 1.0 if study.direction.name == "MAXIMIZE" else -1.0
    leader = max(confirmed, key=lambda c: sign * c.mean)
    return {config_key(c.params) for c in confirmed if c is not leader and _decisive(*_lead(leader, c, sign))}


def enqueue(study: optuna.Study, origin: FrozenTrial, repeat: int) -> None:
    study.enqueue_trial(
        dict(origin.params),
        user_attrs={
            Attr.PROPOSER: "confirm",
            Attr.CONFIRMATION_OF: origin.number,
            Attr.REPEAT: repeat,
            Attr.RATIONALE: f"confirmation run {repeat + 1} of trial {origin.number}'s config",
        },
    )


def seed_override(study: optuna.Study, fixed: dict, params: dict, repeat: int) -> list[str]:
    """Extra overrides for a confirmation run: another seed per repeat where the objective is a loss."""
    metric = str(study.user_attrs.get(Attr.OBJECTIVE_METRIC, ""))
    if not varies_with_seed(metric) or "seed" in params:
        return []  # a searched seed is part of the config
    base = fixed.get("seed", 0)
    return [f"seed={int(base) + 1 + repeat}"]


@dataclass
class Confirmed:
    """One front-runner after confirmation."""

    trial: int  # the search trial whose config this is
    params: dict
    search_value: float
    values: list[float]  # objective of each confirmation run that reached it (the baseline's: its search run too)
    failures: list[str] = field(default_factory=list)  # statuses of confirmation runs that did not
    peaks: list[float] = field(default_factory=list)  # peak memory (bytes) of each run that reported one
    baseline: bool = False  # the baseline's config

    @property
    def peak(self) -> float | None:
        return statistics.median(self.peaks) if self.peaks else None

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) >= 2 else None


@dataclass
class Verdict:
    configs: list[Confirmed]  # the candidates, best confirmed mean first; configs without a confirmed value last
    maximize: bool
    repeats: int
    winner: Confirmed | None = None  # named only with the evidence
    lead: float | None = None  # winner - runner-up, in the objective's better direction
    lead_sigma: float | None = None  # standard error of that difference
    needed_sigmas: float | None = None  # how many lead_sigmas a lead must exceed with these runs (2σ's confidence)
    tied: list[int] = field(default_factory=list)  # search trials of the configs tied with the best, when no winner
    line: str = ""
    baseline: Confirmed | None = None  # the baseline's runs, the reference of every gain (None: no baseline ran)
    changes: dict[int, dict] = field(default_factory=dict)  # per search trial: its params that differ from the baseline

    @property
    def pick(self) -> Confirmed | None:
        """The config to use: the winner; else, of those tied with the best, the one that changes least from the
        baseline, then the one with the least peak memory, then the best mean (the module docstring says why)."""
        if self.winner is not None:
            return self.winner
        tied = [c for c in self.configs if c.trial in self.tied] or [c for c in self.configs if c.mean is not None]
        if not tied:
            return None
        sign = 1.0 if self.maximize else -1.0
        return min(
            tied,
            key=lambda c: (
                len(self.changes.get(c.trial, c.params)),
                c.peak if c.peak is not None else float("inf"),
                -sign * c.mean,
            ),
        )

    def gain(self, c: Confirmed) -> tuple[float, float | None, float | None] | None:
        """``c``'s mean against the baseline's (above 1: better; ``records.gain``) and its 95% interval (None where
        either has fewer than two runs), or None without a baseline."""
        base = self.baseline
        if base is None or c.mean is None or base.mean is None:
            return None
        ratio = records.gain(c.mean, base.mean, self.maximize)
        if ratio is None:
            return None
        if c is base or config_key(c.params) == config_key(base.params):
            return 1.0, 1.0, 1.0
        a, b = [math.log(v) for v in c.values if v > 0], [math.log(v) for v in base.values if v > 0]
        if len(a) < 2 or len(b) < 2:
            return ratio, None, None
        va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
        diff = statistics.fmean(a) - statistics.fmean(b)
        if va + vb == 0:
            return ratio, ratio, ratio
        df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if va and vb else len(a) + len(b) - 2
        half = float(stats.t.ppf(0.975, df)) * math.sqrt(va + vb)
        lo, hi = sorted((math.exp(diff - half), math.exp(diff + half)))
        return (ratio, lo, hi) if self.maximize else (ratio, 1 / hi, 1 / lo)

    @property
    def raw_winner_survived(self) -> bool | None:
        """Whether the search's best config is also the confirmed winner (None without a decisive verdict)."""
        if self.winner is None or not self.configs:
            return None
        best_search = min(self.configs, key=lambda c: -c.search_value if self.maximize else c.search_value)
        return best_search.trial == self.winner.trial


def verdict(study: optuna.Study, k: int, repeats: int) -> Verdict | None:
    """The confirmation's outcome for the current front-runners and the baseline (None when the study has no
    feasible trial)."""
    leaders = candidates(study, k)  # the baseline among them: it may win, or tie, like any front-runner
    if not leaders:
        return None
    maximize = study.direction.name == "MAXIMIZE"
    configs = _confirmed(study, leaders)
    sign = 1.0 if maximize else -1.0
    configs.sort(key=lambda c: (c.mean is None, -sign * c.mean if c.mean is not None else 0.0))
    v = Verdict(configs, maximize, repeats)
    v.baseline = next((c for c in configs if c.baseline), None)
    base = study.user_attrs.get(Attr.BASELINE)
    if base:
        v.changes = {c.trial: records.changes(c.params, base) for c in configs}
    v.line = _judge(v)
    return v


def _confirmed(study: optuna.Study, trials: list[FrozenTrial]) -> list[Confirmed]:
    """Each trial's config with its confirmation runs (and, for the baseline, its search run)."""
    runs = runs_of(study)
    base = study.user_attrs.get(Attr.BASELINE)
    out = []
    for t in trials:
        is_base = bool(base) and config_key(t.params) == config_key(base)
        done = ([t] if is_base else []) + runs.get(config_key(t.params), [])
        values = [float(r.value) for r in done if st.feasible(r)]
        failures = [st.status_of(r) for r in done if not st.feasible(r)]
        peaks = [
            float(p)
            for r in done
            if st.feasible(r)
            and records.positive_number(p := (r.user_attrs.get(Attr.METRICS) or {}).get("peak_memory_bytes"))
        ]
        out.append(Confirmed(t.number, dict(t.params), float(t.value), values, failures, peaks, is_base))
    return out


def recorded_verdict(study: optuna.Study) -> Verdict | None:
    """The verdict over the configs the study's confirmation runs repeated (whatever --confirm/--repeats were),
    or None when the study has no confirmation run: for readers of a finished study (report, export)."""
    runs = runs_of(study)
    if not runs:
        return None
    base = study.user_attrs.get(Attr.BASELINE)
    wanted = set(runs) - ({config_key(base)} if base else set())
    k = 0
    for t in front_runners(study, len(study.trials)):  # the fewest that cover the confirmed configs
        k += 1
        wanted.discard(config_key(t.params))
        if not wanted:
            break
    return verdict(study, max(k, 1), max(map(len, runs.values())))


def _judge(v: Verdict) -> str:
    ranked = [c for c in v.configs if c.mean is not None]
    if not ranked:
        return "no confirmation run reached the objective: no winner can be named"
    best = ranked[0]
    if len(ranked) == 1:
        return (
            f"only trial {best.trial}'s config was confirmed ({_pm(best)}); nothing to compare it with: "
            "no winner is named"
        )
    second = ranked[1]
    if best.std is None or second.std is None:
        return (
            f"trials {best.trial} and {second.trial} need at least 2 confirmation runs each for a noise "
            "estimate: no winner is named"
        )
    sign = 1.0 if v.maximize else -1.0
    v.lead, v.lead_sigma, v.needed_sigmas = _lead(best, second, sign)
    shown = (
        f"lead {v.lead:.4g} = {v.lead / v.lead_sigma:.2f}σ" if v.lead_sigma > 0 else f"lead {v.lead:.4g}, σ = 0"
    ) + f"; {best.n}+{second.n} runs need > {v.needed_sigmas:.2f}σ"
    if _decisive(v.lead, v.lead_sigma, v.needed_sigmas):
        v.winner = best
        return (
            f"winner: trial {best.trial}'s config ({_pm(best)}), ahead of trial {second.trial}'s "
            f"({_pm(second)}): {shown}"
        )
    v.tied = [best.trial] + [c.trial for c in ranked[1:] if c.std is not None and not _decisive(*_lead(best, c, sign))]
    pick = v.pick
    why = (
        "of those tied, the fewest changes from the baseline, then the least memory"
        if v.changes
        else ("of those tied, the least memory")
    )
    return (
        f"tied within noise: trials {', '.join(map(str, v.tied))} (trial {best.trial} over trial {second.trial}: "
        f"{shown}); no winner is named; use trial {pick.trial}'s config ({why})"
    )


def _lead(best: Confirmed, other: Confirmed, sign: float) -> tuple[float, float, float]:
    """(best's lead over other in the better direction, σ of that difference, the σs it must exceed)."""
    a, b = best.std**2 / best.n, other.std**2 / other.n
    sigma = math.sqrt(a + b)
    if sigma == 0:
        return sign * (best.mean - other.mean), 0.0, LEAD_SIGMAS
    df = (a + b) ** 2 / (a**2 / (best.n - 1) + b**2 / (other.n - 1))  # Welch-Satterthwaite
    return sign * (best.mean - other.mean), sigma, float(stats.t.ppf(NormalDist().cdf(LEAD_SIGMAS), df))


def _decisive(lead: float, sigma: float, needed: float) -> bool:
    return lead > needed * sigma if sigma > 0 else lead > 0


def _pm(c: Confirmed) -> str:
    spread = f" ± {c.std:.3g}" if c.std is not None else ""
    return f"{c.mean:.5g}{spread}, n={c.n}"


def table(v: Verdict, metric: str) -> list[dict]:
    """One row per candidate (the front-runners and the baseline), for the report: mean ± σ of its confirmation
    runs (the baseline's with its search run) beside its search run, and its gain over the baseline's mean."""
    rows = []
    for c in v.configs:
        g = v.gain(c)
        rows.append(
            {
                "trial": c.trial,
                **c.params,
                "search_" + metric: c.search_value,
                "n": c.n,
                "mean": c.mean,
                "std": c.std,
                "cv": (c.std / abs(c.mean)) if c.std is not None and c.mean else None,
                "vs_baseline": None if g is None else g[0],
                "baseline": "yes" if c.baseline else "",
                "failed_runs": ", ".join(c.failures),
            }
        )
    return rows
