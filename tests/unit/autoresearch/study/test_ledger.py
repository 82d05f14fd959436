"""The cost ledger: a trial's device-seconds and their split, the study's totals, --max-device-hours, and the
study's storage as Optuna's own API (what optuna-dashboard uses) reads it."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from autoresearch import cli as agent
from autoresearch.records import TrialRow
from autoresearch.report.explain import breakdown_text, params_label, short_names
from autoresearch.study import ledger, storage
from tests.agent_support import MBS, load, run_agent, space_file
from tests.fake_trial import PHASE_SHARES

SLEEP = 0.25  # seconds each fake trial "trains": its nominal start-up phases are shares of it


def summary(phases=None, median_ms=None, world_size=2, wall=None):
    return {
        "startup_phases_sec": phases,
        "metrics": {"step_time_ms_median": median_ms},
        "layout": {"world_size": world_size},
        "wall_time_sec": wall,
    }


# --- one trial ---


def test_a_trial_with_phases_and_a_steady_step_splits_into_parts_that_sum_to_the_total():
    phases = {"launch": 0.5, "imports": 1.0, "cluster": 0.2, "build": 0.3, "first_step": 3.0}
    led = ledger.trial_ledger(summary(phases, median_ms=500.0), wall_sec=10.0)
    assert led == {
        "ranks": 2,
        "wall_sec": 10.0,
        "device_sec": 20.0,
        "startup_sec": 4.0,
        "compile_sec": 5.0,
        "steps_sec": 11.0,
        "llm_calls": 0,
        "llm_tokens": 0,
        "llm_usd": 0.0,
    }
    # A first step quicker than the median (PyNative): no compile time, never a negative one.
    led = ledger.trial_ledger(summary({**phases, "first_step": 0.4}, median_ms=500.0, world_size=1), 10.0)
    assert (led["startup_sec"], led["compile_sec"], led["steps_sec"]) == (2.0, 0.0, 8.0)


def test_unknown_parts_are_none_and_the_total_is_still_ranks_times_the_runners_wall():
    no_phases = ledger.trial_ledger(summary(None, median_ms=5.0, world_size=4), wall_sec=3.0)
    assert no_phases["device_sec"] == 12.0 and [no_phases[p] for p in ledger.PARTS] == [None] * 3
    # Died in its first step (e.g. an OOM while compiling): start-up known, no steady step to subtract.
    first_step_only = {"launch": 0.1, "imports": 0.2, "cluster": 0.0, "build": 0.2, "first_step": 1.0}
    led = ledger.trial_ledger(summary(first_step_only, median_ms=None, world_size=1), wall_sec=2.0)
    assert (led["device_sec"], led["startup_sec"], led["compile_sec"], led["steps_sec"]) == (2.0, 0.5, None, None)
    crash = ledger.trial_ledger(None, wall_sec=1.5, default_ranks=8)  # no summary: the space's ranks
    assert (crash["ranks"], crash["device_sec"], crash["startup_sec"]) == (8, 12.0, None)
    assert ledger.trial_ledger(None, wall_sec=1.5)["device_sec"] is None  # ranks unknown: not guessed
    # An abandoned trial (no runner wall time) falls back to the trial's own clock.
    assert ledger.trial_ledger(summary(world_size=2, wall=4.0), wall_sec=None)["device_sec"] == 8.0


def test_llm_usage_and_skipped_proposals():
    usage = {"calls": 3, "input_tokens": 1000, "output_tokens": 50, "cost_usd": 0.02}
    assert ledger.llm_part(usage) == {"llm_calls": 3, "llm_tokens": 1050, "llm_usd": 0.02}
    assert ledger.llm_part({"calls": 1, "input_tokens": 10, "output_tokens": 0, "cost_usd": None})["llm_usd"] is None
    assert ledger.llm_part({"calls": 1})["llm_tokens"] is None
    assert ledger.skipped_ledger(usage) == {
        "ranks": 0,
        "wall_sec": 0.0,
        "device_sec": 0.0,
        "startup_sec": 0.0,
        "compile_sec": 0.0,
        "steps_sec": 0.0,
        "llm_calls": 3,
        "llm_tokens": 1050,
        "llm_usd": 0.02,
    }


def row(status: str, led: dict | None = None, **fields) -> TrialRow:
    return TrialRow(number=0, state="COMPLETE", status=status, ledger=led, **fields)


def test_study_totals_from_rows():
    split = {
        "ranks": 1,
        "wall_sec": 10.0,
        "device_sec": 10.0,
        "startup_sec": 2.0,
        "compile_sec": 3.0,
        "steps_sec": 5.0,
        **ledger.llm_part(None),
    }
    unsplit = {**split, "ranks": 2, "device_sec": 6.0, "startup_sec": 1.0, "compile_sec": None, "steps_sec": None}
    unknown = {**split, "device_sec": None, "startup_sec": None, "compile_sec": None, "steps_sec": None}
    skipped = ledger.skipped_ledger({"calls": 1, "input_tokens": 90, "output_tokens": 10, "cost_usd": 0.5})
    unpriced = {**split, **ledger.llm_part({"calls": 2, "input_tokens": 5, "output_tokens": 5, "cost_usd": None})}
    rows = [
        row(status, led)
        for status, led in (
            ("ok", split),
            ("oom", unsplit),
            ("interrupted", unknown),
            ("pruned", skipped),
            ("ok", unpriced),
            ("running", None),
        )
    ]
    t = ledger.study_totals(rows)
    assert t == {
        "trials": 5,
        "ran": 4,
        "skipped": 1,
        "unknown_trials": 1,
        "device_sec": 26.0,
        "startup_sec": 5.0,
        "compile_sec": 6.0,
        "steps_sec": 10.0,
        "unsplit_sec": 5.0,
        "wasted_runs": {"oom": 1, "nan": 0, "timeout": 0},
        "wasted_sec": 6.0,
        "llm_calls": 3,
        "llm_tokens": 110,
        "llm_usd": 0.5,
        "llm_unpriced_trials": 1,
        "calibration_sec": 0.0,  # no machine measured for this study's step-time model
    }
    assert t["startup_sec"] + t["compile_sec"] + t["steps_sec"] + t["unsplit_sec"] == t["device_sec"]
    # the micro-benchmarks a study ran to measure the machine count as its device time, on a line of their own
    measured = ledger.study_totals(rows, calibration_sec=12.0)
    assert measured["device_sec"] == t["device_sec"] + 12.0 and measured["calibration_sec"] == 12.0
    assert "measuring the machine 12.0 device-s (" in ledger.format_totals(measured)
    text = ledger.format_totals(t)
    assert "device time 0.007222 h = 26.0 device-s" in text and "1 trial(s) ran for an unknown time" in text
    assert "start-up 5.0 device-s (19%), compile 6.0 device-s (23%), steps 10.0 device-s (38%)" in text
    assert "LLM: 3 calls, 110 tokens, $0.5000 (+ 1 trial(s) at an unknown price)" in text
    assert "paid failures: 1 runs (1 oom, 0 nan, 0 timeout), 6.0 device-s (23%)" in text  # the oom's 2 ranks x 3 s


def test_progress_labels_use_short_names():
    params = {"parallel.tp": 2, "training.micro_batch_size": 4, "memory.recompute": "none", "optim.lr": 0.001}
    assert params_label(params) == "tp=2 micro_batch_size=4 recompute=none lr=0.001"
    assert short_names(["a.lr", "b.lr", "c.x"]) == {"a.lr": "a.lr", "b.lr": "b.lr", "c.x": "x"}


def test_memory_breakdown_for_a_core_config_and_a_reason_otherwise(tmp_path):
    from core.config import load_config
    from core.memory import estimate_memory_bytes

    core = ["model=tiny", "training.micro_batch_size=2", "training.seq_len=64"]
    text, note = breakdown_text(row("ok"), space=CoreSpace(core))
    expected = estimate_memory_bytes(load_config(core)) / 2**20
    assert note == "" and text.splitlines()[0].startswith("per-rank peak estimate, CPU")
    total = [line for line in text.splitlines() if line.startswith("total")][0]
    assert float(total.split()[-1]) == pytest.approx(expected, abs=0.05)
    trial_dir = tmp_path / "0000"  # a trial that ran: its summary's overrides win over the space's
    trial_dir.mkdir()
    (trial_dir / "trial_summary.json").write_text(json.dumps({"overrides": ["fake.sleep=0", *core]}))
    text, note = breakdown_text(row("ok", trial_dir=str(trial_dir)), space=CoreSpace(core))
    assert text is None and note.startswith("not a config the core knows (fake.sleep")
    assert breakdown_text(row("ok")) == (None, "no config to estimate (neither a trial summary nor the space file)")


class CoreSpace:
    """The one method of SearchSpace that breakdown_text uses."""

    def __init__(self, overrides):
        self._overrides = overrides

    def overrides(self, params):
        return list(self._overrides)


# --- a study run by the agent on the fake trial ---


@pytest.fixture(scope="module")
def study_run(tmp_path_factory):
    """A grid over micro-batch x tp x crash: ok trials on 1 and 2 ranks, OOMs, crashes without a summary, and
    proposals the feasibility memory skips."""
    tmp = tmp_path_factory.mktemp("ledger")
    space = space_file(
        tmp,
        name="ledger",
        fixed={"fake.sleep": SLEEP},
        params={
            MBS: {"type": "choice", "values": [8, 64], "memory": "up", "nan": "none"},
            "parallel.tp": {"type": "choice", "values": [1, 2], "memory": "down", "nan": "none"},
            "fake.crash": {"type": "choice", "values": ["false", "true"], "memory": "none", "nan": "none"},
        },
    )
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run_agent(tmp, space, "--proposer", "grid", "--no-progress") == 0
    return tmp, load(tmp, "ledger"), out.getvalue()


def _summary(t):
    path = Path(t.user_attrs.get("trial_dir") or "/nonexistent") / "trial_summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_the_studys_device_seconds_are_the_sum_of_ranks_times_measured_wall_times(study_run):
    tmp, study, _ = study_run
    expected = 0.0
    for t in study.trials:  # computed here from the storage and the trial dirs, not through autoresearch.study.ledger
        if t.state == TrialState.PRUNED:
            continue
        s = _summary(t)
        ranks = s["layout"]["world_size"] if s else 1  # no summary (a crash): the space's world_size, 1
        expected += ranks * t.user_attrs["wall_time_sec"]
    assert {t.user_attrs["status"] for t in study.trials} >= {"ok", "oom", "error", "pruned"}
    assert expected > SLEEP * 3
    totals = ledger.study_totals(storage.trial_rows(study))
    assert totals["device_sec"] == pytest.approx(expected, abs=0.002 * len(study.trials))
    csv = pd.read_csv(tmp / "trials" / "ledger" / "trials.csv", keep_default_na=False, na_values=[""])
    assert csv["device_sec"].sum() == pytest.approx(expected, abs=0.002 * len(study.trials))
    assert totals["ran"] + totals["skipped"] == len(study.trials) == len(csv)


def test_each_trials_parts_match_its_summary_and_sum_to_its_total(study_run):
    _, study, _ = study_run
    seen = set()
    for t in study.trials:
        led, s, status = t.user_attrs["ledger"], _summary(t), t.user_attrs["status"]
        if t.state == TrialState.PRUNED:
            assert led == ledger.skipped_ledger(None)
            continue
        ranks, wall = led["ranks"], t.user_attrs["wall_time_sec"]
        assert led["device_sec"] == pytest.approx(ranks * wall, abs=0.002)
        if s is None:  # crashed: nothing to split
            assert status == "error" and ranks == 1 and [led[p] for p in ledger.PARTS] == [None] * 3
            seen.add("crash")
            continue
        assert ranks == t.params["parallel.tp"]
        startup = sum(SLEEP * PHASE_SHARES[p] for p in ledger.STARTUP_PHASES)
        assert led["startup_sec"] == pytest.approx(ranks * startup, abs=1e-3)
        median = s["metrics"]["step_time_ms_median"]
        if median is None:  # an OOM: no steady step, so no compile time and no steps
            assert status == "oom" and led["compile_sec"] is None and led["steps_sec"] is None
            seen.add("oom")
            continue
        compile_ = max(0.0, SLEEP * PHASE_SHARES["first_step"] - median / 1000)
        assert led["compile_sec"] == pytest.approx(ranks * compile_, abs=1e-3)
        assert led["startup_sec"] + led["compile_sec"] + led["steps_sec"] == pytest.approx(led["device_sec"], abs=3e-3)
        assert led["steps_sec"] > 0
        seen.add(f"ok on {ranks}")
    assert seen == {"crash", "oom", "ok on 1", "ok on 2"}


def test_an_old_trials_ledger_is_computed_from_its_trial_dir(study_run):
    _, study, _ = study_run
    for t in study.trials:
        attrs = {k: v for k, v in t.user_attrs.items() if k != "ledger"}  # as told before ledgers existed
        again = ledger.of_trial(attrs, finished=True, default_ranks=1)
        assert again.keys() == t.user_attrs["ledger"].keys()
        for key, value in t.user_attrs["ledger"].items():
            assert again[key] == (value if value is None else pytest.approx(value, abs=0.002)), (t.number, key)


def test_progress_lines_name_the_config_and_the_ledger_is_printed(study_run):
    _, study, out = study_run
    lines = {int(line.split()[1]): line for line in out.splitlines() if line.startswith("trial ")}
    for t in study.trials:
        label = f"micro_batch_size={t.params[MBS]} tp={t.params['parallel.tp']} crash={t.params['fake.crash']}: "
        assert lines[t.number].startswith(f"trial {t.number:4d} {t.user_attrs['status']:13s} {label}")
    totals = ledger.study_totals(storage.trial_rows(study))
    assert ledger.format_totals(totals) in out


def test_the_storage_reads_with_optunas_own_api(study_run):
    """What optuna-dashboard does: list the studies, load one, read each trial's user attributes."""
    tmp, _, _ = study_run
    url = f"sqlite:///{tmp / 'trials' / 'ledger' / 'study.db'}"
    assert optuna.get_all_study_names(storage=url) == ["ledger"]
    summaries = optuna.get_all_study_summaries(storage=url)
    study = optuna.load_study(study_name="ledger", storage=url)
    assert summaries[0].n_trials == len(study.trials) > 0
    assert study.user_attrs["space"] == "ledger" and study.user_attrs["world_size"] == 1
    for t in study.trials:
        assert {"status", "reason", "ledger", "proposer"} <= set(t.user_attrs)
        assert set(t.user_attrs["ledger"]) == set(ledger.KEYS)
        if t.state != TrialState.PRUNED:
            assert {"exit_code", "wall_time_sec", "trial_dir", "metrics"} <= set(t.user_attrs)
    df = study.trials_dataframe()
    assert {"user_attrs_status", "user_attrs_ledger", "user_attrs_reason"} <= set(df.columns)
    assert df["user_attrs_status"].tolist() == [t.user_attrs["status"] for t in study.trials]


def test_max_device_hours_stops_the_study(tmp_path, capsys):
    space = space_file(tmp_path, fixed={"fake.sleep": 0.3})
    # 0.1 device-seconds: the first trial (asleep for 0.3 s on 1 rank) passes it, so no second trial starts.
    assert run_agent(tmp_path, space, "--max-device-hours", str(0.1 / 3600), "--no-progress") == 0
    out = capsys.readouterr().out
    assert "reached --max-device-hours" in out
    trials = load(tmp_path).trials
    assert len(trials) == 1 and trials[0].user_attrs["ledger"]["device_sec"] >= 0.3
    with pytest.raises(SystemExit):
        agent.parse_args(["--space", "x.yaml", "--max-device-hours", "-1"])
    assert agent.parse_args(["--space", "x.yaml", "--max-device-hours", "2.5"]).max_device_hours == 2.5


def test_llm_spend_of_every_proposal_is_in_the_ledger_skipped_ones_included(tmp_path):
    """Each proposal's tokens and dollars land in its trial's ledger, run or skipped (a repeat here)."""
    import shlex

    from autoresearch.run.options import AgentOptions
    from autoresearch.run.session import Session
    from tests.agent_support import FAKE, REC, ScriptedProposer

    config = {MBS: 16, REC: "none", "optim.lr": 0.001}
    opts = AgentOptions(
        space=str(space_file(tmp_path)),
        proposer="tpe",
        trials=2,
        trials_dir=str(tmp_path / "t"),
        command=shlex.split(FAKE),
        estimator=None,
        seed=0,
        progress=False,
        confirm=0,
    )
    loop = Session(opts, "tpe")
    loop.chooser.proposer = ScriptedProposer([config, config, {**config, MBS: 8}])  # the second is a duplicate
    assert loop.run().code == 0
    study = optuna.load_study(study_name="fake", storage=f"sqlite:///{tmp_path / 't' / 'fake' / 'study.db'}")
    assert [t.user_attrs["status"] for t in study.trials] == ["ok", "duplicate", "ok"]
    for t in study.trials:  # ScriptedProposer: 100 + 10 tokens and $0.01 a call
        assert {k: t.user_attrs["ledger"][k] for k in ("llm_calls", "llm_tokens", "llm_usd")} == {
            "llm_calls": 1,
            "llm_tokens": 110,
            "llm_usd": 0.01,
        }
    totals = ledger.study_totals(storage.trial_rows(study))
    assert totals["llm_usd"] == pytest.approx(storage.llm_cost(study)) == pytest.approx(0.03)
    assert (totals["llm_tokens"], totals["skipped"], study.trials[1].user_attrs["ledger"]["device_sec"]) == (
        330,
        1,
        0.0,
    )
