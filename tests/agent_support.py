"""What the agent's tests share: the fake trial as the agent's command, a space of its keys, and a run of the
agent over it (``tests/fake_trial.py`` says what the fake trial does)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import optuna
import yaml

from autoresearch import cli
from autoresearch.search.proposers import Proposal, Proposer

FAKE = shlex.join([sys.executable, str(Path(__file__).resolve().parent / "fake_trial.py")])
ESTIMATOR = "tests.fake_trial:estimate_memory_bytes"
MBS, REC = "training.micro_batch_size", "memory.recompute"


def space_file(
    tmp_path,
    name="fake",
    fixed=None,
    params=None,
    constraints=(),
    direction="maximize",
    metric="tokens_per_sec",
    baseline=None,
):
    doc = {
        "name": name,
        "description": "fake trials",
        "trial_command": "other",  # fake.* keys: not core.train's
        "objective": {"metric": metric, "direction": direction},
        "world_size": 1,
        "fixed": {"training.seq_len": 256, "fake.sleep": 0.0, **(fixed or {})},
        "params": params
        or {
            MBS: {"type": "choice", "values": [8, 16, 32, 64], "memory": "up", "nan": "none"},
            REC: {"type": "choice", "values": ["full", "none"], "memory": "up", "nan": "none"},
            "optim.lr": {"type": "choice", "values": [0.001, 0.1], "memory": "none", "nan": "up"},
        },
        "constraints": list(constraints),
        "budget": {"trials": 100},
        **({"baseline": baseline} if baseline else {}),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_agent(tmp_path, space, *args, estimator="none", confirm=0):
    """The agent over the fake trial. ``confirm``: front-runners re-run after the search (0 here, so that tests
    of the search count only its trials; test_confirm.py tests the confirmation)."""
    argv = [
        "--space",
        str(space),
        "--trials-dir",
        str(tmp_path / "trials"),
        "--command",
        FAKE,
        "--estimator",
        estimator,
        "--seed",
        "0",
        "--confirm",
        str(confirm),
        *args,
    ]
    return cli.main(argv)


def load(tmp_path, name="fake"):
    url = f"sqlite:///{tmp_path / 'trials' / name / 'study.db'}"
    return optuna.load_study(study_name=name, storage=url)


class ScriptedProposer(Proposer):
    """Proposes from a list (None entries defer to TPE) and pretends each call cost $0.01."""

    name = "scripted"

    def __init__(self, script):
        self.script = list(script)
        self.last_usage = None
        self.contexts = []

    def propose(self, study, ctx):
        self.contexts.append(ctx)
        self.last_usage = {"input_tokens": 100, "output_tokens": 10, "cost_usd": 0.01, "calls": 1}
        params = self.script.pop(0) if self.script else None
        return None if params is None else Proposal(params, "scripted", rationale="because", usage=self.last_usage)
