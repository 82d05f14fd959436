"""Full recompute really saves memory in the mode trials run in: under jit (compiled segments, core.memory.segmented) the
measured peak of a config where activations dominate falls by at least 30%; activation SWAP (PyNative, to disk on
CPU: core.memory.swap) cuts it too; the losses stay those of none."""

from __future__ import annotations

import pytest

from tests.integration.conftest import losses, run_trial

pytestmark = pytest.mark.slow

# tiny with 6 blocks at seq 256, micro-batch 8: saved activations are most of the step's memory under jit
BASE = (
    "model=tiny",
    "model.n_layers=6",
    "training.seq_len=256",
    "training.global_batch_size=8",
    "training.micro_batch_size=8",
    "trial.max_steps=2",
    "training.eval_batches=1",
)


def _peaks_and_same_losses(tmp_path, a: tuple, b: tuple) -> tuple[int, int]:
    runs = [run_trial(tmp_path / str(i), *BASE, *o, timeout=600) for i, o in enumerate((a, b))]
    assert all(r.code == 0 for r in runs), "".join(r.output for r in runs)
    for step, value in losses(runs[1]).items():
        assert value == pytest.approx(losses(runs[0])[step], rel=1e-5)
    return tuple(r.summary["metrics"]["peak_memory_bytes"] for r in runs)


def test_full_recompute_cuts_the_jit_peak(tmp_path):
    none, full = _peaks_and_same_losses(
        tmp_path, ("training.mode=jit",), ("training.mode=jit", "memory.recompute=full")
    )
    assert full <= 0.7 * none, (none, full)


def test_swap_cuts_the_pynative_peak(tmp_path):
    none, swap = _peaks_and_same_losses(
        tmp_path, ("training.mode=pynative",), ("training.mode=pynative", "memory.swap=true")
    )
    assert swap <= 0.9 * none, (none, swap)
