"""The core's config as a torchtitan TOML fragment (``--job.config_file``), for PyTorch runs of the same layout.

Key names as torchtitan spells them, from torchtitan/config/job_config.py (pytorch/torchtitan, the TOML-era
``JobConfig``): ``[parallelism]`` data_parallel_replicate_degree, data_parallel_shard_degree (HSDP when both > 1),
tensor_parallel_degree, pipeline_parallel_degree, pipeline_parallel_schedule (torch.distributed.pipelining's
names: GPipe, 1F1B, Interleaved1F1B), pipeline_parallel_split_points (module names where a stage starts, one
fewer than the stages, so stages per rank follow), pipeline_parallel_microbatch_size, context_parallel_degree,
expert_parallel_degree ("dp2ep": experts over the FSDP ranks, as in the core); ``[activation_checkpoint]`` mode
none|selective|full with selective_ac_option ("op": per-op, save matmuls, recompute the rest; an integer means every
n-th block); ``[training]`` local_batch_size, global_batch_size (gradient accumulation = global / (local * dp)),
seq_len, max_norm, compile, seed; ``[optimizer]`` name, lr, beta1, beta2, eps, weight_decay; ``[lr_scheduler]``
warmup_steps, decay_type linear|sqrt|cosine, lr_min (a ratio of lr), decay_ratio (WSD: the final share of steps
that decays; unset: decay right after warmup). torchtitan/components/optimizer.py builds Adam and AdamW only.
torchtitan's tensor parallel shards the norms along the sequence (SequenceParallel) whenever tp > 1
(models/llama3 parallelize: apply_tp), so the core's ``parallel.sp`` is implied by tp there.
"""

from __future__ import annotations

import itertools
import math

from autoresearch.export.targets.rules import (
    DEFAULTS,
    TRIAL_ONLY,
    Flat,
    NoCounterpart,
    Rule,
    Target,
    same,
    split_spelling,
    stage_split,
)


def _sp_export(c: Flat) -> Flat:
    if c["parallel.tp"] > 1 and not c["parallel.sp"]:
        raise NoCounterpart(
            "torchtitan's tensor parallel always shards the norms along the sequence "
            "(SequenceParallel); it cannot run tp > 1 without it"
        )
    return {}


SP = Rule(
    ("parallel.sp",), (), _sp_export, lambda doc, core: {"parallel.sp": doc["parallelism.tensor_parallel_degree"] > 1}
)


def _split_export(c: Flat) -> Flat:
    split = stage_split(c)
    starts = [sum(split[:i]) for i in range(1, len(split))]
    return {"parallelism.pipeline_parallel_split_points": [f"layers.{i}" for i in starts]}


def _split_restore(doc: Flat, core: Flat) -> Flat:
    starts = [int(p.removeprefix("layers.")) for p in doc["parallelism.pipeline_parallel_split_points"]]
    n = core["model.n_layers"]
    bounds = [0, *starts, n]
    layers, offset = split_spelling([b - a for a, b in itertools.pairwise(bounds)], n)
    return {
        "parallel.pp_layers": layers,
        "parallel.pp_offset": offset,
        "parallel.pp_virtual": (len(bounds) - 1) // doc["parallelism.pipeline_parallel_degree"],
    }


SPLIT = Rule(
    ("parallel.pp_layers", "parallel.pp_offset", "parallel.pp_virtual"),
    ("parallelism.pipeline_parallel_split_points",),
    _split_export,
    _split_restore,
)


def _batch_export(c: Flat) -> Flat:
    """Without a pipeline a rank's batch is one micro-batch and torchtitan accumulates up to the global batch;
    with one, a rank's batch is all of its micro-batches and the pipeline splits it."""
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


def _recompute_export(c: Flat) -> Flat:
    if c["memory.recompute_stages"] is not None:
        raise NoCounterpart(
            "torchtitan's [activation_checkpoint] applies one mode to every block; "
            f"memory.recompute_stages={c['memory.recompute_stages']} differs per stage"
        )
    if c["memory.recompute_layers"] is not None:
        raise NoCounterpart(
            "torchtitan's selective_ac_option=<int> recomputes every n-th block, not the first "
            f"{c['memory.recompute_layers']} (memory.recompute_layers)"
        )
    mode = c["memory.recompute"]
    return {
        "activation_checkpoint.mode": mode,
        **({"activation_checkpoint.selective_ac_option": "op"} if mode == "selective" else {}),
    }


RECOMPUTE = Rule(
    ("memory.recompute", "memory.recompute_layers", "memory.recompute_stages"),
    ("activation_checkpoint.mode", "activation_checkpoint.selective_ac_option"),
    _recompute_export,
    lambda doc, core: {
        "memory.recompute": doc["activation_checkpoint.mode"],
        "memory.recompute_layers": None,
        "memory.recompute_stages": None,
    },
)


def _schedule_export(c: Flat) -> Flat:
    """The core's decays as torchtitan's: WSD is linear with a decay_ratio; constant is a floor of 1.0."""
    s = c["optim.schedule"]
    if s == "constant":
        return {"lr_scheduler.decay_type": "linear", "lr_scheduler.lr_min": 1.0}
    out = {"lr_scheduler.decay_type": "linear" if s == "wsd" else s, "lr_scheduler.lr_min": c["optim.min_lr_ratio"]}
    return out | ({"lr_scheduler.decay_ratio": c["optim.decay_ratio"]} if s == "wsd" else {})


def _schedule_restore(doc: Flat, core: Flat) -> Flat:
    floor, decay = doc["lr_scheduler.lr_min"], doc.get("lr_scheduler.decay_ratio")
    if decay is not None:
        schedule = "wsd"
    elif floor == 1.0:
        schedule, floor = "constant", DEFAULTS["optim.min_lr_ratio"]
    else:
        schedule = doc["lr_scheduler.decay_type"]
    return {
        "optim.schedule": schedule,
        "optim.min_lr_ratio": floor,
        "optim.decay_ratio": DEFAULTS["optim.decay_ratio"] if decay is None else decay,
    }


SCHEDULE = Rule(
    ("optim.schedule", "optim.min_lr_ratio", "optim.decay_ratio"),
    ("lr_scheduler.decay_type", "lr_scheduler.lr_min", "lr_scheduler.decay_ratio"),
    _schedule_export,
    _schedule_restore,
)

CLIP = Rule(
    ("optim.grad_clip",),
    ("training.max_norm",),
    lambda c: {"training.max_norm": c["optim.grad_clip"] or math.inf},  # inf: clipping never scales
    lambda doc, core: {"optim.grad_clip": 0.0 if math.isinf(doc["training.max_norm"]) else doc["training.max_norm"]},
)

NO_MUON = "torchtitan's [optimizer] builds Adam and AdamW only (torchtitan/components/optimizer.py)"
NO_SWAP = "torchtitan has no activation offload (training.enable_cpu_offload moves FSDP parameters, not activations)"
MINDSPORE_ONLY = "a MindSpore compiler/runtime setting; PyTorch has no counterpart"

TORCHTITAN = Target(
    name="torchtitan",
    title="torchtitan TOML fragment: merge these tables into your job's --job.config_file",
    rules=(
        same("parallel.dp_replicate", "parallelism.data_parallel_replicate_degree"),
        same("parallel.dp_shard", "parallelism.data_parallel_shard_degree"),
        same("parallel.tp", "parallelism.tensor_parallel_degree"),
        same("parallel.pp", "parallelism.pipeline_parallel_degree"),
        same("parallel.cp", "parallelism.context_parallel_degree"),
        same("parallel.ep", "parallelism.expert_parallel_degree"),
        SP,
        same(
            "parallel.pp_schedule",
            "parallelism.pipeline_parallel_schedule",
            {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"},
        ),
        SPLIT,
        BATCH,
        same("training.seq_len", "training.seq_len"),
        RECOMPUTE,
        same("training.mode", "training.compile", {"jit": True, "pynative": False}),  # compiled vs eager steps
        same("optim.name", "optimizer.name", {"adamw": "AdamW", "muon": NoCounterpart(NO_MUON)}),
        same("optim.lr", "optimizer.lr"),
        same("optim.beta1", "optimizer.beta1"),
        same("optim.beta2", "optimizer.beta2"),
        same("optim.eps", "optimizer.eps"),
        same("optim.weight_decay", "optimizer.weight_decay"),
        same("optim.warmup_steps", "lr_scheduler.warmup_steps"),
        SCHEDULE,
        CLIP,
        same("seed", "training.seed"),
    ),
    unmapped={
        "model": "the model is the target run's own ([model] name/flavor); the study's preset only sized the search",
        "data": "the trial's data; the target names its own training.dataset",
        "trial": "the trial's budget and directory; the run's length is the target's own (training.steps)",
        "checkpoint": "the trial's checkpoints; the target configures its own [checkpoint]",
        "memory.swap": NO_SWAP,
        "memory.swap_layers": NO_SWAP,
        "memory.swap_ops": NO_SWAP,
        "memory.swap_prefetch": NO_SWAP,
        "memory.limit_gb": "torchtitan has no per-rank memory budget setting",
        "optim.momentum": NO_MUON,
        "optim.ns_steps": NO_MUON,
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
    },
)
