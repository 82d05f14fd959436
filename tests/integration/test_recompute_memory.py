"""Full recompute really saves memory in the mode trials run in: under jit (compiled segments, core.recompute) the
measured peak of a config where activations dominate falls by at least 30%, and the losses stay those of none."""

from __future__ import annotations

import pytest

from tests.integration.conftest import losses, run_trial

pytestmark = pytest.mark.slow

# tiny with 6 blocks at seq 256, micro-batch 8: saved activations are most of the step's memory under jit
BASE = ("model=tiny", "model.n_layers=6", "training.seq_len=256", "training.global_batch_size=8",
        "training.micro_batch_size=8", "trial.max_steps=2", "training.mode=jit", "training.eval_batches=1")


def test_full_recompute_cuts_the_jit_peak(tmp_path):
    none = run_trial(tmp_path / "none", *BASE, timeout=600)
    full = run_trial(tmp_path / "full", *BASE, "memory.recompute=full", timeout=600)
    assert none.code == 0 and full.code == 0, none.output + full.output
    peak = {name: run.summary["metrics"]["peak_memory_bytes"] for name, run in (("none", none), ("full", full))}
    assert peak["full"] <= 0.7 * peak["none"], peak
    for step, value in losses(full).items():
        assert value == pytest.approx(losses(none)[step], rel=1e-5)
