"""Multi-token prediction's objective (``core.model.mtp``): the step differentiates the main loss plus the weighted
mean of the modules' losses, written out here op by op, and reports the main loss; the targets of each depth are the
window's tokens that many places on. The modules' forward is checked against transformers' MtpModel in
tests/unit/core/ckpt/test_hf_interop.py."""

from __future__ import annotations

import numpy as np
import pytest

from core.config import load_config

ms = pytest.importorskip("mindspore")
from mindspore import Tensor  # noqa: E402

from core.model import GPT  # noqa: E402
from core.parallel.dims import ParallelDims  # noqa: E402
from core.training.parallelize import parallelize  # noqa: E402

S, DEPTH, WEIGHT = 16, 2, 0.3


def test_the_objective_adds_the_weighted_module_losses_and_reports_the_main_loss():
    cfg = load_config(
        ["model=deepseek-tiny", f"model.mtp_layers={DEPTH}", f"model.mtp_loss_weight={WEIGHT}", f"training.seq_len={S}"]
    )
    par = parallelize(GPT(cfg.model, seed=1), ParallelDims(), cfg)
    rows = np.random.default_rng(0).integers(0, cfg.model.vocab_size, (2, S + 1 + DEPTH)).astype(np.int32)
    inputs, targets = par.local_tokens(rows, training=True)
    assert inputs.shape == (2, S) and targets.shape == (2, S, 1 + DEPTH)
    for j in range(1 + DEPTH):  # depth j's targets: the tokens j + 1 places after each input
        np.testing.assert_array_equal(targets[:, :, j], rows[:, 1 + j : 1 + j + S])
    model, loss, positions = par.model, par.loss, Tensor(np.arange(S, dtype=np.int32))
    params = model.trainable_params()

    def written_out(x, y, pos):
        hidden = model(x, pos)
        total = main = loss(hidden, model.head_weight(), y[:, :, 0])
        for k in range(DEPTH):
            hidden = model.mtp_hidden(k, hidden, y[:, :, k], pos)
            total = total + WEIGHT / DEPTH * loss(hidden, model.head_weight(), y[:, :, k + 1])
        return total, main

    (want, main), want_grads = ms.value_and_grad(written_out, None, params, has_aux=True)(
        Tensor(inputs), Tensor(targets), positions
    )
    got, grads = ms.value_and_grad(par.train_loss, None, params)(Tensor(inputs), Tensor(targets), positions)
    assert float(got) == pytest.approx(float(main), rel=1e-6)  # the reported loss is the main model's
    assert float(want) > float(main) * (1 + WEIGHT / 4)  # the modules' losses (near ln V at init) do count
    for p, g, w in zip(params, grads, want_grads, strict=True):
        np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-5, atol=1e-7, err_msg=p.name)
    reached = {p.name for p, g in zip(params, grads, strict=True) if np.abs(g.asnumpy()).max() > 0}
    assert {"mtp.0.proj.weight", "mtp.1.proj.weight", "mtp.1.block.attn.wkv_b.weight"} <= reached


def test_mtp_runs_on_every_layout_and_recompute():
    """The trainer accepts MTP with pipelines (mpipe among them) and full recompute under jit (each reproduces the
    1-process run: tests/integration/test_deepseek_layouts.py, test_mpipe.py)."""
    from core.config.rules import check_runnable

    mtp = ["model=deepseek-tiny", "model.mtp_layers=1"]
    mpipe = ["parallel.pp=2", "parallel.pp_schedule=mpipe", "training.global_batch_size=8"]
    for runs in (["parallel.pp=2"], ["parallel.pp=2", "parallel.pp_schedule=gpipe"], mpipe, ["memory.recompute=full"]):
        check_runnable(load_config([*mtp, *runs]))
