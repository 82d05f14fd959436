"""``model=hf:<dir or config.json>``: a Hugging Face config read into the model section, field by field, and
every field the core does not build refused by name. The configs are written here in the shape transformers
saves them (the keys of its LlamaConfig, MistralConfig, MixtralConfig and Qwen2Config)."""

import json

import numpy as np
import pytest

from core.config import ConfigError, load_config

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
MIXTRAL = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}


def _write(tmp_path, config: dict, name="model"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_llama_config_gives_the_preset_shapes(tmp_path):
    folder = _write(tmp_path, LLAMA3_8B, "Meta-Llama-3-8B")
    from_hf = load_config([f"model=hf:{folder}"]).model
    preset = load_config(["model=llama3-8b"]).model
    for key in ("vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "ffn_hidden", "max_seq_len"):
        assert getattr(from_hf, key) == getattr(preset, key), key
    assert (from_hf.rope_theta, from_hf.norm_eps, from_hf.tie_embeddings) == (500000.0, 1e-05, False)
    assert from_hf.name == "hf:Meta-Llama-3-8B" and from_hf.n_experts == 0
    # the file itself works too, and later overrides win
    again = load_config([f"model=hf:{folder / 'config.json'}", "model.max_seq_len=1024"]).model
    assert again.max_seq_len == 1024 and again.d_model == 4096


def test_mixtral_reads_its_experts(tmp_path):
    m = load_config([f"model=hf:{_write(tmp_path, MIXTRAL)}"]).model
    assert (m.n_experts, m.moe_top_k, m.moe_aux_loss_weight) == (8, 2, 0.02)
    assert (m.moe_router, m.moe_capacity_factor, m.moe_shared_experts, m.moe_dense_layers) == ("softmax", None, 0, 0)
    assert m.expert_width == 14336


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"rope_scaling": {"rope_type": "longrope", "factor": 8.0}}, "longrope"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "x": 1}}, "x"),
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"sliding_window": 4096}, "sliding_window"),
        ({"some_new_field": 1}, "some_new_field"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
        ({"architectures": ["GPT2LMHeadModel"]}, "GPT2LMHeadModel"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "dynamic"),
    ],
)
def test_what_the_core_does_not_build_is_refused_by_name(tmp_path, change, named):
    folder = _write(tmp_path, {**LLAMA3_8B, **change})
    with pytest.raises(ConfigError, match=named) as info:
        load_config([f"model=hf:{folder}"])
    assert info.value.field == "model"


def test_llama31_and_yarn_rope_scaling_are_read(tmp_path):
    """Llama 3.1 8B's config.json (transformers 4's rope_scaling), and YaRN in transformers 5's rope_parameters with
    DeepSeek's mscale form of the temperature."""
    llama31 = {
        **LLAMA3_8B,
        "max_position_embeddings": 131072,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
    }
    m = load_config([f"model=hf:{_write(tmp_path, llama31, 'a')}"]).model
    assert (m.rope_scaling, m.rope_factor, m.rope_original_max_len) == ("llama3", 8.0, 8192)
    assert (m.rope_low_freq_factor, m.rope_high_freq_factor, m.rope_theta) == (1.0, 4.0, 500000.0)
    yarn = {k: v for k, v in LLAMA3_8B.items() if k != "rope_theta"}
    yarn["rope_parameters"] = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
        "beta_fast": 32,
        "beta_slow": 1,
    }
    m = load_config([f"model=hf:{_write(tmp_path, yarn, 'b')}"]).model
    assert (m.rope_scaling, m.rope_factor, m.rope_theta, m.rope_beta_fast) == ("yarn", 40.0, 10000.0, 32)
    # (0.1 ln 40 + 1) / (0.0707 ln 40 + 1), the ratio of the two mscales
    assert m.rope_attention_factor == pytest.approx((0.1 * np.log(40) + 1) / (0.0707 * np.log(40) + 1))


def test_qwen2_has_its_biases_and_qwen3_its_qk_norm(tmp_path):
    qwen2 = {**LLAMA3_8B, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False, "sliding_window": 4096}
    qwen3 = {**LLAMA3_8B, "architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "attention_bias": False}
    m2, m3 = (load_config([f"model=hf:{_write(tmp_path, c, n)}"]).model for c, n in ((qwen2, "q2"), (qwen3, "q3")))
    assert (m2.attn_bias, m2.qk_norm, m3.attn_bias, m3.qk_norm) == (True, False, False, True)
    assert m2.d_model == m3.d_model == 4096  # and the rest as Llama's
    assert m3.head_dim is None and m3.head_size == 128  # 4096 / 32: the core's own rule, nothing to record
    small = {**qwen3, "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8}  # Qwen3-0.6B's
    m = load_config([f"model=hf:{_write(tmp_path, small, 'q3s')}"]).model
    assert (m.head_dim, m.attn_width, m.d_model) == (128, 2048, 1024)


def test_a_switched_off_sliding_window_is_read_past(tmp_path):
    qwen_like = {**LLAMA3_8B, "use_sliding_window": False, "sliding_window": 131072, "max_window_layers": 28}
    assert load_config([f"model=hf:{_write(tmp_path, qwen_like)}"]).model.d_model == 4096


def test_a_missing_or_broken_file_names_it(tmp_path):
    with pytest.raises(ConfigError, match="no .*config.json"):
        load_config([f"model=hf:{tmp_path / 'absent'}"])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable JSON"):
        load_config([f"model=hf:{tmp_path / 'bad'}"])


def test_a_quoted_path_reads_too(tmp_path):
    """The agent quotes a value with ':' and '/' in its overrides (Hydra's grammar): model='hf:<dir>'."""
    folder = _write(tmp_path, LLAMA3_8B)
    assert load_config([f"model='hf:{folder}'"]).model == load_config([f"model=hf:{folder}"]).model


# DeepSeek-V3's config.json as the Hub publishes it (deepseek-ai/DeepSeek-V3; its custom-code and FP8 keys too)
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
    "aux_loss_alpha": 0.001,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "pretraining_tp": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8"},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 129280,
}


def test_deepseek_v3_reads_as_its_preset_and_what_is_not_built_is_refused(tmp_path):
    """The Hub's DeepSeek-V3 config: its FP8 weights refused by name; without them, the model of the deepseek-v3
    preset (671.0B parameters in the main model, the published total, and one MTP module) with the config's 128K
    YaRN context."""
    import math

    from core.model.flops import param_shapes

    with pytest.raises(ConfigError, match="quantization_config=.* FP8"):
        load_config([f"model=hf:{_write(tmp_path, DEEPSEEK_V3, 'b')}"])
    bf16 = {k: v for k, v in DEEPSEEK_V3.items() if k != "quantization_config"}
    m = load_config([f"model=hf:{_write(tmp_path, bf16, 'c')}"]).model
    preset = load_config(["model=deepseek-v3"]).model
    main = {n: s for n, s in param_shapes(m).items() if not n.startswith("mtp.")}
    assert sum(math.prod(s) for s in main.values()) == 671_026_404_352 and m.mtp_layers == 1
    assert param_shapes(m) == param_shapes(preset)
    for key in ("moe_groups", "moe_topk_groups", "moe_routed_scale", "moe_score_bias", "moe_router", "q_lora_rank"):
        assert getattr(m, key) == getattr(preset, key), key
    assert (m.rope_scaling, m.rope_factor, m.rope_original_max_len, m.max_seq_len) == ("yarn", 40, 4096, 163840)
    assert m.rope_interleave and m.moe_aux_per_sequence and m.moe_aux_loss_weight == 0.001
    # the softmax scale of MLA under YaRN: 1/sqrt(192) * (0.1 ln 40 + 1)^2
    assert m.softmax_scale == pytest.approx(192**-0.5 * (0.1 * math.log(40) + 1) ** 2)
    assert m.rope_attention_factor == pytest.approx(1.0)  # mscale / mscale_all_dim


@pytest.mark.parametrize(
    "change, named",
    [
        ({"topk_method": "greedy"}, "topk_method='greedy' is not built"),
        ({"scoring_func": "softmax"}, "scoring_func='softmax' is not built"),
        ({"moe_layer_freq": 2}, "moe_layer_freq=2 is not built"),
    ],
)
def test_deepseek_v3_routing_the_core_does_not_build_is_refused(tmp_path, change, named):
    config = {**DEEPSEEK_V3, **change}
    config.pop("quantization_config")
    with pytest.raises(ConfigError, match=named):
        load_config([f"model=hf:{_write(tmp_path, config)}"])
