"""The memory estimate out of sample: real trials on configs that no run of the fitted sweep
(benchmarks/memory_model.py, benchmarks/data/memory_cpu.json) used — other sequence lengths, depth, batch and
optimizer, with recompute and SWAP — land within 15% of their measured peak, and every summary carries the
estimate core.memory gives for its config (the figure the agent's memory gate starts from). The precise held-out
errors (median, p95, worst, under-prediction rate) are in benchmarks/RESULTS.md, "Memory estimate"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core import memory
from core.config import load_config
from tests.integration.conftest import run_trial

pytestmark = pytest.mark.slow

DATA = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "memory_cpu.json").read_text())
UNSEEN = {
    "jit muon seq192": ("model=tiny", "optim=muon", "training.seq_len=192", "training.global_batch_size=12"),
    "jit recompute 5 layers seq160": (
        "model=tiny",
        "model.n_layers=5",
        "training.seq_len=160",
        "memory.recompute=full",
        "training.global_batch_size=8",
    ),
    "pynative swap seq192": (
        "model=tiny",
        "training.mode=pynative",
        "training.seq_len=192",
        "memory.swap=true",
        "training.global_batch_size=8",
    ),
}


@pytest.mark.parametrize("name", UNSEEN)
def test_estimate_holds_within_15_percent_on_configs_it_never_saw(name, tmp_path):
    overrides = (*UNSEEN[name], "trial.max_steps=10")  # as long as a study's trials: a peak grows over 10 steps
    assert not any(set(UNSEEN[name]) <= set(row["overrides"]) for row in DATA["rows"])
    run = run_trial(tmp_path / "t", *overrides)
    assert run.code == 0, run.output
    m = run.summary["metrics"]
    estimate = memory.estimate_memory_bytes(load_config(list(overrides)))
    assert m["estimated_memory_bytes"] == estimate
    assert abs(estimate - m["peak_memory_bytes"]) <= 0.15 * m["peak_memory_bytes"], (estimate, m["peak_memory_bytes"])
