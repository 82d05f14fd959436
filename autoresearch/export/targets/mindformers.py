"""The core's config as a MindFormers (MindSpore Transformers) YAML fragment, for its static-graph trainer.

Key names as MindFormers spells them, from:
- docs: mindformers/docs/source_en/feature/configuration.md (MindSpore docs repo): ``parallel_config``,
  ``parallel.enable_parallel_optimizer`` / ``parallel_optimizer_config.optimizer_weight_shard_size``,
  ``parallel.pipeline_config.{pipeline_interleave,pipeline_scheduler}``, ``runner_config``, ``recompute_config``,
  ``swap_config``, ``context``, ``lr_schedule``, ``optimizer``; feature/memory_optimization.md for the per-stage
  ``recompute`` lists (2-D ``[interleave][stage]`` with ``pp_interleave_num``) and ``swap_config``'s
  ``layer_swap`` / ``op_swap``; model_config ``offset`` (per stage, 2-D when interleaved; sums to
  num_layers % stages).
- configs/general/llm_pretrain_moe_template.yaml and research/deepseek3/.../pretrain_deepseek3_671b.yaml
  (``parallel_config.expert_parallel``, ``use_seq_parallel``, ``context.jit_config.jit_level``).
- mindformers/wrapper/wrapper.py: MFTrainOneStepCell(use_clip_grad, max_grad_norm).
- mindformers/core/optim/muon.py: Muon(momentum, ns_steps, adamw_betas, adamw_eps, weight_decay); its update is
  scaled by matched_adamw_rms * sqrt(max(A, B)) with 0.2 by default, the core's scale (core/optim/muon.py), so the
  learning rate carries over; nesterov=True is the core's lookahead too.
- lr schedules (docs/api/api_python/core/): CosineWithWarmUpLR(lr_end), PolynomialWithWarmUpLR(power=1: linear,
  lr_end), WarmUpStableDecayLR(lr_end, decay_start_ratio), ConstantWarmUpLR.
- MindSpore pipeline schedulers (docs features/parallel/pipeline_parallel.md): gpipe, 1f1b; interleaved is 1f1b
  with pipeline_interleave.

Approximations, by design: MindFormers' parallel optimizer shards weights and optimizer states over
``optimizer_weight_shard_size`` ranks of the data-parallel group, the core's FSDP (dp_shard; with HSDP, groups of
dp_shard inside the dp_replicate * dp_shard ranks). MindFormers' default ``select_recompute`` recomputes the SwiGLU
(``feed_forward.mul``, ``feed_forward.w1.activation.silu``); the core's selective also recomputes norms and the
attention softmax. ``op_swap`` op names are MindFormers' Llama cells (``attention``, ``feed_forward``,
``attention_norm``, ``ffn_norm``). MindFormers' swap runs under static graph only, the core's under PyNative only,
so a winner with SWAP exports its swap_config and lists training.mode=pynative as not exported.
"""

from __future__ import annotations

import math

from autoresearch.export.targets.rules import (
    TRIAL_ONLY,
    Flat,
    NoCounterpart,
    Rule,
    Target,
    no_mpipe,
    recompute_spelling,
    rounded,
    same,
    split_spelling,
    stage_recompute,
    stage_split,
    transpose_rule,
)
from core.config.model import yarn_mscale

# --- data parallel: replicas x FSDP shards = data_parallel, sharded by the parallel optimizer ---


def _dp_export(c: Flat) -> Flat:
    shard = c["parallel.dp_shard"]
    out = {
        "parallel_config.data_parallel": c["parallel.dp_replicate"] * shard,
        "parallel.enable_parallel_optimizer": shard > 1,
    }
    if shard > 1:
        out["parallel.parallel_optimizer_config.optimizer_weight_shard_size"] = shard
    return out


def _dp_restore(doc: Flat, core: Flat) -> Flat:
    shard = (
        doc.get("parallel.parallel_optimizer_config.optimizer_weight_shard_size", 1)
        if doc.get("parallel.enable_parallel_optimizer")
        else 1
    )
    return {"parallel.dp_shard": shard, "parallel.dp_replicate": doc["parallel_config.data_parallel"] // shard}


DP = Rule(
    ("parallel.dp_replicate", "parallel.dp_shard"),
    (
        "parallel_config.data_parallel",
        "parallel.enable_parallel_optimizer",
        "parallel.parallel_optimizer_config.optimizer_weight_shard_size",
    ),
    _dp_export,
    _dp_restore,
)


# --- pipeline: schedule and stages per rank, then the layers of each stage as offsets from the even split ---


def _schedule_export(c: Flat) -> Flat:
    if c["parallel.pp_schedule"] == "mpipe":
        no_mpipe("MindFormers")
    interleaved = c["parallel.pp_schedule"] == "interleaved"
    return {
        "parallel.pipeline_config.pipeline_interleave": interleaved,
        "parallel.pipeline_config.pipeline_scheduler": "gpipe" if c["parallel.pp_schedule"] == "gpipe" else "1f1b",
        "model.model_config.pp_interleave_num": c["parallel.pp_virtual"],
    }


def _schedule_restore(doc: Flat, core: Flat) -> Flat:
    if doc.get("parallel.pipeline_config.pipeline_interleave"):
        schedule = "interleaved"
    else:
        schedule = doc.get("parallel.pipeline_config.pipeline_scheduler", "1f1b")
    return {"parallel.pp_schedule": schedule, "parallel.pp_virtual": doc.get("model.model_config.pp_interleave_num", 1)}


SCHEDULE = Rule(
    ("parallel.pp_schedule", "parallel.pp_virtual"),
    (
        "parallel.pipeline_config.pipeline_interleave",
        "parallel.pipeline_config.pipeline_scheduler",
        "model.model_config.pp_interleave_num",
    ),
    _schedule_export,
    _schedule_restore,
)


def per_stage(values: list, pp: int, virtual: int):
    """A per-stage list (core stage s = chunk s // pp on rank s % pp) in MindFormers' shape: flat without
    interleaving, ``[interleave][stage]`` with it."""
    values = list(values)
    return values if virtual == 1 else [values[c * pp : (c + 1) * pp] for c in range(virtual)]


def flat_stages(value) -> list:
    return [x for row in value for x in row] if value and isinstance(value[0], list) else list(value)


def _offset_export(c: Flat) -> Flat:
    split, n = stage_split(c), c["model.n_layers"]
    offsets = [layers - n // len(split) for layers in split]
    value = per_stage(offsets, c["parallel.pp"], c["parallel.pp_virtual"]) if any(offsets) else 0
    return {"model.model_config.offset": value}


def _offset_restore(doc: Flat, core: Flat) -> Flat:
    stages, n = core["parallel.pp"] * core["parallel.pp_virtual"], core["model.n_layers"]
    value = doc["model.model_config.offset"]
    offsets = [0] * stages if value == 0 else flat_stages(value)
    if len(offsets) != stages:
        raise ValueError(f"model.model_config.offset {value} does not name {stages} stages")
    layers, offset = split_spelling([n // stages + o for o in offsets], n)
    return {"parallel.pp_layers": layers, "parallel.pp_offset": offset}


OFFSET = Rule(
    ("parallel.pp_layers", "parallel.pp_offset"), ("model.model_config.offset",), _offset_export, _offset_restore
)


# --- batch: per-device micro-batch, then micro-batches (pipeline) or gradient accumulation (no pipeline) ---


def _batch_export(c: Flat) -> Flat:
    dp = c["parallel.dp_replicate"] * c["parallel.dp_shard"]
    steps = c["training.global_batch_size"] // (c["training.micro_batch_size"] * dp)
    piped = c["parallel.pp"] > 1
    return {
        "runner_config.batch_size": c["training.micro_batch_size"],
        "parallel_config.micro_batch_num": steps if piped else 1,
        "runner_config.gradient_accumulation_steps": 1 if piped else steps,
    }


def _batch_restore(doc: Flat, core: Flat) -> Flat:
    mbs = doc["runner_config.batch_size"]
    steps = doc.get("parallel_config.micro_batch_num", 1) * doc.get("runner_config.gradient_accumulation_steps", 1)
    return {
        "training.micro_batch_size": mbs,
        "training.global_batch_size": mbs * doc["parallel_config.data_parallel"] * steps,
    }


BATCH = Rule(
    ("training.global_batch_size", "training.micro_batch_size"),
    ("runner_config.batch_size", "parallel_config.micro_batch_num", "runner_config.gradient_accumulation_steps"),
    _batch_export,
    _batch_restore,
)


# --- recompute: per stage, how many leading blocks (full: ``recompute``; selective: ``select_recompute``) ---


def _recompute_export(c: Flat) -> Flat:
    split, (settings, given) = stage_split(c), stage_recompute(c)
    if "selective_op" in settings:
        raise NoCounterpart(
            "MindFormers' recompute_config recomputes whole blocks or named ops (select_recompute), not every second "
            "matmul (memory.recompute=selective_op, torchtitan's policy); use selective or full"
        )
    if c["memory.recompute_stages"] is None and given == [None] * len(split):
        return {
            "recompute_config.recompute": settings[0] == "full",
            "recompute_config.select_recompute": settings[0] == "selective",
        }
    counts = [n if k is None else min(k, n) for k, n in zip(given, split, strict=True)]
    pp, v = c["parallel.pp"], c["parallel.pp_virtual"]
    return {
        f"recompute_config.{name}": per_stage(
            [n if s == kind else 0 for n, s in zip(counts, settings, strict=True)], pp, v
        )
        for name, kind in (("recompute", "full"), ("select_recompute", "selective"))
    }


def _recompute_restore(doc: Flat, core: Flat) -> Flat:
    split = stage_split(core)

    def counts(value) -> list[int]:
        if isinstance(value, bool):
            return [n if value else 0 for n in split]
        return [n if x is True else int(x) for x, n in zip(flat_stages(value), split, strict=True)]

    full = counts(doc.get("recompute_config.recompute", False))
    select = counts(doc.get("recompute_config.select_recompute", False))
    if any(0 < f < s for f, s in zip(full, select, strict=True)):  # (a block recomputed whole needs no select)
        raise ValueError(
            f"recompute_config {full} / {select} recomputes some blocks of a stage whole and the next selectively; "
            "the core sets one mode per stage (memory.recompute_stages)"
        )
    settings = ["full" if f else "selective" if s else "none" for f, s in zip(full, select, strict=True)]
    return recompute_spelling(settings, [f or s for f, s in zip(full, select, strict=True)], split)


RECOMPUTE = Rule(
    ("memory.recompute", "memory.recompute_layers", "memory.recompute_stages", "memory.recompute_stage_layers"),
    ("recompute_config.recompute", "recompute_config.select_recompute"),
    _recompute_export,
    _recompute_restore,
)


# --- activation SWAP: which blocks, which of their parts ---

OP_NAMES = {"attention": ["attention"], "mlp": ["feed_forward"], "norm": ["attention_norm", "ffn_norm"]}
PREFETCH = 1  # MindFormers' own default (default_prefetch); memory.swap_prefetch counts other units: not exported


def _swap_export(c: Flat) -> Flat:
    if not c["memory.swap"]:
        return {"swap_config.swap": False}
    layers = list(range(c["memory.swap_layers"] or c["model.n_layers"]))
    if c["memory.swap_ops"] is None:
        return {
            "swap_config.swap": True,
            "swap_config.layer_swap": [{"backward_prefetch": PREFETCH, "layers": list(layers)}],
        }
    return {
        "swap_config.swap": True,
        "swap_config.op_swap": [
            {"op_name": name, "backward_prefetch": PREFETCH, "layers": list(layers)}
            for part in c["memory.swap_ops"]
            for name in OP_NAMES[part]
        ],
    }


def _swap_restore(doc: Flat, core: Flat) -> Flat:
    if not doc["swap_config.swap"]:
        return {"memory.swap": False, "memory.swap_layers": None, "memory.swap_ops": None}
    entries = doc.get("swap_config.layer_swap") or doc.get("swap_config.op_swap") or []
    layers = sorted({i for e in entries for i in e["layers"]})
    if layers != list(range(len(layers))):
        raise ValueError(f"swap_config swaps layers {layers}, not the first k (memory.swap_layers)")
    part_of = {name: part for part, names in OP_NAMES.items() for name in names}
    ops = None if "swap_config.layer_swap" in doc else list(dict.fromkeys(part_of[e["op_name"]] for e in entries))
    count = len(layers) if len(layers) < core["model.n_layers"] else None
    return {"memory.swap": True, "memory.swap_layers": count, "memory.swap_ops": ops}


SWAP = Rule(
    ("memory.swap", "memory.swap_layers", "memory.swap_ops"),
    ("swap_config.swap", "swap_config.layer_swap", "swap_config.op_swap"),
    _swap_export,
    _swap_restore,
)


def _limit_export(c: Flat) -> Flat:
    limit = c["memory.limit_gb"]
    return {} if limit is None else {"context.max_device_memory": f"{limit:g}GB"}  # null: MindSpore's default


LIMIT = Rule(
    ("memory.limit_gb",),
    ("context.max_device_memory",),
    _limit_export,
    lambda doc, core: {"memory.limit_gb": float(doc["context.max_device_memory"].removesuffix("GB"))},
)


# --- precision ---

_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
_MODEL = "model.model_config."


def _precision_export(c: Flat) -> Flat:
    """The core's mixed precision (core.model.precision) in MindFormers' dtype keys: weights cast to compute_dtype
    where used, activations and the residual stream in it, RoPE's tables too (MindFormers' default computes RoPE in
    fp32); norms' statistics, softmax, the MoE router and the parameters in fp32. In bf16 each key is written, the
    defaults too, so that a target whose defaults move still computes as the trial did."""
    compute = _DTYPES[c["training.precision"]]
    if compute == "float32":
        return {_MODEL + "compute_dtype": compute}
    keys = {
        "compute_dtype": compute,
        "rotary_dtype": compute,
        "layernorm_compute_dtype": "float32",
        "softmax_compute_dtype": "float32",
        "params_dtype": "float32",
        "fp32_residual_connection": False,
    }
    if c["model.n_experts"]:
        keys["moe_router_dtype"] = "float32"
    return {_MODEL + k: v for k, v in keys.items()}


PRECISION = Rule(
    ("training.precision",),
    tuple(
        _MODEL + k
        for k in (
            "compute_dtype",
            "rotary_dtype",
            "layernorm_compute_dtype",
            "softmax_compute_dtype",
            "params_dtype",
            "fp32_residual_connection",
            "moe_router_dtype",
        )
    ),
    _precision_export,
    lambda doc, core: {"training.precision": {v: k for k, v in _DTYPES.items()}[doc[_MODEL + "compute_dtype"]]},
)


# --- optimizer and learning rate ---


def _adam_key(c: Flat, name: str) -> str:
    """AdamW's own betas/eps, or those of the AdamW that Muon runs on embeddings, head and 1-D weights."""
    return f"optimizer.{name}" if c["optim.name"] == "adamw" else f"optimizer.adamw_{name}"


BETAS = Rule(
    ("optim.beta1", "optim.beta2"),
    ("optimizer.betas", "optimizer.adamw_betas"),
    lambda c: {_adam_key(c, "betas"): [c["optim.beta1"], c["optim.beta2"]]},
    lambda doc, core: dict(
        zip(("optim.beta1", "optim.beta2"), doc.get("optimizer.betas") or doc["optimizer.adamw_betas"], strict=True)
    ),
)
EPS = Rule(
    ("optim.eps",),
    ("optimizer.eps", "optimizer.adamw_eps"),
    lambda c: {_adam_key(c, "eps"): c["optim.eps"]},
    lambda doc, core: {"optim.eps": doc.get("optimizer.eps", doc.get("optimizer.adamw_eps"))},
)


def muon_only(key: str, path: str) -> Rule:
    """A Muon setting: written under optim.name=muon (under AdamW it has no effect and canonical() resets it)."""
    return Rule(
        (key,),
        (path,),
        lambda c: {path: c[key]} if c["optim.name"] == "muon" else {},
        lambda doc, core: {key: doc[path]},
    )


SCHEDULES = {
    "cosine": "CosineWithWarmUpLR",
    "linear": "PolynomialWithWarmUpLR",
    "wsd": "WarmUpStableDecayLR",
    "constant": "ConstantWarmUpLR",
}

LR_TYPE = Rule(
    ("optim.schedule",),
    ("lr_schedule.type", "lr_schedule.power"),
    lambda c: (
        {"lr_schedule.type": SCHEDULES[c["optim.schedule"]]}
        | ({"lr_schedule.power": 1.0} if c["optim.schedule"] == "linear" else {})
    ),
    lambda doc, core: {"optim.schedule": {v: k for k, v in SCHEDULES.items()}[doc["lr_schedule.type"]]},
)
LR_END = Rule(
    ("optim.min_lr_ratio",),
    ("lr_schedule.lr_end",),
    lambda c: (
        {}
        if c["optim.schedule"] == "constant"
        else {"lr_schedule.lr_end": rounded(c["optim.lr"] * c["optim.min_lr_ratio"])}
    ),
    lambda doc, core: {"optim.min_lr_ratio": rounded(doc["lr_schedule.lr_end"] / doc["lr_schedule.learning_rate"])},
)
DECAY = Rule(
    ("optim.decay_ratio",),
    ("lr_schedule.decay_start_ratio",),
    lambda c: (
        {"lr_schedule.decay_start_ratio": rounded(1.0 - c["optim.decay_ratio"])} if c["optim.schedule"] == "wsd" else {}
    ),
    lambda doc, core: {"optim.decay_ratio": rounded(1.0 - doc["lr_schedule.decay_start_ratio"])},
)


def _clip_export(c: Flat) -> Flat:
    g = c["optim.grad_clip"]
    return {"runner_wrapper.use_clip_grad": g > 0, **({"runner_wrapper.max_grad_norm": g} if g > 0 else {})}


CLIP = Rule(
    ("optim.grad_clip",),
    ("runner_wrapper.use_clip_grad", "runner_wrapper.max_grad_norm"),
    _clip_export,
    lambda doc, core: {
        "optim.grad_clip": doc["runner_wrapper.max_grad_norm"] if doc["runner_wrapper.use_clip_grad"] else 0.0
    },
)


# --- the model: an HF-imported architecture (model=hf:...) is the user's own, so its shape goes with the winner ---
#
# Legacy ``model_config`` / ``moe_config`` spelling (research/deepseek3/deepseek3_671b/pretrain_deepseek3_671b.yaml,
# mindformers/modules/transformer/moe.py MoEConfig, v1.5), which MindFormers 1.6+ still reads: its
# parallel_core/transformer_config_utils.py COMMON_CONFIG_MAPPING maps each of these names onto its TransformerConfig
# (mtp_depth -> mtp_num_layers, expert_num -> num_moe_experts, n_kv_heads -> num_query_groups, theta -> rotary_base,
# ...). ``qk_layernorm`` and ``head_dim`` are the HF/mcore names (configs/qwen3, v1.7), which both read too.

PRESET_MODEL = (
    "the model is the target run's own: the study's preset only sized the search (an HF model, model=hf:..., is "
    "exported with its shape)"
)
MC = "model.model_config."


def hf_only(export):
    """A model rule's export, for an HF-imported model only (a preset's shape is not the user's model)."""

    def wrapped(c: Flat) -> Flat:
        if not str(c["model.name"]).startswith("hf:"):
            raise NoCounterpart(PRESET_MODEL)
        return export(c)

    return wrapped


def model_same(key: str, path: str) -> Rule:
    rule = same(key, MC + path)
    return Rule(rule.keys, rule.paths, hf_only(rule.export), rule.restore)


def _unless_none(key: str, path: str) -> Rule:
    """A model key whose null (derived from the others) is written as absent, and comes back null."""
    return Rule(
        (key,),
        (MC + path,),
        hf_only(lambda c: {} if c[key] is None else {MC + path: c[key]}),
        lambda doc, core: {key: doc.get(MC + path)},
    )


MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
MLA = Rule(
    ("model.attention", *(f"model.{k}" for k in MLA_KEYS)),
    tuple(MC + k for k in MLA_KEYS),
    hf_only(lambda c: {MC + k: c[f"model.{k}"] for k in MLA_KEYS} if c["model.attention"] == "mla" else {}),
    lambda doc, core: {"model.attention": "mla", **{f"model.{k}": doc.get(MC + k) for k in MLA_KEYS}},
)
MTP = Rule(
    ("model.mtp_layers", "model.mtp_loss_weight"),
    (MC + "mtp_depth", MC + "mtp_loss_factor"),
    hf_only(
        lambda c: (
            {MC + "mtp_depth": c["model.mtp_layers"], MC + "mtp_loss_factor": c["model.mtp_loss_weight"]}
            if c["model.mtp_layers"]
            else {}
        )
    ),
    lambda doc, core: {"model.mtp_layers": doc[MC + "mtp_depth"], "model.mtp_loss_weight": doc[MC + "mtp_loss_factor"]},
)

YARN = {"rope_factor": "factor", "rope_beta_fast": "beta_fast", "rope_beta_slow": "beta_slow"}
YARN |= {"rope_mscale_all_dim": "mscale_all_dim", "rope_original_max_len": "original_max_position_embeddings"}
# MindFormers' LLAMA3 (modules/layers.py, FreqsMgr; _check_llama3_scaling_factor wants exactly these four, the factor a
# float and the original length an int)
LLAMA3 = {
    "rope_factor": "factor",
    "rope_low_freq_factor": "low_freq_factor",
    "rope_high_freq_factor": "high_freq_factor",
}
LLAMA3 |= {"rope_original_max_len": "original_max_position_embeddings"}
EXTEND = {"yarn": ("YARN", YARN), "llama3": ("LLAMA3", LLAMA3)}  # the core's rope_scaling -> extend_method, keys


def _rope_export(c: Flat) -> Flat:
    kind = c["model.rope_scaling"]
    if kind == "none":
        return {MC + "extend_method": "None"}
    method, keys = EXTEND[kind]
    factors = {v: c[f"model.{k}"] for k, v in keys.items()}
    factors["factor"] = float(factors["factor"])
    if kind == "yarn":
        factors["mscale"] = _mscale(c)
        if c["model.attention"] == "mla":
            _check_mla_softmax(c, factors["mscale"])
    return {MC + "extend_method": method, MC + "scaling_factor": factors}


def _check_mla_softmax(c: Flat, mscale: float) -> None:
    """MindFormers' MLA (parallel_core, 2.1.0: multi_latent_attention.py) scales its softmax by yarn_mscale(f,
    mscale)^2, where the core (and transformers' DeepSeek-V3) uses yarn_mscale(f, mscale_all_dim)^2, or 1 without
    mscale_all_dim: one ``mscale`` sets both its cos/sin factor and its softmax factor, so a run whose two factors no
    single mscale gives has no counterpart (DeepSeek's configs have mscale = mscale_all_dim: cos and sin unscaled)."""
    f, all_dim = c["model.rope_factor"], c["model.rope_mscale_all_dim"]
    ours = yarn_mscale(f, all_dim) ** 2 if all_dim else 1.0
    theirs = yarn_mscale(f, mscale) ** 2
    if not math.isclose(ours, theirs, rel_tol=1e-9):
        raise NoCounterpart(
            f"MindFormers' MLA scales its softmax by (0.1 mscale ln factor + 1)^2 with the mscale that also sets its "
            f"cos and sin: for this run's cos/sin factor that is {theirs:.4g}, the core's softmax factor is "
            f"{ours:.4g}; set model.rope_attention_factor=1 and model.rope_mscale_all_dim to the mscale wanted "
            "(DeepSeek's convention) for a run MindFormers reproduces"
        )


def _mscale(c: Flat) -> float:
    """MindFormers' YaRN ``mscale`` under which its cos and sin carry the core's factor: its table scales them by
    yarn_mscale(f, mscale) / yarn_mscale(f, mscale_all_dim) (``FreqsMgr``; checked against it in
    tests/unit/autoresearch/export/test_mindformers_client.py), the core by rope_attention_factor, else
    yarn_mscale(f) (``core.model.layers.rope_frequencies``). For a DeepSeek config read from Hugging Face the core's
    factor is that same ratio, so this gives back the config's own mscale. The softmax's factor is the model code's:
    yarn_mscale(f, mscale_all_dim)^2 in transformers' DeepSeek-V3 and the core, yarn_mscale(f, mscale)^2 in
    MindFormers' parallel_core MLA; the two agree when mscale = mscale_all_dim, as in DeepSeek-V3's config
    (``_check_mla_softmax`` refuses an MLA run where they do not)."""
    f = c["model.rope_factor"]
    if f <= 1:
        return 1.0  # no scaling: every factor is 1
    target = c["model.rope_attention_factor"] or yarn_mscale(f)
    return (target * yarn_mscale(f, c["model.rope_mscale_all_dim"]) - 1) / (0.1 * math.log(f))


def _rope_restore(doc: Flat, core: Flat) -> Flat:
    method = doc[MC + "extend_method"]
    if method == "None":
        return {"model.rope_scaling": "none"}
    kind, keys = next((k, keys) for k, (m, keys) in EXTEND.items() if m == method)
    out = {"model.rope_scaling": kind, **{f"model.{k}": doc[f"{MC}scaling_factor.{v}"] for k, v in keys.items()}}
    if kind == "yarn":
        f, all_dim = out["model.rope_factor"], out["model.rope_mscale_all_dim"]
        factor = yarn_mscale(f, doc[MC + "scaling_factor.mscale"]) / yarn_mscale(f, all_dim)
        out["model.rope_attention_factor"] = None if math.isclose(factor, yarn_mscale(f)) else factor
    return out


ROPE = Rule(
    ("model.rope_scaling", *(f"model.{k}" for k in YARN | LLAMA3), "model.rope_attention_factor"),
    (MC + "extend_method", MC + "scaling_factor"),
    hf_only(_rope_export),
    _rope_restore,
)

# core key -> moe_config key (written when the model has experts)
MOE_KEYS = {
    "n_experts": "expert_num",
    "moe_top_k": "num_experts_chosen",
    "moe_shared_experts": "shared_expert_num",
    "moe_ffn_hidden": "moe_intermediate_size",
    "moe_dense_layers": "first_k_dense_replace",
    "moe_groups": "n_group",
    "moe_topk_groups": "topk_group",
    "moe_routed_scale": "routed_scaling_factor",
    "moe_norm_topk": "norm_topk_prob",
    "moe_score_bias": "balance_via_topk_bias",
    "moe_bias_update_rate": "topk_bias_update_rate",
    "moe_aux_loss_weight": "aux_loss_factor",
    "moe_capacity_factor": "capacity_factor",
}


def _moe_export(c: Flat) -> Flat:
    if not c["model.n_experts"]:
        return {}
    out = {f"moe_config.{v}": c[f"model.{k}"] for k, v in MOE_KEYS.items() if c[f"model.{k}"] is not None}
    return out | {"moe_config.use_gating_sigmoid": c["model.moe_router"] == "sigmoid"}


def _moe_restore(doc: Flat, core: Flat) -> Flat:
    out = {f"model.{k}": doc.get(f"moe_config.{v}") for k, v in MOE_KEYS.items()}
    return out | {"model.moe_router": "sigmoid" if doc["moe_config.use_gating_sigmoid"] else "softmax"}


MOE = Rule(
    (*(f"model.{k}" for k in MOE_KEYS), "model.moe_router"),
    (*(f"moe_config.{v}" for v in MOE_KEYS.values()), "moe_config.use_gating_sigmoid"),
    hf_only(_moe_export),
    _moe_restore,
)

# verified in MindFormers 2.1.0: modules/transformer/moe.py (_check_aux_loss_config), parallel_core/transformer_config.py
SEQUENCE_AUX = NoCounterpart(
    "MindFormers' YAML moe_config (MoEConfig, aux_loss_types expert|device|comm) has no sequence-wise balance loss; "
    "its parallel_core models spell DeepSeek-V3's as moe_router_load_balancing_type: seq_aux_loss, in another "
    "config schema: set it there"
)


def _sequence_aux_export(c: Flat) -> Flat:
    if c["model.moe_aux_per_sequence"]:
        raise SEQUENCE_AUX
    return {}  # the batch-wise loss: moe_config's aux_loss_factor (MOE)


SEQUENCE_AUX_RULE = Rule(
    ("model.moe_aux_per_sequence",),
    (),
    hf_only(_sequence_aux_export),
    lambda doc, core: {"model.moe_aux_per_sequence": False},
)

MODEL_RULES = (
    model_same("model.vocab_size", "vocab_size"),
    model_same("model.d_model", "hidden_size"),
    model_same("model.n_layers", "num_layers"),
    model_same("model.n_heads", "num_heads"),
    model_same("model.n_kv_heads", "n_kv_heads"),
    _unless_none("model.head_dim", "head_dim"),
    model_same("model.ffn_hidden", "intermediate_size"),
    model_same("model.max_seq_len", "max_position_embeddings"),
    model_same("model.norm_eps", "rms_norm_eps"),
    model_same("model.rope_theta", "theta"),
    model_same("model.qk_norm", "qk_layernorm"),
    MLA,
    ROPE,
    MOE,
    SEQUENCE_AUX_RULE,
    MTP,
)


GRAPH_ONLY = (
    "MindFormers' YAML trainer runs in GRAPH_MODE only (configuration.md: context.mode); its PyNative "
    "trainer takes another config"
)
ASCEND_ONLY = "MindFormers runs on Ascend only (configuration.md: context.device_target)"

MINDFORMERS = Target(
    name="mindformers",
    title="MindFormers YAML fragment: merge these keys into your run's YAML",
    rules=(
        DP,
        same("parallel.tp", "parallel_config.model_parallel"),
        same("parallel.pp", "parallel_config.pipeline_stage"),
        same("parallel.cp", "parallel_config.context_parallel"),
        same("parallel.ep", "parallel_config.expert_parallel"),
        same("parallel.sp", "parallel_config.use_seq_parallel"),
        SCHEDULE,
        transpose_rule("MindFormers"),
        OFFSET,
        BATCH,
        same("training.seq_len", "model.model_config.seq_length"),
        RECOMPUTE,
        SWAP,
        LIMIT,
        same("optim.name", "optimizer.type", {"adamw": "AdamW", "muon": "Muon"}),
        same("optim.lr", "lr_schedule.learning_rate"),
        same("optim.weight_decay", "optimizer.weight_decay"),
        BETAS,
        EPS,
        muon_only("optim.momentum", "optimizer.momentum"),
        muon_only("optim.ns_steps", "optimizer.ns_steps"),
        same("optim.warmup_steps", "lr_schedule.warmup_steps"),
        LR_TYPE,
        LR_END,
        DECAY,
        CLIP,
        *MODEL_RULES,
        same("training.mode", "context.mode", {"jit": 0, "pynative": NoCounterpart(GRAPH_ONLY)}),  # 0: GRAPH_MODE
        same("execution.jit_level", "context.jit_config.jit_level"),
        same("execution.graph_kernel_fusion", "context.enable_graph_kernel"),
        PRECISION,
        same("seed", "seed"),
        same(
            "device",
            "context.device_target",
            {"Ascend": "Ascend", "CPU": NoCounterpart(ASCEND_ONLY), "GPU": NoCounterpart(ASCEND_ONLY)},
        ),
    ),
    unmapped={
        "model": "the model's other settings are the target run's own (model.model_config); a preset's whole shape "
        "too: the study's preset only sized the search",
        "model.name": "where the shapes came from (hf:<dir>): the target run names its own model",
        "data": "the trial's data; the target names its own train_dataset",
        "trial": "the trial's budget and directory; the run's length is the target's own (runner_config.epochs)",
        "checkpoint": "the trial's checkpoints; the target configures its own CheckpointMonitor",
        "parallel.etp": "the fragment's parallel_config has no expert tensor-parallel key (MindFormers' parallel_core "
        "reads expert_tensor_parallel_size); a trial's experts split by tp (etp = tp: the layout core.train runs)",
        "parallel.dp_shard_strategy": "a trial's dp_shard (its weights sharded too under optim_grads_params, only "
        "the masters and states under optim) is written as MindFormers' optimizer parallel over "
        "optimizer_weight_shard_size ranks, which shards the weights and states",
        "cluster": "the cluster the step-time model planned for (core.perf); the run uses the devices it is launched "
        "on",
        "memory.recompute_modules": "Megatron-LM's --recompute-modules, which the step-time model plans with (never "
        "a trial's: core.train refuses it); MindFormers' select_recompute names its own ops",
        "memory.swap_prefetch": "counts blocks loaded ahead in the core; MindFormers' backward_prefetch counts its "
        "own scheduling steps (written as its default, 1): tune it on the device",
        "execution.capture_mode": "how mindspore.jit turns the core's Python into a graph; MindFormers compiles "
        "its Cells itself",
        "execution.kernel_threads": "the core's CPU kernel thread pool; no MindFormers setting",
        "execution.dispatch_threads": "the core's runtime thread count on CPU; no MindFormers setting",
        "execution.host_pipeline": "the core's CPU workaround for MindSpore's spinning host queues; MindFormers "
        "keeps MindSpore's default",
        "execution.cpu_kernels": "the core's fused CPU kernels for its clipping norm and AdamW update; MindFormers "
        "uses MindSpore's optimizer kernels",
        "execution.eval_mode": TRIAL_ONLY,
        "execution.compile_cache": TRIAL_ONLY,
        "execution.compile_cache_dir": TRIAL_ONLY,
        "training.log_interval": TRIAL_ONLY,
        "training.eval_interval": TRIAL_ONLY,
        "training.eval_batches": TRIAL_ONLY,
        "training.profile": TRIAL_ONLY,
        "training.health_interval": "per-block norms in the trial's metrics.jsonl; the run monitors itself "
        "(MindFormers' monitor_config, local_norm)",
        "training.max_attention_logit": "the trial's early stop on exploding attention logits; the run sets its own "
        "check (MindFormers' MaxLogits monitoring)",
    },
)
