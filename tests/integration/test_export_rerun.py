"""A real study's winner, exported as overrides, runs again through core.train with the same resolved config."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    return subprocess.run(list(argv), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_exported_overrides_rerun_the_winner(tmp_path):
    space = tmp_path / "rerun.yaml"  # one trial of the tiny model, away from the defaults in several sections
    space.write_text(
        yaml.safe_dump(
            {
                "name": "rerun",
                "objective": {"metric": "val_loss", "direction": "minimize"},
                "world_size": 1,
                "fixed": {
                    "model": "tiny",
                    "trial.max_steps": 2,
                    "training.seq_len": 32,
                    "optim.warmup_steps": 1,
                    "optim.schedule": "wsd",
                    "training.eval_batches": 1,
                },
                "params": {"training.micro_batch_size": {"type": "choice", "values": [4]}},
            }
        )
    )
    trials = tmp_path / "trials"
    agent = run(
        sys.executable,
        "-m",
        "autoresearch.agent",
        "--space",
        str(space),
        "--trials",
        "1",
        "--proposer",
        "grid",
        "--trials-dir",
        str(trials),
        "--no-progress",
    )
    assert agent.returncode == 0, agent.stdout + agent.stderr

    winner = tmp_path / "winner.txt"
    exported = run(
        sys.executable, "-m", "autoresearch.export", str(trials / "rerun"), "--to", "overrides", "--out", str(winner)
    )
    assert exported.returncode == 0, exported.stderr
    assert "(its resolved config)" in exported.stderr  # the real summary's config, not a recomposition
    original = json.loads((trials / "rerun" / "0000" / "trial_summary.json").read_text())

    again = tmp_path / "again"  # the documented command line, word splitting and all
    rerun = run(
        "bash",
        "-c",
        f"{shlex.quote(sys.executable)} -m core.train $(cat {shlex.quote(str(winner))}) "
        f"trial.dir={shlex.quote(str(again))}",
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    summary = json.loads((again / "trial_summary.json").read_text())
    assert summary["status"] == "ok"
    first, second = original["config"], summary["config"]
    assert first["trial"].pop("dir") != second["trial"].pop("dir")
    assert second == first
    assert second["training"]["micro_batch_size"] == 4 and second["optim"]["schedule"] == "wsd"

    for to in ("mindformers", "torchtitan"):  # the fragments come from the same resolved config
        fragment = run(sys.executable, "-m", "autoresearch.export", str(trials / "rerun"), "--to", to)
        assert fragment.returncode == 0, fragment.stderr
        assert "(its resolved config)" in fragment.stdout.splitlines()[2]
