"""Hugging Face checkpoints with the real library: small random models of each architecture made and saved by
``transformers`` itself, loaded into the core, and their logits compared with transformers' on the same tokens
(fp32, 1e-5 relative); then saved from the core and loaded by transformers, the same check. No download."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from core.ckpt import hf
from core.ckpt.store import CheckpointError
from core.config import ConfigError, load_config
from core.model.flops import param_shapes

REASON = "the optional interop extra is not installed (pip install -e '.[interop]': transformers and CPU torch)"
torch = pytest.importorskip("torch", reason=REASON)
transformers = pytest.importorskip("transformers", reason=REASON)
ms = pytest.importorskip("mindspore")
from mindspore import Tensor  # noqa: E402

from core.model import GPT, moe_layers  # noqa: E402

SHAPES = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
)
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(rope_theta=500000.0)),
    "llama-tied": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None, rope_theta=1e6)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=1e6)),  # q/k/v biases
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),  # QK-norm
    "qwen3-wide-heads": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32)),  # heads wider than hidden / heads
    "qwen3-moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True),
    ),
    # the gates as the router scored them (transformers' default), and a dense first block
    "qwen3-moe-raw-gates": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, mlp_only_layers=[0]),
    ),
    # Llama 3.1's RoPE scaling, and YaRN's (its attention temperature too), over an original context shorter than
    # the tokens, so that every regime of the frequencies counts
    "llama3.1-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=5e5,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            )
        ),
    ),
    "yarn": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0, original_max_position_embeddings=16)),
    ),
    # MLA with q's latent, YaRN with DeepSeek's mscales, interleaved RoPE rows; a dense block, then DeepSeek-V3's
    # MoE: sigmoid scores, a random choice bias, 2 of 4 groups, scaled gates, a shared expert
    "deepseek-v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            num_key_value_heads=4,
            q_lora_rank=24,
            kv_lora_rank=16,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=12,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            n_shared_experts=1,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            routed_scaling_factor=2.5,
            num_nextn_predict_layers=0,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=1e4,
                factor=4.0,
                original_max_position_embeddings=16,
                mscale=1.0,
                mscale_all_dim=1.0,
                beta_fast=32,
                beta_slow=1,
            ),
        ),
    ),
    # MLA without q's latent (DeepSeek-V2-Lite's form), RoPE rows in halves, every block dense
    "deepseek-mla-dense": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            num_key_value_heads=4,
            q_lora_rank=None,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=16,
            first_k_dense_replace=2,
            rope_interleave=False,
            num_nextn_predict_layers=0,
        ),
    ),
}
TOKENS = np.random.default_rng(0).integers(0, SHAPES["vocab_size"], (2, 24)).astype(np.int32)


@pytest.fixture(autouse=True)
def _inductor_cache(tmp_path, monkeypatch):
    """torch names its compile cache in os.environ the first time a model runs; given here, it is undone after."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def hf_model(arch: str, seed: int = 0):
    """A transformers model of ``arch`` with every weight random (norms around 1), so that a swapped or transposed
    tensor changes the logits."""
    config_cls, model_cls, extra = ARCHITECTURES[arch]
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**(SHAPES | extra))).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.1 if "norm" in name else 0.3) + (1.0 if "norm" in name else 0.0))
        for name, b in model.named_buffers():  # DeepSeek-V3's choice bias: it must move the choice
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.3)
    return model


def hf_logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(TOKENS.astype(np.int64))).logits.numpy()


def core_model(path) -> GPT:
    """The core's model of ``model=hf:<path>`` with the checkpoint's weights."""
    cfg = load_config([f"model=hf:{path}"]).model
    model = GPT(cfg)
    biases = [m.score_bias for m in moe_layers(model) if m.has_bias]
    params = {p.name: p for p in [*model.trainable_params(), *biases]}
    hf.check_complete(path, cfg)
    for name, array in hf.read_params(path, list(params), cfg, {n: p.shape for n, p in params.items()}):
        params[name].set_data(Tensor(array))
    return model


def close(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| relative to max |b|."""
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_hf_checkpoint_loads_into_the_core_and_back(tmp_path, arch):
    model = hf_model(arch)
    model.save_pretrained(tmp_path / "hf")
    expected = hf_logits(model)

    core = core_model(tmp_path / "hf")
    logits = core.logits(Tensor(TOKENS)).asnumpy()
    assert close(logits, expected) <= 1e-5

    # saved from the core in the Hub's names, loaded by transformers: the same logits
    biases = [m.score_bias for m in moe_layers(core) if m.has_bias]
    tensors = {p.name: p.asnumpy() for p in [*core.trainable_params(), *biases]}
    hf.save(tmp_path / "out", tensors, core.cfg)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").float().eval()
    assert type(back).__name__ == ARCHITECTURES[arch][1].replace("Mistral", "Llama")  # Mistral's is Llama's
    assert close(hf_logits(back), expected) <= 1e-5
    # and its config reads back as the same model (but for the name: the directory's)
    written, read = (load_config([f"model=hf:{tmp_path / d}"]).model for d in ("out", "hf"))
    assert dataclasses.replace(written, name=read.name) == read


def test_sharded_bf16_checkpoint_round_trips(tmp_path):
    """Shards with an index, and bf16 storage (read as float32): each weight equals transformers' own bf16 copy."""
    model = hf_model("mixtral")
    model.to(torch.bfloat16).save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    assert (tmp_path / "hf" / hf.INDEX).is_file()
    cfg = load_config([f"model=hf:{tmp_path / 'hf'}"]).model
    names = list(param_shapes(cfg))
    hub = {n: p.float().numpy() for n, p in model.state_dict().items()}
    with hf.HFCheckpoint(tmp_path / "hf") as ckpt:
        tensors = {n: hf.read_param(ckpt, n, cfg) for n in names}
    for name, array in tensors.items():  # transformers 5 holds Mixtral's router and experts fused, and names them so
        i = name.split(".")[1] if name.startswith("layers.") else None
        if name.endswith("router.weight"):
            expected = hub[f"model.layers.{i}.mlp.gate.weight"]
        elif ".experts." in name:
            down, gate_up = (hub[f"model.layers.{i}.mlp.experts.{w}"] for w in ("down_proj", "gate_up_proj"))
            F = gate_up.shape[1] // 2
            expected = {"w_gate": gate_up[:, :F], "w_up": gate_up[:, F:], "w_down": down}[name.rsplit(".", 1)[1]]
        else:
            expected = hub[hf.hf_name(name)]
        np.testing.assert_array_equal(array, expected, err_msg=name)

    # written back in shards of bf16: the index covers every tensor, and the values survive
    out = hf.save(tmp_path / "out", tensors, cfg, dtype="bfloat16", max_shard_bytes=16_000)
    index = json.loads((out / hf.INDEX).read_text())
    assert len(set(index["weight_map"].values())) > 1
    with hf.HFCheckpoint(out) as ckpt:
        for name in names:
            np.testing.assert_array_equal(hf.read_param(ckpt, name, cfg), tensors[name], err_msg=name)


def test_a_checkpoint_that_differs_from_the_model_is_refused_naming_the_tensor(tmp_path):
    model = hf_model("llama")
    model.save_pretrained(tmp_path / "hf")
    cfg = load_config([f"model=hf:{tmp_path / 'hf'}"]).model
    # a weight the core does not build (a bias): refused, never dropped
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    state["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)
    from safetensors.numpy import save_file

    save_file(state, str(tmp_path / "hf" / hf.WEIGHTS), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="q_proj.bias"):
        hf.check_complete(tmp_path / "hf", cfg)
    del state["model.layers.0.self_attn.q_proj.bias"], state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(tmp_path / "hf" / hf.WEIGHTS), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="layers.1.mlp.up_proj"):
        hf.check_complete(tmp_path / "hf", cfg)


def test_a_model_no_hugging_face_class_holds_is_refused_naming_the_field():
    cfg = load_config(["model=moe-tiny", "model.moe_router=sigmoid"]).model
    with pytest.raises(ConfigError, match="model.moe_router"):
        hf.save("/nonexistent/never-written", {}, cfg)


def test_transformers_5_fused_expert_names_load_too(tmp_path):
    """A Mixtral file in the names transformers 5 holds in memory (its state_dict: router and experts fused)."""
    from safetensors.numpy import save_file

    model = hf_model("mixtral", seed=1)
    model.save_pretrained(tmp_path)  # config.json (the weights are replaced below)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, str(tmp_path / hf.WEIGHTS), metadata={"format": "pt"})
    assert close(core_model(tmp_path).logits(Tensor(TOKENS)).asnumpy(), hf_logits(model)) <= 1e-5


def _mtp_logits_hf(main, mtp, tokens: np.ndarray) -> np.ndarray:
    """transformers' MTP depth 1 over the whole window: the main model's output at positions 0..S-1 and the tokens
    1..S (MtpModel takes the tokens, and their positions, one place on; RoPE is relative, so the core's positions
    0..S-1 give the same scores)."""
    S = tokens.shape[1] - 1
    ids = torch.from_numpy(tokens.astype(np.int64))
    with torch.no_grad():
        last = main.model(ids[:, :S]).last_hidden_state
        h = mtp.forward_layer(0, last, torch.arange(1, S + 1)[None], None, input_ids=ids[:, 1:])
        return mtp._project_to_logits(h).numpy()


def _mtp_logits_core(core, tokens: np.ndarray) -> np.ndarray:
    S = tokens.shape[1] - 1
    hidden = core(Tensor(tokens[:, :S]))
    positions = Tensor(np.arange(S, dtype=np.int32))
    h = core.mtp_hidden(0, hidden, Tensor(tokens[:, 1:]), positions)
    return (h.asnumpy() @ core.head_weight().asnumpy().T).astype(np.float32)


def test_deepseek_mtp_module_loads_and_saves_as_transformers_runs_it(tmp_path):
    """DeepSeek-V3 with one multi-token-prediction module, in the Hub's layout (layer n_layers: enorm, hnorm,
    eh_proj, the block, shared_head.norm, and copies of the embedding and head): the core's module gives
    transformers' MtpModel logits, and the core's export loads back into MtpModel with the same logits."""
    from safetensors.torch import load_file, save_file
    from transformers.modeling_layers import MtpModel

    config_cls, model_cls, extra = ARCHITECTURES["deepseek-v3"]
    config = getattr(transformers, config_cls)(**(SHAPES | extra | {"num_nextn_predict_layers": 1}))
    torch.manual_seed(1)
    main = getattr(transformers, model_cls)(config).float().eval()
    mtp = MtpModel(main, 1).float().eval()
    with torch.no_grad():
        for module in (main, mtp):
            for name, p in module.named_parameters():
                p.copy_(torch.randn_like(p) * (0.1 if "norm" in name else 0.3) + (1.0 if "norm" in name else 0.0))
    main.save_pretrained(tmp_path / "hf")
    L, tensors = config.num_hidden_layers, load_file(tmp_path / "hf" / hf.WEIGHTS)
    for name, p in mtp.state_dict().items():  # MtpModel's names -> the Hub's (transformers' conversion, reversed)
        if name.startswith(("embed_tokens.", "shared_head.")):
            continue
        rest = name.removeprefix("layers.0.").replace("mtp_block.", "").replace("post_norm.", "shared_head.norm.")
        tensors[f"model.layers.{L}.{rest}"] = p.detach().clone()
    tensors[f"model.layers.{L}.embed_tokens.weight"] = main.model.embed_tokens.weight.detach().clone()
    tensors[f"model.layers.{L}.shared_head.head.weight"] = main.lm_head.weight.detach().clone()
    save_file(tensors, tmp_path / "hf" / hf.WEIGHTS, metadata={"format": "pt"})
    tokens = np.random.default_rng(3).integers(0, SHAPES["vocab_size"], (2, 25)).astype(np.int32)
    expected = _mtp_logits_hf(main, mtp, tokens)

    core = core_model(tmp_path / "hf")
    assert core.cfg.mtp_layers == 1
    assert close(_mtp_logits_core(core, tokens), expected) <= 1e-5

    # saved from the core: transformers' main model loads it, and its MTP layer is the Hub's layout (read here by
    # name: MtpModel.from_pretrained looks for DeepSeek-V3's layer 61 only)
    biases = [m.score_bias for m in moe_layers(core) if m.has_bias]
    hf.save(tmp_path / "out", {p.name: p.asnumpy() for p in [*core.trainable_params(), *biases]}, core.cfg)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").float().eval()
    saved, mtp_back = load_file(tmp_path / "out" / hf.WEIGHTS), MtpModel(back, 1).float().eval()
    hub = {n: t for n, t in saved.items() if n.startswith(f"model.layers.{L}.")}
    assert torch.equal(hub.pop(f"model.layers.{L}.embed_tokens.weight"), back.model.embed_tokens.weight)
    assert torch.equal(hub.pop(f"model.layers.{L}.shared_head.head.weight"), back.lm_head.weight)
    state = {}
    for name, t in hub.items():
        rest = name.removeprefix(f"model.layers.{L}.").replace("shared_head.norm.", "post_norm.")
        own = rest.startswith(("enorm.", "hnorm.", "eh_proj.", "post_norm."))
        state[f"layers.0.{rest}" if own else f"layers.0.mtp_block.{rest}"] = t
    experts = [n for n in state if ".mlp.experts." in n]  # the Hub's experts one by one -> transformers' fused
    for n in experts:
        state.pop(n)
    w = {(int(n.split(".")[5]), n.split(".")[6]): hub[f"model.layers.{L}.{n.split('mtp_block.')[1]}"] for n in experts}
    X = 1 + max(x for x, _ in w)
    state["layers.0.mtp_block.mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([w[(x, "gate_proj")], w[(x, "up_proj")]]) for x in range(X)]
    )
    state["layers.0.mtp_block.mlp.experts.down_proj"] = torch.stack([w[(x, "down_proj")] for x in range(X)])
    missing, unexpected = mtp_back.load_state_dict(state, strict=False)
    assert not unexpected and all(n.startswith(("embed_tokens.", "shared_head.")) for n in missing), missing
    assert close(_mtp_logits_hf(back, mtp_back, tokens), expected) <= 1e-5
