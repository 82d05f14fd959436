"""``--plan``: the step-time model as the search's prior (``autoresearch.search.prior``, the gp proposer with a
prior, the session and the report). The "machine" of these tests is the model itself with factors it does not know
(and, in one test, a slowdown of one layout no factor explains): the refit must recover the factors, and the search
must start from the plan and correct it."""

import json

import numpy as np
import pytest
import yaml

from autoresearch.cli import parse_args
from autoresearch.core_adapter import predict_step
from autoresearch.records import Status, TrialRow, config_key
from autoresearch.report.table import model_error_text, study_table
from autoresearch.search.prior import RIDGE, StepPrior, parts_of
from autoresearch.search.proposers.base import ProposalContext
from autoresearch.search.proposers.model_based import ModelBasedProposer
from autoresearch.space import SearchSpace, SpaceError, load_space
from autoresearch.study.storage import trial_rows
from core.perf import estimate_step, planned_config
from core.perf.calibrate import BASE, START, fit
from core.runtime.cache_dirs import CACHE_ENV
from tests.agent_support import load, run_agent
from tests.unit.core.perf.test_calibrate import FITTED, LINK, PEAK, calibration_steps

MBS, REC = "training.micro_batch_size", "memory.recompute"
DP, TP, PP = "parallel.dp_shard", "parallel.tp", "parallel.pp"
SPACE = {
    "name": "plan8",
    "objective": {"metric": "tokens_per_sec", "direction": "maximize"},
    "world_size": 8,
    "fixed": {
        "model": "llama3-8b",
        "cluster": "h100-sxm",
        "device": "GPU",
        "cluster.devices_per_node": 8,
        "training.precision": "bf16",
        "training.seq_len": 4096,
        "training.global_batch_size": 32,
    },
    "params": {
        DP: {"type": "choice", "values": [1, 2, 4, 8]},
        TP: {"type": "choice", "values": [1, 2, 4, 8]},
        PP: {"type": "choice", "values": [1, 2]},
        MBS: {"type": "choice", "values": [1, 2, 4]},
        REC: {"type": "choice", "values": ["none", "full"]},
    },
    "constraints": [f"{DP} * {TP} * {PP} == world_size"],
    "baseline": {DP: 8},  # FSDP over the node: every layout uses its eight devices
}
TRUE_FACTORS = np.array([1.3, 3.0, 1.0, 1.0])  # compute, communication, launches and dispatch (none on H100)


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    path = tmp_path_factory.mktemp("prior") / "plan8.yaml"
    path.write_text(yaml.safe_dump(SPACE, sort_keys=False))
    return load_space(path)


def machine(space, slow=None):
    """{config_key: (status, tokens/s)} of every grid point on a "machine" that is the model with TRUE_FACTORS,
    and ``slow(params)`` times slower where given; over the device's memory is an OOM."""
    model = StepPrior(space)
    out = {}
    for p in space.grid():
        est = model.estimate(p)
        if not est.fits:
            out[config_key(p)] = (Status.OOM, None)
            continue
        seconds = parts_of(est.breakdown) @ TRUE_FACTORS * (slow(p) if slow else 1.0)
        out[config_key(p)] = (Status.OK, est.tokens_per_sec * est.step_time_sec / seconds)
    return out


def row(number, params, outcome):
    return TrialRow(number=number, state="COMPLETE", status=outcome[0], params=params, objective=outcome[1])


def test_parts_add_up_to_the_models_step_time(space):
    """The three refitted parts split the whole step, and with factors of 1 the prior is the model: checked
    against the full Hydra path's prediction (``python -m core.perf``'s) on every seventh point."""
    prior = StepPrior(space)
    for p in space.grid()[::7]:
        est = estimate_step(planned_config([f"{k}={v}" for k, v in {**space.fixed, **p}.items()]))
        assert parts_of(prior.estimate(p).breakdown).sum() == pytest.approx(est.step_time_sec, rel=1e-9)
        assert prior.predict(p) == pytest.approx(est.tokens_per_sec, rel=1e-9)


def test_refit_recovers_the_machines_factors(space):
    """Every ok point of the machine: the refit is the ridge least-squares solution of the runs' relative errors
    (checked by the normal equations, in float64), which is the machine's factors up to the ridge's pull (without
    it, exactly); the launch factor, which no run on H100 exercises (no launches are charged there), stays at 1."""
    prior = StepPrior(space)
    outcomes = machine(space)
    rows = [row(i, p, outcomes[config_key(p)]) for i, p in enumerate(space.grid())]
    factors = prior.refit(rows)
    ok = [r for r in rows if r.status == Status.OK]
    a = np.array(
        [parts_of(prior.estimate(r.params).breakdown) / prior.measured_seconds(r.params, r.objective) for r in ok]
    )
    for ridge, expected in ((RIDGE, factors), (0.0, TRUE_FACTORS)):
        normal = a.T @ a + ridge * np.eye(4)
        normal[2, 2] += 1e-12  # the launch and dispatch columns are all zero on H100
        normal[3, 3] += 1e-12
        solved = np.linalg.solve(normal, a.T @ np.ones(len(ok)) + ridge)
        assert solved[:2] == pytest.approx(expected[:2], rel=1e-6)  # (without the ridge, launches are unknown)
    assert factors == pytest.approx(TRUE_FACTORS, rel=0.06) and factors[2] == factors[3] == 1.0
    for r in ok:  # the refitted model predicts the machine to the same few percent
        assert prior.predict(r.params) == pytest.approx(r.objective, rel=0.06)
    first = StepPrior(space)  # one run: each part moved by its share of the step, short of the run by the ridge's
    # pull: the unrefitted model's relative error e times ridge / (ridge + |a|^2), a the parts over the run's seconds
    one, share = first.refit(ok[:1]), parts_of(first.estimate(ok[0].params).breakdown)
    a0 = share / first.measured_seconds(ok[0].params, ok[0].objective)
    left = (1 - a0.sum()) * RIDGE / (RIDGE + a0 @ a0)
    assert first.predict(ok[0].params) == pytest.approx(ok[0].objective / (1 - left), rel=1e-6)
    assert (one[0] - 1) / (one[1] - 1) == pytest.approx(share[0] / share[1], rel=1e-6) and one[2] == one[3] == 1.0


def test_the_search_starts_from_the_plans_best_runnable_point(space):
    """The first proposal is the fastest predicted point (by the core's estimate, unrefitted) that the agent would
    run; a point the gate refuses is passed over for the next."""
    order = sorted(space.grid(), key=lambda p: -predict_step({**space.fixed, **p}).tokens_per_sec)
    first = ModelBasedProposer(seed=0, prior=StepPrior(space)).propose(None, ProposalContext(space=space))
    assert first.params == order[0] and "the plan's best runnable" in first.rationale
    refused = config_key(order[0])
    ctx = ProposalContext(space=space, check=lambda p: "over memory" if config_key(p) == refused else None)
    assert ModelBasedProposer(seed=0, prior=StepPrior(space)).propose(None, ctx).params == order[1]


def test_of_points_the_plan_cannot_tell_apart_it_runs_the_core_defaults_first(tmp_path):
    """A model that prices neither the execution mode nor activation SWAP: listed first in the file, pynative and
    swap on tie with jit and swap off, and the first run is the core's default (jit, no swap), not the file's
    first value; a run off the defaults of what the model does not price leaves its factors alone."""
    doc = {**SPACE, "params": {**SPACE["params"]}}
    doc["fixed"] = {**SPACE["fixed"], "cluster.pynative_overhead_us": 0.0}  # H100's profile prices no PyNative
    doc["params"]["training.mode"] = {"type": "choice", "values": ["pynative", "jit"]}
    doc["params"]["memory.swap"] = {"type": "choice", "values": [True, False]}
    path = tmp_path / "modes.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    space = load_space(path)
    prior = StepPrior(space)
    best = max(space.grid(), key=lambda p: prior.predict(p) or 0.0)  # (None: a point the core refuses)
    ties = [p for p in space.grid() if prior.predict(p) == prior.predict(best)]
    assert len(ties) == 3  # the two modes times the two swaps, but swap needs pynative
    first = ModelBasedProposer(seed=0, prior=prior).propose(None, ProposalContext(space=space)).params
    assert (
        first["training.mode"] == "jit"
        and first["memory.swap"] is False
        and config_key(first) in {config_key(p) for p in ties}
    )
    assert prior.unpriced == {"training.mode", "memory.swap"}
    # a pynative run 3x slower than the model says refits nothing: its difference is the GP's to learn
    slow = {**first, "training.mode": "pynative"}
    assert list(prior.refit([row(0, slow, (Status.OK, prior.predict(slow) / 3))])) == [1.0, 1.0, 1.0, 1.0]
    assert prior.refit([row(0, first, (Status.OK, prior.predict(first) / 3))])[0] > 2.0  # a jit run does


@pytest.mark.parametrize("seed", [0, 1])
def test_the_search_corrects_what_the_plan_gets_wrong(space, seed):
    """A machine where full FSDP over 8 ranks is 40% slower than any factor explains: the plan's favourite is
    wrong, and the search reaches the true best in a few runs (random search needs ~20 of the 42 points)."""
    outcomes = machine(space, slow=lambda p: 1.4 if p[DP] == 8 else 1.0)
    best = max((o[1], k) for k, o in outcomes.items() if o[1] is not None)[1]
    proposer, rows = ModelBasedProposer(seed=seed, prior=StepPrior(space)), []
    while not rows or config_key(rows[-1].params) != best:
        params = proposer.propose(None, ProposalContext(space=space, table=rows)).params
        rows.append(row(len(rows), params, outcomes[config_key(params)]))
        assert len(rows) <= 6, [r.params for r in rows]
    assert rows[0].params[DP] == 8  # the plan's favourite, which this machine makes lose


def test_plan_needs_a_step_time_objective_and_the_gp(space, tmp_path):
    doc = {**SPACE, "objective": {"metric": "val_loss", "direction": "minimize"}}
    path = tmp_path / "loss.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(SpaceError, match="objective.metric.*tokens_per_sec, step_time_ms_median"):
        StepPrior(load_space(path))
    with pytest.raises(SystemExit) as exc:
        parse_args(["--space", str(path), "--plan", "--proposer", "tpe"])
    assert exc.value.code == 2


def test_the_report_shows_predicted_against_measured(tmp_path, capsys):
    """The agent with --plan over the fake trial: every trial that ran carries the plan's figure, the table a
    ``predicted`` column, and the model's running error is the median of the rows' own errors."""
    doc = {**SPACE, "trial_command": "core.train", "budget": {"trials": 6}}
    doc["fixed"] = {**SPACE["fixed"], "training.seq_len": 256}
    path = tmp_path / "plan8.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert run_agent(tmp_path, path, "--plan", "--proposer", "gp", "--trials", "6") == 0
    study = load(tmp_path, "plan8")
    rows = [r for r in trial_rows(study) if r.status == Status.OK]
    assert len(rows) >= 3 and all(r.predicted_objective > 0 for r in rows)
    df = study_table(study)
    assert list(df.columns).index("predicted") == list(df.columns).index("objective") + 1
    median = float(np.median([abs(r.predicted_objective / r.objective - 1) for r in rows]))
    assert f"median |error| {100 * median:.1f}% over {len(rows)} ok runs" in model_error_text(trial_rows(study))
    assert "(plan " in capsys.readouterr().out  # each trial's line shows the plan's figure


def test_claude_is_shown_the_plans_best_unrun_configs(space, monkeypatch, tmp_path):
    """With --plan Claude's request (through the real SDK, to the fake server) carries the plan: the best predicted
    configs not run yet, in the model's order, and the model's error so far."""
    from autoresearch.search.proposers.claude import ClaudeProposer
    from tests.fake_anthropic import FakeAnthropic

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))
    order = sorted(space.grid(), key=lambda p: -predict_step({**space.fixed, **p}).tokens_per_sec)
    done = row(0, order[0], (Status.OK, predict_step({**space.fixed, **order[0]}).tokens_per_sec / 1.25))
    done.predicted_objective = predict_step({**space.fixed, **order[0]}).tokens_per_sec
    with FakeAnthropic() as fake:
        fake.tool_use({**order[1], "rationale": "the plan's next"})
        claude = ClaudeProposer(base_url=fake.url, max_retries=1, timeout=10, prior=StepPrior(space))
        proposal = claude.propose(None, ProposalContext(space=space, table=[done]))
        text = fake.messages_requests[0].json["messages"][0]["content"][0]["text"]
    assert proposal.params == order[1]
    plan = text.split("# The plan\n", 1)[1]
    assert "off by 25% at the median over 1 runs" in plan  # predicted 1.25x the measured
    listed = [line.split(" | ")[0].lstrip("| ") for line in plan.splitlines() if line.startswith('| {"')]
    assert listed[0] == json.dumps(order[1], sort_keys=True, separators=(",", ":"))  # the run one is gone
    assert len(listed) == 10


def _session(tmp_path, doc: dict, plan: bool | None = None):
    from autoresearch.run.options import AgentOptions
    from autoresearch.run.session import Session

    path = tmp_path / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump({**doc, "trial_command": "core.train"}, sort_keys=False))
    return Session(AgentOptions(space=str(path), trials_dir=str(tmp_path / "trials"), plan=plan), "gp")


def test_by_default_the_agent_plans_where_the_model_answers_without_measuring(tmp_path, monkeypatch):
    """Without --plan or --no-plan: an accelerator's profile is known, so the gp plans (and says so); --no-plan
    searches without; a CPU this machine has not measured plans too, its micro-benchmarks run first (when the
    study runs, not when the session is made: the note says so); an objective the model does not predict has
    nothing to plan, and nothing is said."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))  # a machine with no calibration
    planned = _session(tmp_path, SPACE)
    assert planned.prior is not None and "plans before it pays" in planned.plan_note
    assert _session(tmp_path, SPACE, plan=False).prior is None
    cpu = {**SPACE, "name": "cpu", "fixed": {"model": "tiny", "training.global_batch_size": 8}, "world_size": 2}
    cpu["params"] = {DP: {"type": "choice", "values": [1, 2]}, MBS: {"type": "choice", "values": [1, 2]}}
    cpu["constraints"] = []
    del cpu["baseline"]  # the core's defaults: one process
    uncalibrated = _session(tmp_path, cpu)
    assert uncalibrated.prior is not None and "micro-benchmarks run first" in uncalibrated.plan_note
    loss = {**SPACE, "name": "loss", "objective": {"metric": "val_loss", "direction": "minimize"}}
    unplanned = _session(tmp_path, loss)
    assert unplanned.prior is None and unplanned.plan_note == ""


def test_a_study_calibrates_the_model_from_its_runs_as_the_command_does_from_its_trials(tmp_path, monkeypatch):
    """The calibration's four fitted layouts, measured on a machine whose numbers are ``truth``, told to a study as
    its runs: its model (the micro-benchmarks' numbers, refitted by part to the runs: autoresearch.search.prior)
    reproduces them, and predicts the layouts the command holds out as the command's fitted profile does. Before the
    runs the micro-benchmarks alone are far off, so the agreement is the refit's doing."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))  # nothing cached: every number is given
    truth = {**PEAK, **LINK, **FITTED}
    measured = calibration_steps(truth)
    command = {**PEAK, **LINK, **fit(measured, {**PEAK, **LINK, **START})}
    micro = {**PEAK, **LINK, "matmul_efficiency": 1.0, "launch_overhead_us": 1000.0}
    micro |= {"pynative_overhead_us": 6000.0, "intra_node_latency_us": 300.0}  # a micro-benchmark's, not a trial's
    fixed = dict(override.split("=", 1) for override in BASE)
    fixed = {k: int(v) if v.isdigit() else v for k, v in fixed.items()}
    space = SearchSpace(
        name="layouts",
        objective={"metric": "tokens_per_sec", "direction": "maximize"},
        world_size=2,
        fixed={**fixed, **{f"cluster.{k}": v for k, v in micro.items()}},
        params={
            "parallel.dp_replicate": {"type": "choice", "values": [1, 2]},
            "parallel.tp": {"type": "choice", "values": [1, 2]},
            "training.micro_batch_size": {"type": "choice", "values": [1, 4, 8]},
            "training.mode": {"type": "choice", "values": ["jit", "pynative"]},
        },
        constraints=["parallel.dp_replicate * parallel.tp <= world_size"],
    )
    point = {"parallel.dp_replicate": 1, "parallel.tp": 1, "training.micro_batch_size": 8, "training.mode": "jit"}
    as_run = {  # the calibration's fitted layouts as the study's params
        "1 process": point,
        "1 process, micro 1": {**point, "training.micro_batch_size": 1},
        "1 process, pynative": {**point, "training.mode": "pynative"},
        "tp=2": {**point, "parallel.tp": 2},
    }
    tokens = fixed["training.global_batch_size"] * fixed["training.seq_len"]
    rows = [
        TrialRow(number=i, state="COMPLETE", status="ok", params=params, objective=tokens / measured[name])
        for i, (name, params) in enumerate(as_run.items())
    ]
    prior = StepPrior(space)
    prior.calibrate_in_study(micro)
    held_out = [  # the command's held-out layouts this space has, and their mixes
        {**point, "parallel.dp_replicate": 2, "training.micro_batch_size": 4},
        {**point, "parallel.tp": 2, "training.micro_batch_size": 1},
        {**point, "training.mode": "pynative", "training.micro_batch_size": 1},
        {**point, "parallel.tp": 2, "training.mode": "pynative"},
    ]

    def command_says(params: dict) -> float:
        sets = [f"cluster.{k}={v}" for k, v in command.items()]
        layout = [f"{k}={v}" for k, v in params.items()] + [f"cluster.devices_per_node={prior.ranks(params)}"]
        return tokens / estimate_step(planned_config([*BASE, *layout, *sets])).step_time_sec

    before = [prior.predict(p) / command_says(p) - 1 for p in held_out]
    assert max(map(abs, before)) > 0.3  # the micro-benchmarks alone: far off
    prior.refit(rows)
    for key, value in FITTED.items():  # the numbers behind the measurements, as the command finds them
        assert prior.numbers[key] == pytest.approx(command[key], rel=1e-3) == pytest.approx(value, rel=1e-3), key
    for row in rows:  # the runs reproduced
        assert prior.predict(row.params) == pytest.approx(row.objective, rel=1e-3)
    for params in held_out:  # and what the command holds out, predicted as its profile predicts it
        assert prior.predict(params) == pytest.approx(command_says(params), rel=1e-3), params
    assert prior.held_out_errors(rows) and prior.factors.tolist() == [1.0] * 4
