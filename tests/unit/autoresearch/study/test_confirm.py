"""Confirmation: the search's front-runners re-run, mean ± σ per config, and a winner only beyond 2σ."""

import json
import math
import statistics
from html import escape as html_escape
from pathlib import Path

from optuna.trial import TrialState
from pytest import approx

from autoresearch.space import load_space
from autoresearch.study import confirm, reaper, storage
from tests.agent_support import MBS, load, run_agent, space_file

NOISE = {"fake.noise": 0.05}


def confirmations(study):
    return [t for t in study.trials if storage.is_confirmation(t)]


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
    """(mean(a) - mean(b), standard error of that difference), from the runs themselves."""
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    return statistics.mean(a) - statistics.mean(b), se


def test_front_runners_rerun_interleaved_and_a_clear_lead_names_the_winner(tmp_path, capsys):
    space = space_file(tmp_path, fixed={"fake.noise": 0.01}, params={MBS: {"type": "choice", "values": [8, 16, 32]}})
    assert run_agent(tmp_path, space, "--proposer", "grid", "--trials", "3", "--repeats", "3", confirm=2) == 0
    out = capsys.readouterr().out
    study = load(tmp_path)
    runs = confirmations(study)
    # The search's 3 trials, then 2 configs round by round, none counted toward --trials; after two rounds the
    # runner-up is decisively behind (below), so the third round is not run: 4 runs, not 2 x 3.
    assert storage.finished_count(study) == 3 and len(runs) == 4
    assert [t.user_attrs["repeat"] for t in runs] == [0, 0, 1, 1]
    assert all(t.user_attrs["proposer"] == "confirm" and t.state == TrialState.COMPLETE for t in runs)
    search = sorted(
        (t for t in study.trials if not storage.is_confirmation(t) and storage.feasible(t)), key=lambda t: -t.value
    )
    assert {t.user_attrs["confirmation_of"] for t in runs} == {search[0].number, search[1].number}
    assert storage.best_trial(study).number == search[0].number  # a lucky repeat is never the search's best
    by_origin = {
        n: [t.value for t in runs if t.user_attrs["confirmation_of"] == n] for n in (search[0].number, search[1].number)
    }
    v = confirm.verdict(study, 2, 3)
    for c in v.configs:  # mean ± σ of the confirmation runs alone, computed here from the study
        assert c.mean == approx(statistics.mean(by_origin[c.trial]), rel=1e-12)
        assert c.std == approx(statistics.stdev(by_origin[c.trial]), rel=1e-12)
    # mbs 32 goes out of memory; mbs 16 runs 5.6% faster than mbs 8 (fake_trial's rule: 47.1 vs 44.6 k tokens/s),
    # beyond 1% noise
    assert next(t for t in study.trials if t.params[MBS] == 32).user_attrs["status"] == "oom"
    winner, runner_up = (next(t for t in search if t.params[MBS] == m) for m in (16, 8))
    lead, se = welch(by_origin[winner.number], by_origin[runner_up.number])
    assert lead > 2 * se and v.winner.trial == winner.number and v.lead == approx(lead, rel=1e-9)
    assert v.line.startswith(f"winner: trial {winner.number}'s config (") and v.line in out  # with its table
    assert f"use trial {winner.number}'s config (the confirmed winner): " in out.split(v.line)[1]  # then the answer
    assert "| trial | training.micro_batch_size | search_tokens_per_sec | n | mean | std |" in out


def test_configs_within_noise_are_reported_as_a_tie(tmp_path, capsys):
    """Two configs that differ only in a key the fake trial ignores: the same throughput, 5% noise apart."""
    space = space_file(
        tmp_path,
        fixed={**NOISE, MBS: 16, "seed": 1},  # fixed draws (seed 0's are a 2.8σ fluke)
        params={"fake.label": {"type": "choice", "values": ["a", "b"]}},
    )
    assert run_agent(tmp_path, space, "--proposer", "grid", "--trials", "2", "--repeats", "4", confirm=2) == 0
    study = load(tmp_path)
    runs = confirmations(study)
    assert len(runs) == 8
    values = {label: [t.value for t in runs if t.params["fake.label"] == label] for label in ("a", "b")}
    assert len(set(values["a"] + values["b"])) == 8  # the noise is real: no two runs alike
    lead, se = welch(values["a"], values["b"])
    assert abs(lead) <= 2 * se  # by the numbers: within noise
    v = confirm.verdict(study, 2, 4)
    assert v.winner is None and v.raw_winner_survived is None
    out = capsys.readouterr().out
    assert v.line.startswith("tied within noise: trials ") and "no winner is named; use trial " in v.line
    assert v.line in out and f"use trial {v.pick.trial}'s config (tied within noise with the best)" in out


def test_a_loss_objective_repeats_with_other_seeds(tmp_path):
    space = space_file(
        tmp_path,
        fixed={**NOISE, "seed": 7},
        metric="val_loss",
        direction="minimize",
        params={"optim.lr": {"type": "choice", "values": [0.001, 0.003, 0.01]}},
    )
    assert run_agent(tmp_path, space, "--proposer", "grid", "--trials", "3", "--repeats", "2", confirm=2) == 0
    runs = confirmations(load(tmp_path))
    seeds = [json.loads((Path(t.user_attrs["trial_dir"]) / "trial_summary.json").read_text())["seed"] for t in runs]
    assert seeds == [8, 8, 9, 9]  # fixed seed 7, then 7 + 1 + repeat for every config alike
    search = [t for t in load(tmp_path).trials if not storage.is_confirmation(t)]
    assert all(t.user_attrs["trial_dir"] and t.params["optim.lr"] in (0.001, 0.003, 0.01) for t in search)


def test_confirmation_resumes_and_a_reaped_run_is_run_again_by_the_confirmation(tmp_path):
    space = space_file(tmp_path, fixed=NOISE, params={MBS: {"type": "choice", "values": [8, 16, 32]}})
    args = ("--proposer", "grid", "--trials", "3")
    assert run_agent(tmp_path, space, *args, "--repeats", "1", confirm=2) == 0
    assert len(confirmations(load(tmp_path))) == 2
    assert run_agent(tmp_path, space, *args, "--repeats", "1", confirm=2) == 0  # nothing left to run
    assert len(confirmations(load(tmp_path))) == 2
    # A confirmation run whose agent died: RUNNING, owned by a process that no longer exists.
    study = load(tmp_path)
    origin = confirm.front_runners(study, 1)[0]
    confirm.enqueue(study, origin, 1)
    orphan = study.ask(load_space(str(space)).distributions())
    orphan.set_user_attr("agent", {"host": reaper.identity()["host"], "pid": 2**22 + 1, "start": "0"})
    assert run_agent(tmp_path, space, *args, "--repeats", "2", confirm=2) == 0
    study = load(tmp_path)
    reaped = study.trials[orphan.number]
    assert reaped.state == TrialState.FAIL and reaped.user_attrs["status"] == "reaped"
    ran = confirm.runs_of(study)
    assert sorted(len(v) for v in ran.values()) == [2, 2]  # the reaped run was replaced, nothing more
    assert storage.finished_count(study) == 3  # and no search trial was added for it
    assert not study.get_trials(states=(TrialState.WAITING, TrialState.RUNNING))


def test_no_confirmation_without_a_feasible_trial(tmp_path, capsys):
    space = space_file(tmp_path, params={"optim.lr": {"type": "choice", "values": [0.1, 0.2]}})  # all NaN
    assert run_agent(tmp_path, space, "--proposer", "grid", "--trials", "2", confirm=3) == 0
    assert confirmations(load(tmp_path)) == []
    assert capsys.readouterr().out.splitlines()[-1] == "no trial reached the objective: nothing to recommend"


def test_the_lead_must_clear_2_sigma_at_its_confidence_with_few_runs():
    """With σ estimated from 3 runs each, a 2.5σ lead is within noise (Student's t, 4 degrees of freedom: 2σ's
    95.45% needs 2.87σ); with 30 runs each the same 2.5σ lead names the winner."""

    def verdict_for(n: int, lead_sigmas: float) -> confirm.Verdict:
        spread = [-1.0, 0.0, 1.0] * (n // 3)  # the same spread around each mean
        sd = statistics.stdev(spread)
        se = math.sqrt(2 * sd**2 / n)
        a = confirm.Confirmed(0, {"x": 1}, 10.0, [100.0 + lead_sigmas * se + s for s in spread])
        b = confirm.Confirmed(1, {"x": 2}, 11.0, [100.0 + s for s in spread])
        v = confirm.Verdict([a, b], maximize=True, repeats=n)
        v.line = confirm._judge(v)
        return v

    few, many = verdict_for(3, 2.5), verdict_for(30, 2.5)
    assert few.winner is None and few.needed_sigmas == approx(2.869, abs=1e-3) and few.line.startswith("tied")
    assert many.winner is not None and many.winner.trial == 0 and many.needed_sigmas == approx(2.044, abs=1e-3)  # 58 df
    assert few.lead / few.lead_sigma == approx(2.5) == many.lead / many.lead_sigma
    same = verdict_for(3, 0.0)
    assert same.winner is None and same.tied == [0, 1] and "tied within noise: trials 0, 1" in same.line


def test_a_lucky_search_run_loses_to_the_confirmed_winner_and_export_follows_the_verdict(tmp_path):
    """Two configs the fake trial runs alike, 5% noise: with these fixed draws the search's best run (label b)
    was its lucky one, and 4 repeats each put label a ahead by more than the noise (2.77σ, 2.62σ needed)."""
    from autoresearch import export

    space = space_file(
        tmp_path, fixed={**NOISE, MBS: 16, "seed": 0}, params={"fake.label": {"type": "choice", "values": ["a", "b"]}}
    )
    assert run_agent(tmp_path, space, "--proposer", "grid", "--trials", "2", "--repeats", "4", confirm=2) == 0
    study = load(tmp_path)
    v = confirm.recorded_verdict(study)
    search_best = storage.best_trial(study)
    assert search_best.params["fake.label"] == "b" and v.winner.params["fake.label"] == "a"
    assert v.raw_winner_survived is False
    chosen = export.winner(study)
    assert chosen.number == v.winner.trial != search_best.number and chosen.params["fake.label"] == "a"
    # the exported file's header says so (the fake trial's keys are no core config: the header line alone here)
    assert export.standing(study, chosen) == f"the confirmed winner: {v.line}"
    assert export.standing(study, search_best).startswith("not the confirmed winner: winner: trial ")


def test_the_report_shows_the_confirmation_and_its_verdict(tmp_path, capsys):
    from autoresearch.report.__main__ import main as report_main

    space = space_file(tmp_path, fixed={"fake.noise": 0.01}, params={MBS: {"type": "choice", "values": [8, 16]}})
    assert run_agent(tmp_path, space, "--proposer", "grid", "--trials", "2", "--repeats", "2", confirm=2) == 0
    study = load(tmp_path)
    v = confirm.recorded_verdict(study)
    capsys.readouterr()
    assert report_main([str(tmp_path / "trials" / "fake"), "--html"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == v.line  # the same verdict the agent printed last
    for c in v.configs:
        assert f"| {c.trial} | {c.params[MBS]} | {c.search_value:.6g} | 2 | {c.mean:.6g} | {c.std:.6g} |" in out
    html = (tmp_path / "trials" / "fake" / "report.html").read_text()
    assert "<h2>Confirmation</h2>" in html and html_escape(v.line) in html
