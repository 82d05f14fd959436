"""A real study: the agent runs the real core on the tiny model, confirms its front-runners, records it in Optuna
and reports it."""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autoresearch.study import confirm
from tests.schema import assert_summary_schema

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_real_hparams_study(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    trials = tmp_path / "trials"
    agent = subprocess.run(
        [
            sys.executable,
            "-m",
            "autoresearch.agent",
            "--space",
            "hparams.yaml",
            "--trials",
            "3",
            "--study",
            "real",
            "--trials-dir",
            str(trials),
            "--seed",
            "0",
            "--no-progress",
            "--confirm",
            "2",
            "--repeats",
            "2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert agent.returncode == 0, agent.stdout + agent.stderr
    assert agent.stdout.splitlines()[0].startswith("proposer: gp")

    url = f"sqlite:///{trials / 'real' / 'study.db'}"
    study = optuna.load_study(study_name="real", storage=url)
    done = [t for t in study.trials if t.state.is_finished()]
    assert len(done) >= 3
    ran = [t for t in done if t.user_attrs.get("trial_dir")]
    assert ran, "no trial ran"
    for t in ran:
        summary = json.loads((Path(t.user_attrs["trial_dir"]) / "trial_summary.json").read_text())
        assert_summary_schema(summary)
        assert t.user_attrs["status"] == summary["status"] and t.user_attrs["exit_code"] == summary["exit_code"]
        if summary["status"] == "ok":  # the objective is the summary's measured val_loss, not a made-up number
            assert t.value == pytest.approx(summary["metrics"]["val_loss"])
    assert (trials / "real" / "trials.csv").exists()

    # The baseline ran first: the core's defaults (hparams.yaml names none).
    first = min(done, key=lambda t: t.number)
    assert first.user_attrs["proposer"] == "baseline" and first.params == study.user_attrs["baseline"]
    assert first.params["optim.lr"] == 0.003 and first.params["optim"] == "adamw"

    # Confirmation: the 2 best configs, and the baseline where it is not one of them, ran up to twice more each,
    # with other seeds (val_loss depends on the seed); the verdict's mean ± std are those runs' own val_loss (the
    # baseline's, its search run's too).
    runs = [t for t in done if "confirmation_of" in t.user_attrs]
    candidates = confirm.candidates(study, 2)
    assert {t.user_attrs["confirmation_of"] for t in runs} == {t.number for t in candidates}
    assert all(t.user_attrs["repeat"] in (0, 1) for t in runs)
    seeds = {
        t.user_attrs["repeat"]: json.loads((Path(t.user_attrs["trial_dir"]) / "trial_summary.json").read_text())["seed"]
        for t in runs
    }
    assert seeds == {0: 1, 1: 2} or seeds == {0: 1}  # no fixed seed: the core's default 0, then 0 + 1 + repeat
    v = confirm.verdict(study, 2, 2)
    for c in v.configs:  # the front-runners and the baseline
        mine = [t for t in runs if t.user_attrs["confirmation_of"] == c.trial and t.user_attrs["status"] == "ok"]
        mine += [first] if c.baseline else []
        losses = [
            json.loads((Path(t.user_attrs["trial_dir"]) / "trial_summary.json").read_text())["metrics"]["val_loss"]
            for t in mine
        ]
        assert sorted(c.values) == pytest.approx(sorted(losses)) and c.mean == pytest.approx(statistics.fmean(losses))
        assert f"| {c.trial} |" in agent.stdout  # the confirmation table names each config
    assert v.line in agent.stdout and v.line.startswith(("winner: trial", "tied within noise: trials"))
    assert f"use trial {v.pick.trial}'s config (" in agent.stdout.split(v.line)[1]  # the answer, last

    report = subprocess.run(
        [sys.executable, "-m", "autoresearch.report", str(trials / "real"), "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)
    assert len(rows) == len(study.trials)
