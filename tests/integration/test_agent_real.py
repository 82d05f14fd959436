"""A real study: the agent runs the real core on the tiny model, records it in Optuna and reports it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.schema import assert_summary_schema

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_real_hparams_study(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    trials = tmp_path / "trials"
    agent = subprocess.run([sys.executable, "-m", "autoresearch.agent", "--space", "hparams.yaml", "--trials", "3",
                            "--study", "real", "--trials-dir", str(trials), "--seed", "0", "--no-progress"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert agent.returncode == 0, agent.stdout + agent.stderr
    assert agent.stdout.splitlines()[0].startswith("proposer: tpe")

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

    report = subprocess.run([sys.executable, "-m", "autoresearch.report", str(trials / "real"), "--format", "json"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)
    assert len(rows) == len(study.trials)
