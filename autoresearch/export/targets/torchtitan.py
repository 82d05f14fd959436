"""The core's config as the fields of a torchtitan 0.3.0 recipe (a ``Trainer.Config``), for PyTorch runs of the
same layout; ``autoresearch.export.recipe`` writes them as a Python module torchtitan loads with ``--module``
and ``--config``.

torchtitan 0.3.0 reads no TOML (0.2.2 was the last release that did): a run is a zero-argument function returning
``torchtitan.trainer.Trainer.Config``. The target's keys are that object's attribute paths, flat and dotted, from
pytorch/torchtitan 0.3.0:

- torchtitan/config/configs.py: ``parallelism`` data_parallel_replicate_degree, data_parallel_shard_degree (HSDP
  when both > 1), tensor_parallel_degree, enable_sequence_parallel (SequenceParallel on the norms, default on),
  pipeline_parallel_degree (ranks, not stages), pipeline_parallel_schedule (torch.distributed.pipelining's names:
  GPipe, 1F1B, Interleaved1F1B), module_fqns_per_model_part (the modules of each stage, in stage order: the first
  starts with tok_embeddings, the last ends with norm and lm_head; stages per rank follow from their number),
  pipeline_parallel_microbatch_size, context_parallel_degree, expert_parallel_degree (experts over ranks borrowed
  from dp_shard * cp * tp; see below); ``training`` local_batch_size, global_batch_size (gradient accumulation
  = global / (local * dp)), seq_len, max_norm, disable_cuda_graphs; ``compile.enable``; ``debug.seed``.
- torchtitan/distributed/activation_checkpoint.py: ``activation_checkpoint`` is a policy object, None (off),
  SelectiveAC.Config() (per op: saves attention, collectives and every second matmul, recomputes the rest) or
  FullAC.Config() (whole blocks); the flat key holds none, selective or full and the recipe writer builds the object.
- torchtitan/components/optimizer/: ``optimizer`` (OptimizersContainer.Config: param groups, each an optimizer
  name and its kwargs; ``default_adamw`` gives one AdamW group over every parameter: the flat keys optimizer.lr,
  .betas, .eps and .weight_decay are its kwargs) and ``lr_scheduler`` (LRSchedulersContainer.Config: warmup_steps,
  decay_type linear|sqrt|cosine, min_lr_factor (a ratio of lr), decay_ratio: WSD's final share of the steps that
  decays; None: decay right after warmup).
- torchtitan/trainer.py (Trainer.Config.__post_init__): CUDA graphs, on by default, reject pipeline parallelism,
  so a recipe with pp > 1 sets training.disable_cuda_graphs; with a pipeline local_batch_size must be a multiple of
  the micro-batch. torchtitan/distributed/pipeline_parallel.py: an interleaved schedule needs two or more stages
  per rank.

Approximations, by design: torchtitan's SelectiveAC recomputes every second matmul and the element-wise ops, where
the core's selective recomputes norms, SwiGLU and the attention softmax (``memory.recompute=selective_op``, which
core.perf estimates and the core does not train, is SelectiveAC itself, and reads back as selective).
``default_adamw`` decays every parameter; the core's AdamW spares 1-D weights (norm gains). Expert parallelism
carries its degree, not its placement: torchtitan's expert mesh is (dp_replicate, efsdp, ep) with ep innermost and
efsdp = dp_shard * cp * tp / ep (torchtitan/distributed/parallel_dims.py), so with tp > 1 its expert ranks include
tensor-parallel ranks, where the core puts the experts on the dp_shard ranks and splits each over tp.
"""

from __future__ import annotations

import itertools
import math
import re

from autoresearch.export.targets.rules import (
    DEFAULTS,
    TRIAL_ONLY,
    Flat,
    NoCounterpart,
    Rule,
    Target,
    no_mpipe,
    same,
    split_spelling,
    stage_split,
    transpose_rule,
)

# --- pipeline: ranks (and CUDA graphs off), schedule, the modules of each stage ---


def _pp_export(c: Flat) -> Flat:
    """A pipeline turns CUDA graphs off (Trainer.Config rejects them with pp > 1); without one the base decides."""
    pp = c["parallel.pp"]
    return {"parallelism.pipeline_parallel_degree": pp, **({"training.disable_cuda_graphs": True} if pp > 1 else {})}


PP = Rule(
    ("parallel.pp",),
    ("parallelism.pipeline_parallel_degree", "training.disable_cuda_graphs"),
    _pp_export,
    lambda doc, core: {"parallel.pp": doc["parallelism.pipeline_parallel_degree"]},
)

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}


def _schedule_export(c: Flat) -> Flat:
    s = c["parallel.pp_schedule"]
    if s == "mpipe":
        no_mpipe("torchtitan")
    if s == "interleaved" and c["parallel.pp"] > 1 and c["parallel.pp_virtual"] == 1:
        raise NoCounterpart(
            "torchtitan's Interleaved1F1B needs two or more stages per rank (parallel.pp_virtual=1 here; "
            "torchtitan/distributed/pipeline_parallel.py rejects it)"
        )
    return {"parallelism.pipeline_parallel_schedule": SCHEDULES[s]}


PP_SCHEDULE = Rule(
    ("parallel.pp_schedule",),
    ("parallelism.pipeline_parallel_schedule",),
    _schedule_export,
    lambda doc, core: {
        "parallel.pp_schedule": {v: k for k, v in SCHEDULES.items()}[doc["parallelism.pipeline_parallel_schedule"]]
    },
)

FIRST, LAST = ["tok_embeddings"], ["norm", "lm_head"]  # torchtitan's decoder modules outside the blocks
LAYER = re.compile(r"layers\.\d+")


def model_parts(split: list[int]) -> list[list[str]]:
    """The modules of each stage for layers per stage, as torchtitan names them (its own even split,
    _generate_llm_fqn_per_model_part, names them so)."""
    bounds = [0, *itertools.accumulate(split)]
    parts = [[f"layers.{i}" for i in range(a, b)] for a, b in itertools.pairwise(bounds)]
    parts[0] = FIRST + parts[0]
    parts[-1] = parts[-1] + LAST
    return parts


def part_layers(parts: list[list[str]]) -> list[int]:
    """Layers per stage of module_fqns_per_model_part; only the core's shape of it (every block once, in order,
    the embedding first and the head last) has a core spelling."""
    split = [sum(1 for m in part if LAYER.fullmatch(m)) for part in parts]
    if [list(part) for part in parts] != model_parts(split):
        raise ValueError(f"module_fqns_per_model_part {parts} is not the blocks in order between embedding and head")
    return split


def _split_export(c: Flat) -> Flat:
    """One stage has nothing to split: None (torchtitan's own split, unused without a pipeline)."""
    split = stage_split(c)
    return {"parallelism.module_fqns_per_model_part": model_parts(split) if len(split) > 1 else None}


def _split_restore(doc: Flat, core: Flat) -> Flat:
    parts = doc["parallelism.module_fqns_per_model_part"]
    if parts is None:
        return {"parallel.pp_layers": None, "parallel.pp_offset": 0, "parallel.pp_virtual": 1}
    layers, offset = split_spelling(part_layers(parts), core["model.n_layers"])
    return {
        "parallel.pp_layers": layers,
        "parallel.pp_offset": offset,
        "parallel.pp_virtual": len(parts) // doc["parallelism.pipeline_parallel_degree"],
    }


SPLIT = Rule(
    ("parallel.pp_layers", "parallel.pp_offset", "parallel.pp_virtual"),
    ("parallelism.module_fqns_per_model_part",),
    _split_export,
    _split_restore,
)


# --- batch: without a pipeline a rank's batch is one micro-batch; with one, all of its micro-batches ---


def _batch_export(c: Flat) -> Flat:
    """Without a pipeline torchtitan accumulates local batches up to the global batch; with one, a rank's batch is
    all of its micro-batches and the pipeline splits it."""
    gbs, mbs = c["training.global_batch_size"], c["training.micro_batch_size"]
    if c["parallel.pp"] == 1:
        return {"training.global_batch_size": gbs, "training.local_batch_size": mbs}
    dp = c["parallel.dp_replicate"] * c["parallel.dp_shard"]
    return {
        "training.global_batch_size": gbs,
        "training.local_batch_size": gbs // dp,
        "parallelism.pipeline_parallel_microbatch_size": mbs,
    }


def _batch_restore(doc: Flat, core: Flat) -> Flat:
    piped = doc["parallelism.pipeline_parallel_degree"] > 1
    mbs = doc["parallelism.pipeline_parallel_microbatch_size"] if piped else doc["training.local_batch_size"]
    return {"training.global_batch_size": doc["training.global_batch_size"], "training.micro_batch_size": mbs}


BATCH = Rule(
    ("training.global_batch_size", "training.micro_batch_size"),
    ("training.global_batch_size", "training.local_batch_size", "parallelism.pipeline_parallel_microbatch_size"),
    _batch_export,
    _batch_restore,
)


# --- recompute: one policy for every block ---


def _recompute_export(c: Flat) -> Flat:
    """The mode by name (none is written too: torchtitan's own default is selective)."""
    if c["memory.recompute_stages"] is not None:
        raise NoCounterpart(
            "torchtitan's activation_checkpoint applies one policy to every block; "
            f"memory.recompute_stages={c['memory.recompute_stages']} differs per stage"
        )
    for key in ("memory.recompute_layers", "memory.recompute_stage_layers"):
        if c[key] is not None:
            raise NoCounterpart(
                "torchtitan's activation_checkpoint policy wraps every block (ActivationCheckpointing.apply), not the "
                f"first {c[key]} of each stage ({key})"
            )
    mode = c["memory.recompute"]  # selective_op is torchtitan's SelectiveAC itself, read back as the core's nearest
    return {"activation_checkpoint": "selective" if mode == "selective_op" else mode}


RECOMPUTE = Rule(
    ("memory.recompute", "memory.recompute_layers", "memory.recompute_stages", "memory.recompute_stage_layers"),
    ("activation_checkpoint",),
    _recompute_export,
    lambda doc, core: {
        "memory.recompute": doc["activation_checkpoint"],
        "memory.recompute_layers": None,
        "memory.recompute_stages": None,
        "memory.recompute_stage_layers": None,
    },
)


# --- optimizer and learning rate ---

DIST_MUON = (
    "torchtitan's Muon (DistMuon, torchtitan/distributed/flex_shard/dist_muon.py) takes per-model compute layouts "
    "and bucket configs (optimizer.optimizer_factory_kwargs_by_name) that the core's config does not give"
)
NO_MUON = (
    f"the study ran Muon; {DIST_MUON}, and an AdamW at Muon's lr, betas, eps and weight decay is not the tuned one"
)
MUON_ONLY = f"a Muon setting, and a recipe carries AdamW only: {DIST_MUON}"
OPTIM_KEYS = ("optim.name", "optim.lr", "optim.beta1", "optim.beta2", "optim.eps", "optim.weight_decay")


def _optimizer_export(c: Flat) -> Flat:
    """AdamW's kwargs for ``default_adamw``; Muon's settings, all of them, are listed instead."""
    if c["optim.name"] == "muon":
        raise NoCounterpart(NO_MUON)
    return {
        "optimizer.lr": c["optim.lr"],
        "optimizer.betas": (c["optim.beta1"], c["optim.beta2"]),
        "optimizer.eps": c["optim.eps"],
        "optimizer.weight_decay": c["optim.weight_decay"],
    }


def _optimizer_restore(doc: Flat, core: Flat) -> Flat:
    beta1, beta2 = doc["optimizer.betas"]
    return {
        "optim.name": "adamw",
        "optim.lr": doc["optimizer.lr"],
        "optim.beta1": beta1,
        "optim.beta2": beta2,
        "optim.eps": doc["optimizer.eps"],
        "optim.weight_decay": doc["optimizer.weight_decay"],
    }


OPTIMIZER = Rule(
    OPTIM_KEYS,
    ("optimizer.lr", "optimizer.betas", "optimizer.eps", "optimizer.weight_decay"),
    _optimizer_export,
    _optimizer_restore,
)


def _schedule_export(c: Flat) -> Flat:
    """The core's decays as torchtitan's: WSD is linear with a decay_ratio; constant is a floor of 1.0. The
    decay_ratio is written even when None, so that a base recipe's WSD does not stay on."""
    s = c["optim.schedule"]
    if s == "constant":
        return {
            "lr_scheduler.decay_type": "linear",
            "lr_scheduler.min_lr_factor": 1.0,
            "lr_scheduler.decay_ratio": None,
        }
    return {
        "lr_scheduler.decay_type": "linear" if s == "wsd" else s,
        "lr_scheduler.min_lr_factor": c["optim.min_lr_ratio"],
        "lr_scheduler.decay_ratio": c["optim.decay_ratio"] if s == "wsd" else None,
    }


def _schedule_restore(doc: Flat, core: Flat) -> Flat:
    kind, floor, decay = (doc[f"lr_scheduler.{k}"] for k in ("decay_type", "min_lr_factor", "decay_ratio"))
    if kind not in ("linear", "cosine") or (decay is not None and kind != "linear"):
        raise ValueError(f"lr_scheduler decay_type={kind!r} with decay_ratio={decay} has no core schedule")
    if decay is not None:
        schedule = "wsd"
    elif floor == 1.0:
        schedule, floor = "constant", DEFAULTS["optim.min_lr_ratio"]
    else:
        schedule = kind
    return {
        "optim.schedule": schedule,
        "optim.min_lr_ratio": floor,
        "optim.decay_ratio": DEFAULTS["optim.decay_ratio"] if decay is None else decay,
    }


SCHEDULE = Rule(
    ("optim.schedule", "optim.min_lr_ratio", "optim.decay_ratio"),
    ("lr_scheduler.decay_type", "lr_scheduler.min_lr_factor", "lr_scheduler.decay_ratio"),
    _schedule_export,
    _schedule_restore,
)

CLIP = Rule(
    ("optim.grad_clip",),
    ("training.max_norm",),
    lambda c: {"training.max_norm": c["optim.grad_clip"] or math.inf},  # inf: clipping never scales
    lambda doc, core: {"optim.grad_clip": 0.0 if math.isinf(doc["training.max_norm"]) else doc["training.max_norm"]},
)

NO_SWAP = "torchtitan has no activation offload (training.enable_cpu_offload moves FSDP parameters, not activations)"
MINDSPORE_ONLY = "a MindSpore compiler/runtime setting; PyTorch has no counterpart"
PLANNED_ONLY = "the cluster the step-time model planned for (core.perf); a run uses the devices it is launched on"

TORCHTITAN = Target(
    name="torchtitan",
    title=(
        "torchtitan 0.3.0 recipe (a Trainer.Config): torchrun ... -m torchtitan.train --module <this file's name, "
        "no .py> --config tuned"
    ),
    rules=(
        same("parallel.dp_replicate", "parallelism.data_parallel_replicate_degree"),
        same("parallel.dp_shard", "parallelism.data_parallel_shard_degree"),
        same("parallel.tp", "parallelism.tensor_parallel_degree"),
        same("parallel.sp", "parallelism.enable_sequence_parallel"),
        PP,
        same("parallel.cp", "parallelism.context_parallel_degree"),
        same("parallel.ep", "parallelism.expert_parallel_degree"),
        PP_SCHEDULE,
        transpose_rule("torchtitan"),
        SPLIT,
        BATCH,
        same("training.seq_len", "training.seq_len"),
        RECOMPUTE,
        same("training.mode", "compile.enable", {"jit": True, "pynative": False}),  # compiled vs eager steps
        # bf16: FSDP's (or autocast's) bf16 compute copies, fp32 master weights and reductions, as the core counts it
        same("training.precision", "training.mixed_precision_param", {"fp32": "float32", "bf16": "bfloat16"}),
        OPTIMIZER,
        same("optim.warmup_steps", "lr_scheduler.warmup_steps"),
        SCHEDULE,
        CLIP,
        same("seed", "debug.seed"),
    ),
    unmapped={
        "model": (
            "the model is the base recipe's model_spec (BASE in the recipe, or the --module/--config it comes "
            "from); the study's preset only sized the search"
        ),
        "data": "the trial's data; the base recipe names its own dataloader.dataset and tokenizer",
        "trial": "the trial's budget and directory; the run's length is the base recipe's training.steps",
        "checkpoint": "the trial's checkpoints; the base recipe configures its own checkpoint (CheckpointManager)",
        "cluster": PLANNED_ONLY,
        "parallel.etp": (
            "no setting: torchtitan 0.3.0 keeps each expert whole, its expert ranks borrowed from FSDP and TP (efsdp "
            "= dp_shard * cp * tp / ep); a trial's experts split by tp (etp = tp: the layout core.train runs)"
        ),
        "parallel.dp_shard_strategy": (
            "torchtitan's data_parallel_shard_degree is FSDP2 (ZeRO-3), a trial's dp_shard under optim_grads_params; "
            "it has no ZeRO-1 setting, so a trial's optim (ZeRO-1) is written as FSDP over the same ranks"
        ),
        "memory.recompute_modules": (
            "Megatron-LM's --recompute-modules, which the step-time model plans with (never a trial's: core.train "
            "refuses it); torchtitan's activation_checkpoint names no modules"
        ),
        "memory.swap": NO_SWAP,
        "memory.swap_layers": NO_SWAP,
        "memory.swap_ops": NO_SWAP,
        "memory.swap_prefetch": NO_SWAP,
        "memory.limit_gb": "torchtitan has no per-rank memory budget setting",
        "optim.momentum": MUON_ONLY,
        "optim.ns_steps": MUON_ONLY,
        "execution.jit_level": MINDSPORE_ONLY,
        "execution.capture_mode": MINDSPORE_ONLY,
        "execution.graph_kernel_fusion": MINDSPORE_ONLY,
        "execution.kernel_threads": MINDSPORE_ONLY,
        "execution.dispatch_threads": MINDSPORE_ONLY,
        "execution.host_pipeline": MINDSPORE_ONLY,
        "execution.cpu_kernels": "the core's fused CPU kernels for MindSpore; torchtitan's fused AdamW is its own",
        "execution.eval_mode": TRIAL_ONLY,
        "execution.compile_cache": TRIAL_ONLY,
        "execution.compile_cache_dir": TRIAL_ONLY,
        "device": "torchtitan runs on the accelerator PyTorch finds",
        "training.log_interval": TRIAL_ONLY,
        "training.eval_interval": TRIAL_ONLY,
        "training.eval_batches": TRIAL_ONLY,
        "training.profile": TRIAL_ONLY,
        "training.health_interval": "per-block norms in the trial's metrics.jsonl; the run logs its own metrics",
        "training.max_attention_logit": "the trial's early stop on exploding attention logits; no torchtitan "
        "counterpart",
    },
)
