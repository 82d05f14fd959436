"""The agent end to end on the fake trial: proposers, study contents, learning from failures, stop conditions."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml
from optuna.trial import TrialState

from autoresearch import cli as agent
from autoresearch import records as outcomes
from autoresearch.execute import Ended, LocalExecutor
from autoresearch.run.options import AgentOptions
from autoresearch.run.session import Session
from autoresearch.study import reaper, storage
from tests.agent_support import ESTIMATOR, FAKE, MBS, REC, ScriptedProposer, load, run_agent, space_file


def in_region(params, region):
    return params[MBS] >= region[MBS] and ["full", "none"].index(params[REC]) >= ["full", "none"].index(region[REC])


def test_auto_proposer_says_which_and_why(monkeypatch):
    assert agent.resolve_proposer("auto", {})[0] == "gp"
    assert agent.resolve_proposer("auto", {})[1].startswith("ANTHROPIC_API_KEY not set; Claude disabled")
    assert agent.resolve_proposer("auto", {"ANTHROPIC_API_KEY": "k"})[0] == "hybrid"
    assert agent.resolve_proposer("random", {}) == ("random", "requested with --proposer")
    with pytest.raises(SystemExit, match="ANTHROPIC_API_KEY"):
        agent.resolve_proposer("claude", {})
    with pytest.raises(SystemExit):
        agent.parse_args(["--space", "x.yaml", "--workers", "0"])
    assert agent.parse_args(["--space", "x.yaml", "--workers", "2"]).workers == 2


def test_default_study_records_every_trial(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    space = space_file(tmp_path)
    assert run_agent(tmp_path, space, "--trials", "8") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"proposer: gp (ANTHROPIC_API_KEY not set; Claude disabled. {agent.GP_WHY})"
    assert "best run: trial" in out and "| number | status |" in out
    study = load(tmp_path)
    assert study.user_attrs["space"] == "fake" and study.direction.name == "MAXIMIZE"
    assert storage.finished_count(study) == 8
    # the study's waste beside its best run, and beside each failed run what the agent knew before it
    failed = [t for t in study.trials if t.user_attrs["status"] in outcomes.WASTED]
    assert f"  paid failures: {len(failed)} runs (" in out  # the ledger's line
    lines = out.replace("\n" + " " * 11, " ").splitlines()  # a progress line wraps with this indent
    for t in failed:
        knew = outcomes.foreknowledge(t.user_attrs)
        (line,) = [x for x in lines if x.startswith(f"trial {t.number:4d} {t.user_attrs['status']}")]
        assert line.endswith(f"[before it ran: {knew}]") if knew else "before it ran" not in line
    for t in study.trials:
        assert t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        assert t.user_attrs["proposer"] == "gp" and t.user_attrs["status"] and t.user_attrs["rationale"]
        assert set(t.constraints) == set(outcomes.CONSTRAINT_KEYS)
        if t.state == TrialState.COMPLETE:
            assert Path(t.user_attrs["trial_dir"]).name == f"{t.number:04d}"
            assert (Path(t.user_attrs["trial_dir"]) / "trial_summary.json").exists()
            assert t.user_attrs["exit_code"] in (0, 10, 12)
        if t.user_attrs["status"] == "ok":
            assert t.value == t.user_attrs["objective"] and max(t.constraints.values()) == 0
        elif t.user_attrs["status"] in outcomes.FAILURE_KINDS:  # typed failure: COMPLETE + violated constraint
            assert t.constraints[t.user_attrs["status"]] == 1.0 and t.user_attrs["objective"] is None
    csv = pd.read_csv(tmp_path / "trials" / "fake" / "trials.csv")
    assert sorted(csv["number"]) == [t.number for t in study.trials]
    best = storage.best_trial(study)
    assert best.user_attrs["status"] == "ok" and study.best_trial.number == best.number
    assert f"best run: trial {best.number} (unconfirmed: a single run's ranking): " in out  # the headline, last
    assert f"  tokens_per_sec {best.value:,.0f} (one run)" in out.split("best run: trial")[-1]


def test_repeats_do_not_spend_the_budget_and_the_search_ends_when_nothing_is_new(tmp_path, capsys):
    space = space_file(tmp_path, params={MBS: {"type": "choice", "values": [8, 16]}})  # two configs in all
    assert run_agent(tmp_path, space, "--trials", "5") == 0
    assert "no config left that is new" in capsys.readouterr().out
    study = load(tmp_path)
    ran = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert sorted(t.params[MBS] for t in ran) == [8, 16]  # each config ran exactly once
    assert storage.finished_count(study) == 2  # repeats were not counted
    assert all(t.user_attrs["status"] == "duplicate" for t in study.trials if t.state == TrialState.PRUNED)


def test_typed_failures_are_complete_and_infeasible_and_best_ignores_them(tmp_path):
    # lr 0.1 diverges (nan); mbs 64/none runs out of memory; grid order makes both happen.
    space = space_file(tmp_path)
    assert run_agent(tmp_path, space, "--proposer", "grid", "--no-learn") == 0
    study = load(tmp_path)
    by_status = {}
    for t in study.trials:
        by_status.setdefault(t.user_attrs["status"], []).append(t)
    assert {"ok", "nan", "oom"} <= set(by_status)
    ok_values = [t.value for t in by_status["ok"]]
    for t in by_status["nan"] + by_status["oom"]:
        assert t.state == TrialState.COMPLETE
        assert t.user_attrs["failure_kind"] == t.user_attrs["status"]
        assert t.value >= min(ok_values) or t.value == float("-inf")  # never better than the worst ok
    assert study.best_value == max(ok_values)  # Optuna's own best skips infeasible trials
    assert len(study.trials) == 16  # every grid point once, then the grid is exhausted


def test_after_the_first_oom_no_dominated_proposal_runs(tmp_path, capsys):
    space = space_file(tmp_path)
    assert run_agent(tmp_path, space, "--proposer", "grid") == 0
    assert "all 16 grid points have been tried" in capsys.readouterr().out
    trials = load(tmp_path).trials
    ooms = [t for t in trials if t.user_attrs["status"] == "oom"]
    nans = [t for t in trials if t.user_attrs["status"] == "nan"]
    assert len(ooms) == 1 and len(nans) == 1  # each lesson paid for once
    first = ooms[0]
    later = [t for t in trials if t.number > first.number and in_region(t.params, first.params)]
    assert later, "the grid goes on into the dominated region"
    for t in later:
        assert t.state == TrialState.PRUNED and "dominated by OOM" in t.user_attrs["reason"]
        assert t.constraints["oom"] == 1.0
    after_nan = [t for t in trials if t.number > nans[0].number and t.params["optim.lr"] >= 0.1]
    assert after_nan and all(t.user_attrs["status"] == "pruned" for t in after_nan)


def test_memory_gate_prunes_before_any_oom(tmp_path):
    space = space_file(tmp_path, fixed={"memory.limit_gb": 1.0})
    assert run_agent(tmp_path, space, "--proposer", "grid", estimator=ESTIMATOR) == 0
    trials = load(tmp_path).trials
    assert not [t for t in trials if t.user_attrs["status"] == "oom"]
    gated = [t for t in trials if "predicted peak memory" in t.user_attrs.get("reason", "")]
    assert gated and all(t.state == TrialState.PRUNED and t.constraints["oom"] == 1.0 for t in gated)
    assert all(t.user_attrs["predicted_memory_bytes"] > 2**30 for t in gated)
    ran = [t for t in trials if t.user_attrs["status"] == "ok"]
    assert all(t.user_attrs["predicted_memory_bytes"] <= 2**30 for t in ran)


def test_random_proposer_and_space_rejections_do_not_count(tmp_path):
    space = space_file(tmp_path, constraints=[f"{MBS} <= 16"])
    assert run_agent(tmp_path, space, "--proposer", "random", "--trials", "6", "--no-learn") == 0
    study = load(tmp_path)
    rejected = [t for t in study.trials if t.user_attrs["status"] == "rejected"]
    assert rejected, "random sampling over mbs 8..64 hits mbs > 16"
    assert all(t.state == TrialState.PRUNED and t.constraints["space"] == 1.0 for t in rejected)
    assert all("constraint violated" in t.user_attrs["reason"] for t in rejected)
    repeats = [t for t in study.trials if t.user_attrs["status"] == "duplicate"]
    assert storage.finished_count(study) == 6 == len(study.trials) - len(rejected) - len(repeats)
    assert {t.user_attrs["proposer"] for t in study.trials} <= {
        "random",
        "random (random repeated a config)",
        "random (random broke the space's constraints)",
    }


def test_a_sampler_that_keeps_breaking_the_space_gets_a_valid_config(tmp_path):
    """Independent TPE cannot learn a joint rule; after 3 rejections in a row the agent enqueues a valid config."""
    from autoresearch.search.chooser import REPEATS_BEFORE_RANDOM

    space = space_file(tmp_path, constraints=[f"{MBS} * optim.lr <= 0.008"])  # 1 valid (mbs, lr) pair of 8
    assert run_agent(tmp_path, space, "--proposer", "tpe", "--trials", "4", "--no-learn") == 0
    statuses = [t.user_attrs["status"] for t in load(tmp_path).trials]
    runs = "".join("r" if s == "rejected" else "." for s in statuses).split(".")
    assert max(len(r) for r in runs) <= REPEATS_BEFORE_RANDOM, statuses
    labels = {t.user_attrs["proposer"] for t in load(tmp_path).trials}
    assert "random (tpe broke the space's constraints)" in labels


def test_grid_resume_goes_on_and_stops_when_exhausted(tmp_path, capsys):
    space = space_file(tmp_path)
    assert run_agent(tmp_path, space, "--proposer", "grid", "--trials", "5") == 0
    assert storage.finished_count(load(tmp_path)) == 5
    assert run_agent(tmp_path, space, "--proposer", "grid", "--trials", "100") == 0
    study = load(tmp_path)
    assert len(study.trials) == 16
    assert len({tuple(sorted(t.params.items())) for t in study.trials}) == 16  # no point twice
    capsys.readouterr()
    assert run_agent(tmp_path, space, "--proposer", "grid", "--trials", "100") == 0
    assert len(load(tmp_path).trials) == 16 and "grid points have been tried" in capsys.readouterr().out


def test_patience_stops_after_trials_without_improvement(tmp_path, capsys):
    # Grid order runs the best config (mbs 16, none, lr 0.001) early; everything after is worse or pruned.
    space = space_file(tmp_path)
    assert run_agent(tmp_path, space, "--proposer", "grid", "--patience", "2", "--no-learn") == 0
    assert "without improving the best (--patience 2)" in capsys.readouterr().out
    study = load(tmp_path)
    best = storage.best_trial(study)
    ran_after = [t for t in study.trials if t.number > best.number and t.user_attrs["status"] != "pruned"]
    assert len(ran_after) == 2


def test_errors_fail_and_the_agent_gives_up_after_max_errors(tmp_path):
    space = space_file(tmp_path, fixed={"fake.error": True})
    assert run_agent(tmp_path, space, "--trials", "10", "--max-errors", "3") == 1
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 3
    assert all(t.user_attrs["status"] == "error" and t.user_attrs["exit_code"] == 1 for t in study.trials)
    assert storage.finished_count(study) == 0


def test_enqueued_proposals_invalid_ones_and_the_cost_ledger(tmp_path):
    space = space_file(tmp_path)
    opts = AgentOptions(
        space=str(space),
        proposer="tpe",
        trials=4,
        trials_dir=str(tmp_path / "trials"),
        command=shlex.split(FAKE),
        estimator=None,
        max_cost=0.035,
        seed=0,
        progress=False,
    )
    loop = Session(opts, "tpe")
    loop.chooser.proposer = ScriptedProposer(
        [
            {MBS: 16, REC: "none", "optim.lr": 0.001},
            {MBS: 12, REC: "none", "optim.lr": 0.001},  # not a choice: ignored, TPE picks this trial
            None,
            {MBS: 8, REC: "full", "optim.lr": 0.001},
        ]
    )
    assert loop.run().code == 0
    study = load(tmp_path)
    t0, t1, t2, t3 = study.trials[:4]
    assert (t0.params, t0.user_attrs["proposer"], t0.user_attrs["rationale"]) == (
        {MBS: 16, REC: "none", "optim.lr": 0.001},
        "scripted",
        "because",
    )
    assert t1.user_attrs["proposer"] == "tpe" and t2.user_attrs["proposer"] == "tpe"
    assert all(t.user_attrs["llm_usage"]["cost_usd"] == 0.01 for t in (t0, t1, t2, t3))
    assert len(study.trials) == 4 and storage.llm_cost(study) == pytest.approx(0.04)  # stopped at max-cost
    ctx = loop.chooser.proposer.contexts[1]
    assert [r.number for r in ctx.table] == [0]
    assert ctx.check({MBS: 16, REC: "none", "optim.lr": 0.001}).startswith("duplicate of trial 0")
    assert MBS in ctx.check({MBS: 12, REC: "none", "optim.lr": 0.001})
    assert ctx.check({MBS: 8, REC: "none", "optim.lr": 0.001}) is None


def test_tpe_with_typed_constraints_avoids_the_oom_region(tmp_path):
    """Same budget and seed: TPE, told OOMs as infeasible, proposes the OOM region far less than random."""
    params = {
        MBS: {"type": "choice", "values": [4, 8, 16, 32, 64, 128], "memory": "up"},
        REC: {"type": "choice", "values": ["full", "none"], "memory": "up"},
        "optim.lr": {"type": "float", "low": 1e-4, "high": 3e-2, "log": True, "memory": "none"},
    }
    counts = {}
    for proposer in ("tpe", "random"):
        space = space_file(tmp_path, name=proposer, params=params)
        assert run_agent(tmp_path, space, "--proposer", proposer, "--trials", "40", "--no-learn") == 0
        trials = load(tmp_path, proposer).trials
        oom = [(t.params[MBS] >= 32 and t.params[REC] == "none") or t.params[MBS] >= 128 for t in trials]
        assert any(oom), "both must meet the OOM region to learn from it"
        half = oom[len(oom) // 2 :]
        counts[proposer] = sum(half) / len(half)
    assert counts["tpe"] <= 0.1
    assert counts["random"] >= 0.2
    assert counts["random"] >= 3 * counts["tpe"]


def test_a_malformed_space_exits_2_with_the_reason(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nobjective: {metric: tokens_per_sec, direction: sideways}\nparams: {}\n")
    assert run_agent(tmp_path, bad) == 2
    assert "bad.yaml" in capsys.readouterr().err


def test_reap_only_trials_whose_agent_is_gone(tmp_path):
    import socket
    import subprocess
    import time

    url = f"sqlite:///{tmp_path / 'reap.db'}"
    study = optuna.create_study(study_name="reap", storage=url)
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    here = socket.gethostname()
    cases = {
        "dead agent here": {"agent": {"host": here, "pid": dead_pid, "start": None}},
        "live agent here": {"agent": reaper.identity()},
        "other host, fresh heartbeat": {"agent": {"host": "elsewhere", "pid": 1}, "heartbeat_at": time.time()},
        "other host, silent": {"agent": {"host": "elsewhere", "pid": 1}, "heartbeat_at": time.time() - 3600},
        "never tagged": {},
    }
    for attrs in cases.values():
        t = study.ask(dist)
        for k, v in attrs.items():
            t.set_user_attr(k, v)
    store = storage.open_storage(url)
    notes = reaper.reap_stale(study, store)

    def states():
        return {name: t.state for name, t in zip(cases, study.get_trials()[: len(cases)], strict=True)}

    # just asked: its agent may be about to tag it (another agent starting now must leave it alone)
    assert states() == {
        "dead agent here": TrialState.FAIL,
        "live agent here": TrialState.RUNNING,
        "other host, fresh heartbeat": TrialState.RUNNING,
        "other host, silent": TrialState.FAIL,
        "never tagged": TrialState.RUNNING,
    }
    assert sum("reaped on resume" in n for n in notes) == 2 and sum("left alone" in n for n in notes) == 3
    notes = reaper.reap_stale(study, store, now=time.time() + reaper.UNTAGGED_GRACE_SEC + 1)
    assert states()["never tagged"] == TrialState.FAIL and states()["other host, fresh heartbeat"] == TrialState.RUNNING
    assert sum("reaped on resume" in n for n in notes) == 1 and sum("left alone" in n for n in notes) == 2
    requeued = study.get_trials(states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["retry_of"] for t in requeued) == [0, 3, 4]
    reaped = study.get_trials()[0]
    assert (reaped.user_attrs["status"], reaped.user_attrs["reason"]) == ("reaped", reaper.REAP_REASON)


def test_hybrid_through_the_sdk_enqueues_claude_and_records_every_call(tmp_path, capsys, monkeypatch):
    from autoresearch.search.proposers.hybrid import is_claude_turn
    from tests.fake_anthropic import FakeAnthropic

    proposal = {MBS: 16, REC: "none", "optim.lr": 0.001, "rationale": "largest micro-batch that fits"}
    with FakeAnthropic() as fake:
        fake.tool_use(proposal, times=None)  # always the same answer: a duplicate from the second turn on
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
        assert run_agent(tmp_path, space_file(tmp_path), "--trials", "6", "--claude-fraction", "0.5") == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("proposer: hybrid (ANTHROPIC_API_KEY is set")
    trials = load(tmp_path).trials
    # Which configs TPE repeats (each repeat is a skipped trial with a number of its own) depends on the CPU's
    # floating point (numpy's AVX-512 and AVX2 kernels differ in the last bits), so the test asserts what holds
    # for every turn rather than a sequence of trials.
    claude_turns = [t for t in trials if is_claude_turn(t.number, 0.5)]  # the odd numbers
    assert len(claude_turns) >= 3 and claude_turns[0].number == 1
    assert trials[1].user_attrs["proposer"] == "claude" and trials[1].params == {
        k: v for k, v in proposal.items() if k != "rationale"
    }
    assert trials[1].user_attrs["rationale"] == "largest micro-batch that fits"
    # Every later Claude turn repeats trial 1: Claude is told so, gives up after its retries, and the hybrid's
    # classical half takes the trial, named as what chose it; the decline and the tokens spent stay on the record.
    for t in claude_turns[1:]:
        assert t.user_attrs["proposer"] == "gp"
        assert t.user_attrs["fallback_from"] == "claude" and t.user_attrs["llm_usage"]["calls"] == 3
    assert claude_turns[0].user_attrs["llm_usage"]["calls"] == 1
    others = [t for t in trials if not is_claude_turn(t.number, 0.5)]
    assert all("llm_usage" not in t.user_attrs and "fallback_from" not in t.user_attrs for t in others)
    assert all(t.user_attrs["proposer"] == "gp" for t in others)  # the classical half: the suite's winner
    total = sum(t.user_attrs["llm_usage"]["cost_usd"] for t in claude_turns)
    assert total > 0 and storage.llm_cost(load(tmp_path)) == pytest.approx(total)
    assert len(fake.messages_requests) == 1 + 3 * (len(claude_turns) - 1)


def test_timeout_stops_before_the_next_trial(tmp_path, capsys):
    assert run_agent(tmp_path, space_file(tmp_path), "--timeout", "0") == 0
    assert "--timeout 0s reached" in capsys.readouterr().out
    assert load(tmp_path).trials == []


def test_resume_rebuilds_the_feasibility_memory(tmp_path):
    space = space_file(tmp_path)
    assert run_agent(tmp_path, space, "--proposer", "grid", "--trials", "11") == 0
    first = load(tmp_path).trials
    assert first[-1].user_attrs["status"] == "oom"  # grid order: (32, none, 0.001) is the 11th point
    assert run_agent(tmp_path, space, "--proposer", "grid") == 0  # a new session, a new process's memory
    later = [t for t in load(tmp_path).trials if t.number > first[-1].number and in_region(t.params, first[-1].params)]
    assert later and all(f"dominated by OOM in trial {first[-1].number}" in t.user_attrs["reason"] for t in later)


class _LosingExecutor(LocalExecutor):
    """Runs trials here, but says that trial 0's node failed or that a person cancelled it (``verdict``), as the
    Slurm executor does when Slurm says so."""

    def __init__(self, verdict: outcomes.Status):
        self.verdict = verdict

    def start(self, spec, slot):
        job = super().start(spec, slot)
        if spec.name.endswith(".0"):
            poll = job.poll
            job.poll = lambda timeout: (e := poll(timeout)) and Ended(e.exit_code, self.verdict, "slurm said so")
        return job


@pytest.mark.parametrize("verdict, rerun", [(outcomes.Status.NODE_FAIL, True), (outcomes.Status.CANCELLED, False)])
def test_a_trial_its_executor_lost_says_nothing_of_its_config(tmp_path, verdict, rerun):
    opts = AgentOptions(
        space=str(space_file(tmp_path)),
        proposer="grid",
        trials=2,
        trials_dir=str(tmp_path / "trials"),
        command=shlex.split(FAKE),
        estimator=None,
        progress=False,
        confirm=0,
    )
    loop = Session(opts, "grid")
    loop.executor = _LosingExecutor(verdict)
    assert loop.run().code == 0
    study = load(tmp_path)
    t0 = study.trials[0]
    assert t0.state == TrialState.FAIL and t0.user_attrs["status"] == verdict
    assert "slurm said so" in t0.user_attrs["reason"]
    retries = [t for t in study.trials if t.user_attrs.get("retry_of") == 0]
    assert len(retries) == int(rerun)
    if rerun:
        assert retries[0].params == t0.params and retries[0].user_attrs["status"] == "ok"
    assert storage.finished_count(study) == 2  # the lost trial does not count toward --trials


def test_a_multi_node_space_needs_an_executor_that_has_nodes(tmp_path):
    doc = yaml.safe_load(space_file(tmp_path).read_text())
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump({**doc, "world_size": 2, "resources": {"nodes": 2}}))
    opts = AgentOptions(space=str(path), trials_dir=str(tmp_path / "trials"), command=shlex.split(FAKE))
    with pytest.raises(SystemExit, match="resources.nodes.*use --executor slurm"):
        Session(opts, "grid")
    opts.executor = "slurm"
    assert Session(opts, "grid").executor.name == "slurm"
