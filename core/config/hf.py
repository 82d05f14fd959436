"""``model=hf:<dir or config.json>``: the model section from a Hugging Face ``config.json``, as overrides.

The override is expanded before Hydra composes (``core.config.compose``): the ``tiny`` preset first, then one
``model.<key>=<value>`` per field read here, so that overrides after it still win (``model=hf:... model.max_seq_len=
8192``) and the config records where the shapes came from (``model.name=hf:<dir>``).

Only what the core builds is read. A field it does not build with the value the checkpoint needs (biases, sliding
windows, RoPE scaling, another activation) is refused naming it, never dropped: a model that silently differs from
its checkpoint is worse than none. Architectures: Llama, Mistral, Mixtral, Qwen2 (q/k/v biases), Qwen3 (QK-norm)
and Qwen3-MoE, the fields of ``transformers``' configuration classes of the same names (transformers 4's
``rope_theta`` or 5's ``rope_parameters``). ``to_hf_config`` writes the other way, for
``core.ckpt.hf``'s export. Reads JSON only (no ``transformers``); no MindSpore here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.config.model import ModelConfig, yarn_mscale
from core.config.overrides import override
from core.config.rules import ConfigError, require

PREFIX = "hf:"
ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "DeepseekV3ForCausalLM",
)
MOE = ("MixtralForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM")
# What an architecture always has that its config does not say: Qwen2's q/k/v biases, Qwen3's QK-norm.
_BUILT_IN = {
    "Qwen2ForCausalLM": {"attn_bias": True},
    "Qwen3ForCausalLM": {"qk_norm": True},
    "Qwen3MoeForCausalLM": {"qk_norm": True},
    "DeepseekV3ForCausalLM": {"attention": "mla"},
}
_REFUSED: dict[str, str] = {}  # read, then refused for a reason of the architecture itself (not of a field)

# config.json key -> model key, for the keys copied as they are
_COPIED = {
    "vocab_size": "vocab_size",
    "num_hidden_layers": "n_layers",
    "hidden_size": "d_model",
    "num_attention_heads": "n_heads",
    "intermediate_size": "ffn_hidden",
    "max_position_embeddings": "max_seq_len",
    "rope_theta": "rope_theta",
    "rms_norm_eps": "norm_eps",
    "tie_word_embeddings": "tie_embeddings",
    "initializer_range": "init_std",
}
# Keys that carry no shape or numerics of training: read past.
_IGNORED = {
    "architectures",
    "model_type",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "use_cache",
    "output_router_logits",
    "max_window_layers",  # Qwen2: which layers a sliding window applies to, when use_sliding_window is on
    "_name_or_path",
}
_SLIDING = "the core's attention is full causal (no sliding window)"
# Keys the core reads only at the value it builds; any other value is refused with the reason.
_REQUIRED_VALUES = {
    "hidden_act": ("silu", "the core's MLP is SwiGLU (silu)"),
    "attention_dropout": (0.0, "the core has no attention dropout"),
    "attention_bias": (False, "the core's attention projections have no bias"),
    "mlp_bias": (False, "the core's MLP has no bias"),
    "pretraining_tp": (1, "pretraining_tp splits the MLP matmuls for numerics the core does not reproduce"),
    "sliding_window": (None, _SLIDING),
    "use_sliding_window": (False, _SLIDING),
    "router_jitter_noise": (0.0, "the core's router adds no jitter"),
    "quantization_config": (None, "FP8 block-quantised weights are not read; dequantize the checkpoint to bf16"),
    # DeepSeek-V3's
    "scoring_func": ("sigmoid", "DeepSeek-V3's router scores are sigmoids"),
    "topk_method": ("noaux_tc", "the core routes DeepSeek-V3 by biased, group-limited top-k (noaux_tc)"),
    "moe_layer_freq": (1, "every block after the dense ones is MoE"),
}


def config_path(spec: str) -> Path:
    """The config.json that ``hf:<dir or file>`` names."""
    path = Path(spec[len(PREFIX) :]).expanduser()
    return path / "config.json" if path.is_dir() else path


def read(spec: str) -> dict[str, Any]:
    """The model section's fields (``ModelConfig`` keys) that ``hf:<dir or config.json>`` gives."""
    path = config_path(spec)
    try:
        hf = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("model", f"{spec}: no {path}; give a directory holding config.json, or the file") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError("model", f"{spec}: {path} is not a readable JSON config ({exc})") from None
    if not isinstance(hf, dict):
        raise ConfigError("model", f"{spec}: {path} must hold a JSON object")
    arch = (hf.get("architectures") or [None])[0]
    if arch in _REFUSED:
        raise ConfigError("model", f"{spec}: {arch} is not built: {_REFUSED[arch]}")
    if arch not in ARCHITECTURES:
        raise ConfigError(
            "model", f"{spec}: architecture {arch!r} is not built; the core reads {', '.join(ARCHITECTURES)}"
        )
    moe = arch in MOE
    if arch == "DeepseekV3ForCausalLM":
        hf, moe = _deepseek(hf, spec)
    return _fields(hf, spec, moe=moe) | _BUILT_IN.get(arch, {})


def _fields(hf: dict, spec: str, *, moe: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {"name": f"{PREFIX}{config_path(spec).parent.name or config_path(spec).stem}"}
    for key, value in hf.items():
        if key.startswith("_model."):  # read by an architecture's own reader
            fields[key[len("_model.") :]] = value
        elif key in _COPIED:
            fields[_COPIED[key]] = value
        elif key == "num_key_value_heads":
            fields["n_kv_heads"] = value if value is not None else hf["num_attention_heads"]
        elif key == "head_dim":  # only when it is not d_model / n_heads (Qwen3's small models)
            if value is not None and value * hf["num_attention_heads"] != hf["hidden_size"]:
                fields["head_dim"] = value
        elif key == "sliding_window" and hf.get("use_sliding_window") is False:
            continue  # a window size that is switched off
        elif key == "layer_types":  # transformers 5: each layer's attention
            if any(t != "full_attention" for t in value or ()):
                raise ConfigError("model", f"{spec}: layer_types={value!r} is not built: {_SLIDING}")
        elif key in ("rope_parameters", "rope_scaling"):  # transformers 5's RoPE settings, or 4's scaling
            fields |= _rope(value, spec, hf.get("max_position_embeddings"))
        elif key in _REQUIRED_VALUES:
            built, why = _REQUIRED_VALUES[key]
            if value != built and not (built is False and value is None):
                raise ConfigError("model", f"{spec}: {key}={value!r} is not built: {why}")
        elif moe and key in _MOE_KEYS:
            fields[_MOE_KEYS[key]] = value
        elif moe and key == "decoder_sparse_step":
            if value != 1:
                raise ConfigError("model", f"{spec}: decoder_sparse_step={value} is not built (every block is MoE)")
        elif moe and key == "mlp_only_layers":  # Qwen3-MoE's dense blocks: the core's are the first k
            if list(value or []) != list(range(len(value or []))):
                raise ConfigError("model", f"{spec}: mlp_only_layers={value} is not built (dense blocks come first)")
            fields["moe_dense_layers"] = len(value or [])
        elif key not in _IGNORED:
            raise ConfigError("model", f"{spec}: {key}={value!r} is a field the core does not read or build")
    fields.setdefault("n_kv_heads", hf["num_attention_heads"])
    fields.setdefault("tie_embeddings", False)  # transformers' default for these architectures
    if moe:  # Mixtral, Qwen3-MoE: dropless softmax top-k, no shared experts; Mixtral renormalises, no dense blocks
        fields = {"moe_router": "softmax", "moe_capacity_factor": None, "moe_shared_experts": 0, **fields}
        fields.setdefault("moe_dense_layers", 0)
        fields.setdefault("moe_norm_topk", True)
    return fields


# DeepSeek-V3's keys -> model keys (its MoE keys shared with the others are in _MOE_KEYS)
_DEEPSEEK_KEYS = {
    "kv_lora_rank": "kv_lora_rank",
    "q_lora_rank": "q_lora_rank",
    "qk_nope_head_dim": "qk_nope_head_dim",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
    "n_routed_experts": "n_experts",
    "n_shared_experts": "moe_shared_experts",
    "routed_scaling_factor": "moe_routed_scale",
    "n_group": "moe_groups",
    "topk_group": "moe_topk_groups",
    "first_k_dense_replace": "moe_dense_layers",
    "aux_loss_alpha": "moe_aux_loss_weight",
    "seq_aux": "moe_aux_per_sequence",
    "rope_interleave": "rope_interleave",
    "num_nextn_predict_layers": "mtp_layers",
    "num_mtp_layers": "mtp_layers",  # transformers 5's name for it
}


# What a DeepSeek-V3 config's MoE keys mean when first_k_dense_replace makes every block dense: nothing to build.
_DEEPSEEK_MOE = {
    "n_routed_experts",
    "n_shared_experts",
    "routed_scaling_factor",
    "n_group",
    "topk_group",
    "aux_loss_alpha",
    "seq_aux",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "first_k_dense_replace",
}


def _deepseek(hf: dict, spec: str) -> tuple[dict, bool]:
    """(``hf`` with DeepSeek-V3's own keys read into model keys (``_model.<key>``) for ``_fields`` to pass on,
    whether any block is MoE). Its MoE: sigmoid scores with the choice bias, group-limited; its RoPE rows
    interleaved unless the config says otherwise (transformers' default)."""
    moe = hf.get("first_k_dense_replace", 0) < hf["num_hidden_layers"]
    if not moe:
        hf = {k: v for k, v in hf.items() if k not in _DEEPSEEK_MOE}
    out: dict[str, Any] = {"_model.rope_interleave": True}
    if moe:
        out |= {"_model.moe_router": "sigmoid", "_model.moe_score_bias": True}
    for key, value in hf.items():
        if key in _DEEPSEEK_KEYS:
            out[f"_model.{_DEEPSEEK_KEYS[key]}"] = value
        elif key in ("head_dim", "qk_head_dim", "ep_size", "auto_map"):
            continue  # derived from the MLA widths; a deployment's expert parallelism; custom code's location
        else:
            out[key] = value
    return out, moe


# MoE keys of Mixtral's and Qwen3-MoE's configs -> model keys
_MOE_KEYS = {
    "num_local_experts": "n_experts",
    "num_experts": "n_experts",
    "num_experts_per_tok": "moe_top_k",
    "router_aux_loss_coef": "moe_aux_loss_weight",
    "moe_intermediate_size": "moe_ffn_hidden",
    "norm_topk_prob": "moe_norm_topk",
}


# RoPE scaling keys of a Hugging Face config (transformers' rope_parameters / rope_scaling) -> model keys
_ROPE_KEYS = {
    "factor": "rope_factor",
    "original_max_position_embeddings": "rope_original_max_len",
    "low_freq_factor": "rope_low_freq_factor",
    "high_freq_factor": "rope_high_freq_factor",
    "beta_fast": "rope_beta_fast",
    "beta_slow": "rope_beta_slow",
    "attention_factor": "rope_attention_factor",
    "truncate": "rope_truncate",
}


def _rope(params: dict | None, spec: str, max_positions: int | None) -> dict[str, Any]:
    """The model fields of transformers' ``rope_parameters`` (5) or ``rope_scaling`` (4): plain RoPE, Llama 3.1's
    scaling (llama3) or YaRN; any other kind, or a key not read, refused naming it."""
    params = {k: v for k, v in (params or {}).items() if v is not None}
    kind = params.pop("rope_type", params.pop("type", "default"))
    fields: dict[str, Any] = {}
    if "rope_theta" in params:
        fields["rope_theta"] = params.pop("rope_theta")
    if kind == "default":
        if params:
            raise ConfigError("model", f"{spec}: RoPE keys {sorted(params)} are not read by the core")
        return fields
    if kind not in ("llama3", "yarn"):
        raise ConfigError("model", f"{spec}: RoPE scaling {kind!r} is not built (the core builds llama3 and yarn)")
    mscale, mscale_all = params.pop("mscale", None), params.pop("mscale_all_dim", None)
    if mscale_all:  # MLA's softmax scale (ModelConfig.softmax_scale); other attentions ignore it, as transformers does
        fields["rope_mscale_all_dim"] = mscale_all
    unread = sorted(set(params) - set(_ROPE_KEYS))
    if unread:
        raise ConfigError("model", f"{spec}: RoPE {kind} keys {unread} are not read by the core")
    fields |= {"rope_scaling": kind, **{_ROPE_KEYS[k]: v for k, v in params.items()}}
    if kind == "yarn" and "rope_factor" not in fields and max_positions and "rope_original_max_len" in fields:
        fields["rope_factor"] = max_positions / fields["rope_original_max_len"]  # transformers' default
    if mscale and mscale_all and "rope_attention_factor" not in fields:  # DeepSeek's form of the temperature
        factor = fields.get("rope_factor", 1.0)
        fields["rope_attention_factor"] = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
    return fields


def to_hf_config(cfg: ModelConfig, *, dtype: str = "float32") -> dict[str, Any]:
    """The ``config.json`` of the Hugging Face model that holds a model of ``cfg``: ``LlamaForCausalLM``, or
    ``MixtralForCausalLM`` for a mixture of experts of Mixtral's kind; a ConfigError naming the field that no
    such class holds (``read`` of the result gives ``cfg``'s fields back)."""
    config: dict[str, Any] = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_size,
        "max_position_embeddings": cfg.max_seq_len,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": _rope_scaling(cfg),
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": cfg.init_std,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "torch_dtype": dtype,
    }
    if cfg.mla:
        return _deepseek_config(cfg, config)
    require(
        not cfg.mtp_layers, "model.mtp_layers", "only DeepSeek-V3 (model.attention=mla) checkpoints hold MTP modules"
    )
    if (cfg.attn_bias or cfg.qk_norm) and not cfg.n_experts:
        require(
            not (cfg.attn_bias and cfg.qk_norm),
            "model.attn_bias",
            "no Hugging Face class has q/k/v biases and QK-norm together (Qwen2 has the first, Qwen3 the second)",
        )
        config.pop("attention_bias")
        arch, kind = ("Qwen3ForCausalLM", "qwen3") if cfg.qk_norm else ("Qwen2ForCausalLM", "qwen2")
        extra = {"attention_bias": False} if cfg.qk_norm else {}
        return {"architectures": [arch], "model_type": kind, **config, **extra, "use_sliding_window": False}
    if not cfg.n_experts:
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **config, "mlp_bias": False}
    qwen = cfg.qk_norm  # Qwen3-MoE: QK-norm, an expert width of its own, dense blocks first, gates as chosen
    for key, value, held in (
        ("moe_router", cfg.moe_router, "softmax"),
        ("moe_shared_experts", cfg.moe_shared_experts, 0),
        ("moe_dense_layers", cfg.moe_dense_layers, cfg.moe_dense_layers if qwen else 0),
        ("moe_ffn_hidden", cfg.expert_width, cfg.expert_width if qwen else cfg.ffn_hidden),
        ("moe_norm_topk", cfg.moe_norm_topk, cfg.moe_norm_topk if qwen else True),
        ("attn_bias", cfg.attn_bias, False),
    ):
        if value != held:
            raise ConfigError(
                f"model.{key}",
                f"is {value!r}; a Hugging Face {'Qwen3-MoE' if qwen else 'Mixtral'} holds {held!r}, and no other MoE "
                "is written",
            )
    config.pop("attention_bias")
    if qwen:
        return {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            **config,
            "attention_bias": False,
            "num_experts": cfg.n_experts,
            "num_experts_per_tok": cfg.moe_top_k,
            "moe_intermediate_size": cfg.expert_width,
            "norm_topk_prob": cfg.moe_norm_topk,
            "router_aux_loss_coef": cfg.moe_aux_loss_weight,
            "decoder_sparse_step": 1,
            "mlp_only_layers": list(range(cfg.moe_dense_layers)),
            "use_sliding_window": False,
        }
    return {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        **config,
        "num_local_experts": cfg.n_experts,
        "num_experts_per_tok": cfg.moe_top_k,
        "router_aux_loss_coef": cfg.moe_aux_loss_weight,
        "sliding_window": None,
    }


def _deepseek_config(cfg: ModelConfig, config: dict[str, Any]) -> dict[str, Any]:
    """``DeepseekV3ForCausalLM``'s config.json for an MLA model (dense blocks only, or DeepSeek-V3's MoE)."""
    moe = cfg.n_experts > 0
    if moe:
        for key, value, held in (
            ("moe_router", cfg.moe_router, "sigmoid"),
            ("moe_score_bias", cfg.moe_score_bias, True),
            ("moe_capacity_factor", cfg.moe_capacity_factor, None),
            ("moe_shared_experts", cfg.moe_shared_experts > 0, True),
        ):
            if value != held:
                raise ConfigError(
                    f"model.{key}",
                    f"is {value!r}; a Hugging Face DeepSeek-V3 holds {held!r}, and no other MLA is written",
                )
    for key in ("head_dim", "attention_bias"):
        config.pop(key)
    scaling = config.pop("rope_scaling")
    if scaling is not None and cfg.rope_mscale_all_dim:
        scaling |= {"mscale": cfg.rope_mscale_all_dim, "mscale_all_dim": cfg.rope_mscale_all_dim}
        scaling.pop("attention_factor", None)  # given by the two mscales
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        **config,
        "rope_scaling": scaling,
        "attention_bias": False,
        "q_lora_rank": cfg.q_lora_rank,
        "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "rope_interleave": cfg.rope_interleave,
        "n_routed_experts": cfg.n_experts if moe else 1,  # no MoE block: first_k_dense_replace covers them all
        "num_experts_per_tok": cfg.moe_top_k if moe else 1,
        "n_shared_experts": cfg.moe_shared_experts if moe else 1,
        "moe_intermediate_size": cfg.expert_width,
        "routed_scaling_factor": cfg.moe_routed_scale,
        "n_group": cfg.moe_groups,
        "topk_group": cfg.moe_topk_groups,
        "norm_topk_prob": cfg.moe_norm_topk,
        "first_k_dense_replace": cfg.moe_dense_layers if moe else cfg.n_layers,
        "aux_loss_alpha": cfg.moe_aux_loss_weight,
        "seq_aux": cfg.moe_aux_per_sequence,
        "num_nextn_predict_layers": cfg.mtp_layers,
    }


def _rope_scaling(cfg: ModelConfig) -> dict[str, Any] | None:
    """transformers' ``rope_scaling`` of ``cfg`` (read by 4 and, converted, by 5)."""
    if cfg.rope_scaling == "none":
        return None
    keys = ["factor", "original_max_position_embeddings"]
    keys += ["low_freq_factor", "high_freq_factor"] if cfg.rope_scaling == "llama3" else list(_ROPE_KEYS)[4:]
    out = {"rope_type": cfg.rope_scaling, **{k: getattr(cfg, _ROPE_KEYS[k]) for k in keys}}
    return {k: v for k, v in out.items() if v is not None}


def expand(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """``overrides`` with each ``model=hf:<path>`` replaced by the preset it starts from and the fields read."""
    out: list[str] = []
    for item in overrides:
        key, _, value = item.partition("=")
        if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":  # quoted, as the agent writes a path
            value = value[1:-1]
        if key.lstrip("+") == "model" and value.startswith(PREFIX):
            out += ["model=tiny", *(override(f"model.{k}", v) for k, v in read(value).items())]
        else:
            out.append(item)
    return out
