"""DeepSeek-V3's architecture (``model=deepseek-tiny``: MLA, a dense block then an MoE block with the biased,
group-limited sigmoid router, the bias moved toward balance after every step, a shared expert, the sequence-wise
balance loss; one multi-token-prediction module but on the pipeline, which does not run it yet) on the layouts that
place it differently reproduces the 1-process run: per-step losses, validation loss and consolidated final
parameters, the routers' biases among them.

    tp=2          MLA's heads split through its up-projections, its down-projections and latent norms replicated,
                  the shared RoPE key entering the heads' region (its gradient all-reduced over tp); the MoE
                  block's experts split by width
    tp=2 sp       the same with the down-projections and latent norms on each rank's slice of the sequence (their
                  gradients summed over tp), the shared RoPE key gathered
    dp_shard=2 ep=2   FSDP gathers MLA's weights; the experts split over the two data ranks, whose loads the bias
                  update sums
    cp=2          keys and values of the whole sequence gathered (MLA's q/k and v widths differ)
    pp=2          a stage each (the dense block and the MoE block), the bias update's table holding zeros for
                  the block a rank does not hold
"""

from __future__ import annotations

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
)
BIAS = "model.layers.1.mlp.score_bias"  # its key in a checkpoint


MTP = "model.mtp_layers=1"  # one multi-token-prediction module (an MoE block of its own), but with the pipeline
_REFERENCES: dict = {}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The 1-process run with or without MTP, each run once for the module."""

    def get(*model: str):
        if model not in _REFERENCES:
            run = run_trial(tmp_path_factory.mktemp("deepseek") / "single", *BASE, *model, timeout=900)
            assert run.code == 0, run.output
            _REFERENCES[model] = run
        return _REFERENCES[model]

    yield get
    _REFERENCES.clear()


@pytest.mark.parametrize(
    "layout, model",
    [
        (("parallel.tp=2",), (MTP,)),
        (("parallel.tp=2", "parallel.sp=true"), (MTP,)),
        (("parallel.dp_shard=2", "parallel.ep=2"), (MTP,)),
        (("parallel.cp=2",), (MTP,)),
        (("parallel.pp=2",), ()),
    ],
)
def test_deepseek_layout_reproduces_the_single_process_run(reference, tmp_path, layout, model):
    run = run_trial(tmp_path / "run", *BASE, *model, *layout, timeout=900)
    assert run.code == 0, run.output + "".join(p.read_text()[-2000:] for p in (run.dir / "logs").glob("rank_*.log"))
    assert_same_run(run, reference(*model), STEPS)
    if model:  # the MTP module trained, its block's bias moved
        params = final_params(run, STEPS)
        assert {"model.mtp.0.proj.weight", "model.mtp.0.block.mlp.score_bias"} <= set(params)
    ref, got = final_params(reference(*model), STEPS)[BIAS], final_params(run, STEPS)[BIAS]
    # the bias moved by whole steps of the update rate (0.01) toward balance, the same on every layout
    assert np.abs(ref).max() > 0.005 and np.abs(np.round(ref / 0.01) - ref / 0.01).max() < 1e-3
    np.testing.assert_allclose(got, ref, atol=1e-6)
