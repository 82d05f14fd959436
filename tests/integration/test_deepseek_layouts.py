"""DeepSeek-V3's architecture (``model=deepseek-tiny``: MLA, a dense block then an MoE block with the biased,
group-limited sigmoid router, the bias moved toward balance after every step, a shared expert, the sequence-wise
balance loss; one multi-token-prediction module) on the layouts that place it differently, and under full
recompute, reproduces the 1-process run: per-step losses, validation loss and consolidated final parameters, the
routers' biases and the MTP module's among them, and the blocks' gradient and parameter norms (the MTP module's
against the checkpoint in float64).

    tp=2          MLA's heads split through its up-projections, its down-projections and latent norms replicated,
                  the shared RoPE key entering the heads' region (its gradient all-reduced over tp); the MoE
                  block's experts split by width
    tp=2 sp       the same with the down-projections and latent norms on each rank's slice of the sequence (their
                  gradients summed over tp), the shared RoPE key gathered
    dp_shard=2 ep=2   FSDP gathers MLA's weights; the experts split over the two data ranks, whose loads the bias
                  update sums
    cp=2          keys and values of the whole sequence gathered (MLA's q/k and v widths differ)
    pp=2          a stage each (the dense block and the MoE block), the bias update's table holding zeros for
                  the block a rank does not hold; the last stage runs the MTP module, embedding with its copy of
                  the table, whose gradient it sums with the first stage's
    memory.recompute=full   under jit the step compiled segment by segment (core.memory.segmented), the MTP
                  module in the last segment
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.integration.conftest import assert_same_run, final_params, run_trial

pytestmark = pytest.mark.slow

STEPS = 6
BASE = (
    "model=deepseek-tiny",
    "seed=5",
    f"trial.max_steps={STEPS}",
    f"checkpoint.interval={STEPS}",
    "training.global_batch_size=8",
    "training.micro_batch_size=4",
    "training.seq_len=64",
    "model.mtp_layers=1",  # one multi-token-prediction module (an MoE block of its own)
    f"training.health_interval={STEPS}",  # the blocks' norms, the MTP module's among them
)
BLOCKS = ["embed", "layers.0", "layers.1", "norm", "lm_head", "mtp.0"]
BIAS = "model.layers.1.mlp.score_bias"  # its key in a checkpoint


@pytest.fixture(scope="module")
def reference(tmp_path_factory, warm):
    """The 1-process run, once for the module."""
    run = run_trial(tmp_path_factory.mktemp("deepseek") / "single", *BASE, timeout=900, env=warm)
    assert run.code == 0, run.output
    return run


@pytest.mark.parametrize(
    "layout",
    [
        ("parallel.tp=2",),
        ("parallel.tp=2", "parallel.sp=true"),
        ("parallel.dp_shard=2", "parallel.ep=2"),
        ("parallel.cp=2",),
        ("parallel.pp=2",),
        ("memory.recompute=full",),
    ],
)
def test_deepseek_layout_reproduces_the_single_process_run(reference, tmp_path, layout, warm):
    run = run_trial(tmp_path / "run", *BASE, *layout, timeout=900, env=warm)
    assert run.code == 0, run.output + "".join(p.read_text()[-2000:] for p in (run.dir / "logs").glob("rank_*.log"))
    assert_same_run(run, reference, STEPS)
    params = final_params(run, STEPS)  # the MTP module trained, its block's bias moved
    assert {"model.mtp.0.proj.weight", "model.mtp.0.block.mlp.score_bias"} <= set(params)
    norms, want = block_norms(run), block_norms(reference)
    assert list(norms["param_norm_blocks"]) == BLOCKS == list(norms["grad_norm_blocks"])
    for kind in ("param_norm_blocks", "grad_norm_blocks"):
        for block in BLOCKS:
            assert norms[kind][block] == pytest.approx(want[kind][block], rel=1e-5), (kind, block)
    mtp = np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for k, v in params.items() if k.startswith("model.mtp.0.")))
    assert norms["param_norm_blocks"]["mtp.0"] == pytest.approx(mtp, rel=1e-5)
    ref, got = final_params(reference, STEPS)[BIAS], params[BIAS]
    # the bias moved by whole steps of the update rate (0.01) toward balance, the same on every layout
    assert np.abs(ref).max() > 0.005 and np.abs(np.round(ref / 0.01) - ref / 0.01).max() < 1e-3
    np.testing.assert_allclose(got, ref, atol=1e-6)


def block_norms(run) -> dict:
    """The last step's row of run health in ``metrics.jsonl``."""
    rows = [json.loads(line) for line in (run.dir / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if r.get("step") == STEPS and "param_norm_blocks" in r)
