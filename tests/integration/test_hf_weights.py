"""A Hugging Face checkpoint as a trial's starting weights (``checkpoint.load_weights=hf:<dir>``), made by
``transformers`` itself: the 1-process trial's first loss is transformers' loss of that model on the same batch,
sharded layouts (FSDP, TP) reproduce the 1-process run, and the trial's checkpoint exported back
(``python -m core.ckpt export-hf``) is the trial's weights as transformers loads them."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from core.config import load_config
from core.data.dataset import datasets_for
from tests.integration.conftest import ROOT, assert_same_run, final_params, losses, run_trial

REASON = "the optional interop extra is not installed (pip install -e '.[interop]': transformers and CPU torch)"
torch = pytest.importorskip("torch", reason=REASON)
transformers = pytest.importorskip("transformers", reason=REASON)

pytestmark = pytest.mark.slow

STEPS = 4
LAYOUTS = {"dp_shard=2": ("parallel.dp_shard=2",), "tp=2": ("parallel.tp=2",)}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A Llama of the embedded corpus's byte vocabulary, every weight random, saved by transformers."""
    path = tmp_path_factory.mktemp("hf") / "llama"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=500000.0,
    )
    model = transformers.LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return path, model


def base(path) -> tuple[str, ...]:
    return (
        f"model=hf:{path}",
        f"checkpoint.load_weights=hf:{path}",
        "seed=3",
        f"trial.max_steps={STEPS}",
        "training.seq_len=32",
        "training.global_batch_size=4",
        "checkpoint.at_end=true",
    )


@pytest.fixture(scope="module")
def reference(hub, tmp_path_factory):
    run = run_trial(tmp_path_factory.mktemp("ref") / "t", *base(hub[0]))
    assert run.code == 0, run.output[-3000:]
    return run


def test_first_loss_is_transformers_loss_of_the_same_batch(hub, reference):
    path, model = hub
    cfg = load_config(list(base(path)))
    rows = datasets_for(cfg)[0].batch(0, cfg.training.global_batch_size, cfg.training.seq_len, cfg.seed)
    inputs, targets = (torch.from_numpy(rows[:, s].astype(np.int64)) for s in (slice(None, -1), slice(1, None)))
    with torch.no_grad():
        logits = model(inputs).logits
        expected = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    assert losses(reference)[1] == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_starts_from_the_same_weights(hub, reference, tmp_path, layout):
    run = run_trial(tmp_path / "t", *base(hub[0]), *LAYOUTS[layout])
    assert run.code == 0, run.output[-3000:]
    assert_same_run(run, reference, STEPS)


def test_a_model_other_than_the_checkpoints_is_refused_naming_the_field(hub, tmp_path):
    run = run_trial(tmp_path / "t", *base(hub[0]), "model.n_kv_heads=4")
    assert run.code == 2
    assert "model.n_kv_heads" in run.summary["reason"]


def test_the_trials_checkpoint_exports_to_transformers(reference, tmp_path):
    step = reference.dir / "checkpoints" / f"step_{STEPS:08d}"
    done = subprocess.run(
        [sys.executable, "-m", "core.ckpt", "export-hf", str(step), str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").float()
    hub_state = {k: v.numpy() for k, v in back.state_dict().items()}
    trained = final_params(reference, STEPS)
    assert hub_state["model.embed_tokens.weight"].shape == (256, 64)
    np.testing.assert_array_equal(hub_state["model.embed_tokens.weight"], trained["model.embed.weight"])
    np.testing.assert_array_equal(
        hub_state["model.layers.1.mlp.down_proj.weight"], trained["model.layers.1.mlp.w_down.weight"]
    )
    np.testing.assert_array_equal(hub_state["lm_head.weight"], trained["model.lm_head.weight"])
