"""The search benchmark's replay machinery on a tiny synthetic table (issue 12), and the default search on it.

The table is built here: every config of a 3-param space with a known optimum, a NaN region (the learning rate at or
above 1.0) and an OOM region (a large batch on long sequences), both proved by the space's annotations. The replay
is ``benchmarks/agent_efficiency.py``'s: the agent's own loop with the table as its trial command.
"""

from __future__ import annotations

import importlib
import json
import math
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import pytest

from autoresearch.records import config_key
from autoresearch.search.feasibility import FeasibilityMemory
from autoresearch.space import load_space

pytestmark = pytest.mark.slow  # ~40 s: a few hundred replayed trials, each its own process
ROOT = Path(__file__).resolve().parents[4]
LRS = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0]
SEQS = [64, 128, 256]
BATCHES = [8, 16, 32]

SPACE = """\
name: synthetic
trial_command: other
objective: {metric: val_loss, direction: minimize}
fixed: {memory.limit_gb: 1.0}
params:
  optim.lr: {type: choice, values: [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0], nan: up, memory: none}
  training.seq_len: {type: choice, values: [64, 128, 256], memory: up, nan: none}
  training.global_batch_size: {type: choice, values: [8, 16, 32], memory: up, nan: none}
"""


def outcome(lr: float, seq: int, batch: int) -> tuple[str, int, float | None]:
    """(status, exit code, val_loss): best at lr 0.03, seq 128, batch 16 (a smooth bowl in the positions)."""
    if lr >= 1.0:
        return "nan", 12, None
    if seq * batch >= 256 * 16:  # the OOM region: monotone in both, as the annotations say
        return "oom", 10, None
    loss = (
        2.0
        + 0.3 * (math.log10(lr) - math.log10(0.03)) ** 2
        + 0.1 * (SEQS.index(seq) - 1) ** 2
        + 0.1 * (BATCHES.index(batch) - 1) ** 2
    )
    return "ok", 0, loss


@pytest.fixture(scope="module")
def ae():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        module = importlib.import_module("agent_efficiency")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    # The synthetic space has no core to estimate memory with: dominance alone learns the OOM region.
    methods = {name: (proposer, learn, None) for name, (proposer, learn, _) in module.METHODS.items()}
    return module, methods


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    root = tmp_path_factory.mktemp("table")
    (root / "synthetic.yaml").write_text(SPACE)
    rows = []
    for i, (lr, seq, batch) in enumerate((a, b, c) for a in LRS for b in SEQS for c in BATCHES):
        status, code, loss = outcome(lr, seq, batch)
        params = {"optim.lr": lr, "training.seq_len": seq, "training.global_batch_size": batch}
        rows.append(
            {
                "index": i,
                "params": params,
                "param_overrides": {k: str(v) for k, v in params.items()},
                "status": status,
                "exit_code": code,
                "objective": loss,
                "summary": {
                    "status": status,
                    "exit_code": code,
                    "reason": status,
                    "metrics": {} if loss is None else {"val_loss": loss},
                },
            }
        )
    data = {
        "space": str(root / "synthetic.yaml"),
        "objective": {"metric": "val_loss", "direction": "minimize"},
        "rows": rows,
    }
    path = root / "table.json"
    path.write_text(json.dumps(data))
    return path, data


SEEDS = range(3)
# Paid runs per replay; a replay that misses the best counts budget + 1. Random's is capped to keep the test short:
# beyond 30 runs (of 63 configs) a miss is a miss.
BUDGET = {"gp": len(LRS) * len(SEQS) * len(BATCHES), "random": 30}


@pytest.fixture(scope="module")
def replays(ae, table, tmp_path_factory) -> dict:
    """method -> [(replay result, the trials of its study in order)] over SEEDS; run once for the module."""
    import optuna

    from autoresearch.study import storage as st

    module, methods = ae
    path, data = table  # the table's space path is absolute: table_space() keeps it
    best_key = config_key(module.best_row(data)["params"])
    out: dict = {}
    # Studies in RAM where there is a tmpfs: a replay writes ~30 SQLite commits per proposal.
    shm = Path(tempfile.mkdtemp(prefix="search-replay-", dir="/dev/shm")) if Path("/dev/shm").is_dir() else None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "METHODS", methods)
        for method in ("gp", "random"):
            for seed in SEEDS:
                work = shm / f"{method}-{seed}" if shm else tmp_path_factory.mktemp(f"{method}-{seed}")
                result = module.replay_once(path, method, seed, BUDGET[method], work, best_key, max_proposals=400)
                name = f"{method}-s{seed}"
                study = optuna.load_study(study_name=name, storage=st.default_storage(work, name))
                out.setdefault(method, []).append(
                    (result, sorted(study.get_trials(deepcopy=False), key=lambda t: t.number))
                )
    if shm:
        shutil.rmtree(shm, ignore_errors=True)
    return out


def test_the_default_never_proposes_a_region_the_annotations_rule_out_after_its_first_failure(table, replays):
    memory = FeasibilityMemory(load_space(table[1]["space"]))
    failures_seen = 0
    for result, trials in replays["gp"]:
        assert result["reached"], result
        assert {t.user_attrs.get("status") for t in trials} <= {"ok", "oom", "nan"}  # each ran: none was skipped
        for i, t in enumerate(trials):
            for earlier in trials[:i]:
                kind = earlier.user_attrs.get("status")
                if kind in ("oom", "nan"):
                    failures_seen += 1
                    assert not memory.dominates(earlier.params, t.params, kind), (earlier.params, t.params)
    assert failures_seen, "no replay touched a failure region: the test would check nothing"


def test_the_default_finds_the_best_in_fewer_runs_than_random_and_wastes_fewer(table, replays):
    runs = {m: [r["runs"] if r["reached"] else BUDGET[m] + 1 for r, _ in replays[m]] for m in replays}
    failed = {m: sum(r["failed"] for r, _ in replays[m]) for m in replays}
    assert statistics.median(runs["gp"]) < 0.5 * statistics.median(runs["random"]), runs
    assert failed["gp"] < failed["random"], failed
