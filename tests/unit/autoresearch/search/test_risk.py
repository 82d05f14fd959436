"""Failure risk before a run (issue "Agent IV"): the memory model's error on configs it has not seen, P(OOM) from it,
P(NaN) and P(OOM) along the space's annotations, and the gp proposer holding risky candidates back."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest

from autoresearch.records import Status, TrialRow
from autoresearch.search.feasibility import BORROWED, FRONTIER_RISK, FRONTIER_STEPS, GATE_OOM, FeasibilityMemory
from autoresearch.search.gate import Gate
from autoresearch.search.memory_model import PRIOR_LOG_ERROR, PRIOR_WEIGHT, MemoryModel
from autoresearch.search.proposers import model_based
from autoresearch.search.proposers.base import ProposalContext
from autoresearch.search.proposers.model_based import ModelBasedProposer
from autoresearch.space import ChoiceParam, SearchSpace

MiB = 2**20
LRS = [0.001, 0.003, 0.01, 0.1, 1.0]


def normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


# ------------------------------------------------------------------------------------------- memory model


def test_the_error_before_any_measurement_is_the_prior():
    assert MemoryModel().log_error() == pytest.approx(PRIOR_LOG_ERROR)


def test_the_error_pools_leave_one_out_errors_with_the_prior():
    points = [(700 * MiB, 770 * MiB), (1000 * MiB, 1020 * MiB)]
    # Leave-one-out: each point predicted from the other alone, i.e. by the other's ratio measured / estimated.
    loo = [math.log(770 / (700 * 1020 / 1000)), math.log(1020 / (1000 * 770 / 700))]
    expected = math.sqrt((PRIOR_WEIGHT * PRIOR_LOG_ERROR**2 + sum(e * e for e in loo)) / (PRIOR_WEIGHT + 2))
    assert MemoryModel(points).log_error() == pytest.approx(expected, rel=1e-12)


def test_oom_probability_reads_the_prediction_as_log_normal():
    model = MemoryModel([(700 * MiB, 770 * MiB)])  # ratio 1.1
    sigma = model.log_error()
    limit = 1000 * MiB
    for est in (600, 850, 909, 1000):
        predicted = 1.1 * est * MiB
        expected = normal_sf(math.log(limit / predicted) / sigma)
        assert model.oom_probability(est * MiB, limit) == pytest.approx(expected, rel=1e-9)
    # At the limit a coin toss; the prediction's side decides which way it leans.
    assert model.oom_probability(1000 / 1.1 * MiB, limit) == pytest.approx(0.5)


def test_more_agreeing_measurements_make_the_gate_less_conservative():
    few = MemoryModel([(700 * MiB, 770 * MiB)])
    many = MemoryModel([(e * MiB, 1.1 * e * MiB) for e in (700, 750, 800, 850, 900, 950)])
    assert many.log_error() < few.log_error() < PRIOR_LOG_ERROR
    assert many.oom_probability(850 * MiB, 1000 * MiB) < few.oom_probability(850 * MiB, 1000 * MiB)


# ------------------------------------------------------------------------------------ risk by annotations


def edge_space() -> SearchSpace:
    params = {
        "optim.lr": ChoiceParam(values=LRS, nan="up", memory="none"),
        "training.seq_len": ChoiceParam(values=[64, 128, 256], memory="up", nan="none"),
        "optim": ChoiceParam(values=["adamw", "muon"]),  # unannotated: must be equal to compare
    }
    return SearchSpace(name="e", objective={"metric": "val_loss", "direction": "minimize"}, params=params)


def cfg(lr: float, seq: int = 64, opt: str = "adamw") -> dict:
    return {"optim.lr": lr, "training.seq_len": seq, "optim": opt}


def test_nan_risk_is_distance_to_the_failure_against_distance_to_a_safe_run():
    memory = FeasibilityMemory(edge_space())
    assert memory.risk(cfg(0.1), "nan") is None  # nothing known of NaN yet
    memory.record(cfg(1.0), "nan", trial=0)
    # No safe run yet: a safe run is assumed a quarter of the axis away (one step of five values).
    assert memory.risk(cfg(0.1), "nan") == pytest.approx(0.25 / (0.25 + 0.25))
    assert memory.risk(cfg(0.01, seq=256), "nan") == pytest.approx(0.25 / (0.25 + 0.5))  # seq: nan none
    assert memory.risk(cfg(1.0, seq=128), "nan") == 1.0  # dominated
    # Another optimizer: the annotations say nothing, so adamw's answer is borrowed at a discount.
    assert memory.risk(cfg(0.1, opt="muon"), "nan") == pytest.approx(BORROWED * 0.5)
    memory.record(cfg(0.003, seq=128), "ok", {"val_loss": 3.0, "first_loss": 4.0, "final_loss": 3.0}, trial=1)
    assert memory.risk(cfg(0.01), "nan") == pytest.approx(0.25 / (0.25 + 0.5))  # one step above the safe run
    assert memory.risk(cfg(0.001, seq=256), "nan") == 0.0  # below a safe run: proved safe
    memory.record(cfg(0.1), "ok", {"val_loss": 2.0, "first_loss": 4.0, "final_loss": 2.0}, trial=2)
    assert memory.risk(cfg(0.01), "nan") == 0.0


def test_before_any_failure_the_untried_end_of_a_nan_axis_is_held_back():
    """No run failed yet: more than FRONTIER_STEPS past the runs that proved a region safe is a guess of
    FRONTIER_RISK (above the hold-back limit), nearer is unknown; a real failure replaces the guess."""
    memory = FeasibilityMemory(edge_space())
    assert memory.risk(cfg(1.0), "nan") is None  # nothing ran: the start-up design decides
    memory.record(cfg(0.003), "ok", {"val_loss": 3.0, "first_loss": 4.0, "final_loss": 3.0}, trial=0)
    assert memory.risk(cfg(0.01), "nan") is None  # one step past the proven region
    assert memory.risk(cfg(0.1), "nan") == FRONTIER_RISK > model_based.RISK_LIMIT["nan"]  # two steps
    assert memory.risk(cfg(0.001, seq=256), "nan") is None  # seq is no nan axis; lr below the safe run
    memory.record(cfg(0.01, seq=128), "ok", {"val_loss": 3.0, "first_loss": 4.0, "final_loss": 3.0}, trial=1)
    # The frontier moved a step, but 0.01 -> 0.1 is a tenfold leap where the grid's steps below were threefold:
    # by ratio 4/3 of the grid's mean step, more than FRONTIER_STEPS
    assert memory.risk(cfg(0.1), "nan") == FRONTIER_RISK
    memory.record(cfg(0.1, seq=256), "ok", {"val_loss": 3.0, "first_loss": 4.0, "final_loss": 3.0}, trial=2)
    assert memory.risk(cfg(1.0), "nan") == FRONTIER_RISK  # tenfold again
    memory.record(cfg(1.0), "nan", trial=3)
    assert memory.risk(cfg(0.1), "nan") == 0.0  # proved safe by trial 2 (seq is no nan axis)
    assert memory.risk(cfg(1.0, seq=256), "nan") == 1.0  # the failure speaks now: dominated


@pytest.mark.parametrize(
    "values, steps",
    [
        ([0.001, 0.01, 0.1, 1.0, 10.0, 100.0], [1.0] * 5),  # tenfold every step: indices
        ([0.003, 0.01, 0.03, 0.1, 0.3, 1.0], None),  # a 1-3-10 grid: within the slack of one step each
        ([1.0, 0.1, 0.01], [1.0, 1.0]),  # decreasing
        (LRS, [4 * math.log10(b / a) / 3 for a, b in pairwise(LRS)]),  # three decades over four gaps
    ],
)
def test_a_leap_along_a_choice_of_numbers_is_measured_by_ratio(values, steps):
    """Before any failure, a one-step leap past a proven run is allowed on a grid spaced evenly by ratio and held
    back where it multiplies the value more than the grid's mean step does (FRONTIER_STEPS: one step and a quarter)."""
    space = SearchSpace(
        name="r",
        objective={"metric": "val_loss", "direction": "minimize"},
        params={"optim.lr": ChoiceParam(values=values, nan="up", memory="none")},
    )
    ok = {"val_loss": 3.0, "first_loss": 4.0, "final_loss": 3.0}
    gaps = []
    for below, above in pairwise(values):
        memory = FeasibilityMemory(space)
        memory.record({"optim.lr": below}, "ok", ok, trial=0)
        gaps.append(memory.risk({"optim.lr": above}, "nan"))
    expected = [FRONTIER_RISK if s > FRONTIER_STEPS else None for s in (steps or [1.0] * (len(values) - 1))]
    assert gaps == expected


def test_a_diverged_run_is_nan_evidence_and_an_oom_says_nothing_of_nan():
    memory = FeasibilityMemory(edge_space())
    memory.record(cfg(0.1), "ok", {"val_loss": 9.0, "first_loss": 4.0, "final_loss": 9.0}, trial=0)  # diverged
    memory.record(cfg(0.003, seq=256), "oom", trial=1)
    assert memory.risk(cfg(0.01), "nan") == pytest.approx(0.25 / (0.25 + 0.25))
    # The diverged run's peak fitted at seq 64: half the seq axis below the candidate, the OOM half above it.
    assert memory.risk(cfg(0.01, seq=128), "oom") == pytest.approx(0.5 / (0.5 + 0.5))
    memory.record(cfg(1.0, seq=128), "nan", trial=2)  # its peak fitted: safe for memory up to seq 128
    assert memory.risk(cfg(0.001, seq=128), "oom") == 0.0


def test_the_gate_reads_the_memory_model_unless_the_annotations_prove_the_answer():
    """Gate.risk: P(OOM) from the calibrated estimate (log-normal around it), but a config the space's annotations
    prove dominated by an OOM is 1 and one a run proved safe is 0, whatever the estimate says."""
    space = edge_space()
    space = SearchSpace(name="e", objective=space.objective, params=space.params, fixed={"memory.limit_gb": 1.0})
    peaks = {64: 700 * MiB, 128: 1000 * MiB, 256: 1400 * MiB}  # the estimator's guess by sequence length
    gate = Gate(space, None)
    gate.estimator = lambda overrides: peaks[int(next(o for o in overrides if "seq_len" in o).split("=")[1])]
    sigma = PRIOR_LOG_ERROR  # nothing measured: the prior spread
    for seq in (64, 128):
        expected = normal_sf(math.log(2**30 / peaks[seq]) / sigma)
        assert gate.risk(cfg(0.01, seq=seq)) == {Status.OOM: pytest.approx(expected, rel=1e-6)}  # no NaN known
    assert 0.0 < gate.risk(cfg(0.01))[Status.OOM] < 0.01
    gate.learn(0, cfg(0.01, seq=256), Status.OOM, {})
    assert gate.risk(cfg(0.1, seq=256))[Status.OOM] == 1.0  # lr has no memory effect: the same config for memory
    measured = {"estimated_memory_bytes": peaks[128], "peak_memory_bytes": peaks[128], "val_loss": 3.0}
    gate.learn(1, cfg(0.01, seq=128), Status.OK, {**measured, "first_loss": 4.0, "final_loss": 3.0})
    assert gate.risk(cfg(0.01, seq=64))[Status.OOM] == 0.0  # below a run that fitted
    assert 0.0 < gate.risk(cfg(0.01, opt="muon"))[Status.OOM] < 1.0  # another optimizer: the model again


def test_the_gate_calibrates_on_its_own_estimate_not_the_summarys():
    """The memory model maps what the gate predicts from to measured peaks: a summary's estimate from another
    estimator (a user's --estimator; an older core's, in a replayed table) must not enter the calibration."""
    space = edge_space()
    space = SearchSpace(name="e", objective=space.objective, params=space.params, fixed={"memory.limit_gb": 1.0})
    gate = Gate(space, None)
    gate.estimator = lambda overrides: 800 * MiB
    metrics = {"estimated_memory_bytes": 700 * MiB, "peak_memory_bytes": 820 * MiB, "val_loss": 3.0}
    gate.learn(0, cfg(0.01), Status.OK, {**metrics, "first_loss": 4.0, "final_loss": 3.0})
    assert gate.memory.memory_model.points == [(800 * MiB, 820 * MiB)]
    gate.estimator = None  # without an estimator of its own, the summary's is all there is
    gate.learn(1, cfg(0.003), Status.OK, {**metrics, "first_loss": 4.0, "final_loss": 3.0})
    assert gate.memory.memory_model.points[-1] == (700 * MiB, 820 * MiB)


# ------------------------------------------------------------------------------------- the proposer's use


def test_the_gp_holds_a_risky_candidate_back_while_a_safe_one_remains():
    space = edge_space()
    proposer = ModelBasedProposer(seed=0)
    candidates = [cfg(0.1), cfg(0.01), cfg(0.003)]

    def risk(p):
        return {"nan": 0.6} if p["optim.lr"] == 0.1 else {"nan": 0.1}

    ctx = ProposalContext(space, [], lambda p: None, risk)
    pick = proposer._first_runnable(ctx, candidates, [0, 1, 2], lambda i, s: f"P(no failure) {s:.2f}")
    assert pick.params == cfg(0.01)
    assert "P(no failure) 0.90" in pick.rationale and "1 better-ranked candidate(s) held back" in pick.rationale
    # With scores, the safe candidates are ranked again by score x P(no failure): 0.5 x 0.9 < 0.6 x 0.9.
    pick = proposer._first_runnable(ctx, candidates, [0, 1, 2], lambda i, s: "", score=[1.0, 0.5, 0.6])
    assert pick.params == cfg(0.003)
    # Every runnable candidate risky: the best-ranked is a bet, said so.
    ctx = ProposalContext(space, [], lambda p: None, lambda p: {"oom": 0.75})
    pick = proposer._first_runnable(ctx, candidates, [1, 0, 2], lambda i, s: "")
    assert pick.params == cfg(0.01) and "a bet" in pick.rationale
    assert model_based.RISK_LIMIT["nan"] < 0.6 and model_based.RISK_LIMIT["oom"] == GATE_OOM < 0.75


def test_the_start_up_design_keeps_to_the_safe_half_of_nan_axes():
    params = {
        **edge_space().params,
        "optim.warmup_steps": ChoiceParam(values=[0, 5, 10], nan="down", memory="none"),
    }
    space = SearchSpace(name="e", objective={"metric": "val_loss", "direction": "minimize"}, params=params)
    low, high = model_based._design_box(space)
    share = model_based.DESIGN_NAN_SHARE
    # Features: lr (nan up), seq (nan none), optim one-hot (2), warmup (nan down)
    assert list(low) == [0.0, 0.0, 0.0, 0.0, 1.0 - share]
    assert list(high) == [share, 1.0, 1.0, 1.0, 1.0]
    proposer = ModelBasedProposer(seed=3)
    seen = set()
    for _ in range(4):  # the first four start-up points, each run ok
        table = [_ok_row(p) for p in seen]
        pick = proposer.propose(None, ProposalContext(space, table, lambda p: None, lambda p: {}))
        assert pick.params["optim.lr"] in LRS[:3] and pick.params["optim.warmup_steps"] in (5, 10)
        seen.add(tuple(sorted(pick.params.items())))


def _ok_row(items):
    return TrialRow(number=0, state="COMPLETE", status=Status.OK, params=dict(items), objective=3.0)


def test_a_diverged_run_is_marked_in_its_row_and_counts_as_a_failure_for_the_gp(monkeypatch):
    import optuna  # function-level: only this test builds a study

    from autoresearch.study.storage import trial_rows

    study = optuna.create_study()
    for loss in (6.0, 30.0):  # first loss 5: 6 is training, 30 blew up (DIVERGENCE_RATIO 1.5)
        study.add_trial(
            optuna.trial.create_trial(
                params={},
                distributions={},
                value=loss,
                user_attrs={"status": "ok", "metrics": {"first_loss": 5.0, "final_loss": loss}},
            )
        )
    assert [r.diverged for r in trial_rows(study)] == [False, True]
    # The gp's failure estimate counts the diverged run as it counts a failed one.
    space = edge_space()
    base = {"number": 0, "state": "COMPLETE", "objective": 3.0}
    rows = [TrialRow(**base, status=Status.OK, params=cfg(lr)) for lr in (0.001, 0.003, 0.01, 0.1)]
    rows.append(TrialRow(**base, status=Status.OK, params=cfg(1.0), diverged=True))
    seen = []

    def failure_probability(x, ran, failed, lengths):
        seen.append(list(failed))
        return np.zeros(len(x))

    monkeypatch.setattr(model_based.surrogate, "failure_probability", failure_probability)
    assert ModelBasedProposer(seed=0).propose(None, ProposalContext(space, rows)) is not None
    assert seen == [[0.0, 0.0, 0.0, 0.0, 1.0]]
