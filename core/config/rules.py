"""The rules between config sections: one named function per rule, run in ``CROSS_SECTION_RULES`` order by
``TrainConfig`` once every section has checked its own fields and null defaults are resolved.

Each rule raises ``ConfigError(field, message)``: the dotted key to change and how. Rules that depend on what the
runtime can do on a device say so in a function of their own ("CPU workaround:", ``docs/mindspore-cpu.md``).
No MindSpore here: the agent imports the config to validate and estimate proposals cheaply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.config.schema import TrainConfig


class ConfigError(ValueError):
    """A configuration the trial refuses to run. ``field`` is the dotted key; the message says the fix."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


def require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise ConfigError(field_name, message)


def positive(section: str, obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        require(value > 0, f"{section}.{name}", f"must be > 0 (got {value})")


# ---- the model and the layout ----------------------------------------------------------------------------------


def sequence_fits_rope_table(cfg: TrainConfig) -> None:
    t, m = cfg.training, cfg.model
    require(
        t.seq_len <= m.max_seq_len,
        "training.seq_len",
        f"{t.seq_len} exceeds model.max_seq_len={m.max_seq_len}; lower it or raise model.max_seq_len",
    )


def fused_kernels_run_on_the_host(cfg: TrainConfig) -> None:
    require(
        not (cfg.execution.cpu_kernels and cfg.device != "CPU"),
        "execution.cpu_kernels",
        f"the fused kernels run on the host CPU, not on {cfg.device}; set it to null or false",
    )


def tp_divides_the_model(cfg: TrainConfig) -> None:
    m, p = cfg.model, cfg.parallel
    for name in ("n_heads", "n_kv_heads", "vocab_size", "ffn_hidden"):
        value = getattr(m, name)
        require(
            value % p.tp == 0,
            "parallel.tp",
            f"{p.tp} does not divide model.{name}={value}; choose a tp that divides n_heads, n_kv_heads, "
            "vocab_size and ffn_hidden",
        )


def cp_splits_the_sequence(cfg: TrainConfig) -> None:
    t, p = cfg.training, cfg.parallel
    if p.cp > 1:
        require(
            t.seq_len % (2 * p.cp) == 0,
            "parallel.cp",
            f"training.seq_len={t.seq_len} must split into 2*cp = {2 * p.cp} equal chunks (each rank holds a "
            "chunk and its mirror, for causal load balance); choose cp or seq_len accordingly",
        )


def sp_splits_the_local_sequence(cfg: TrainConfig) -> None:
    t, p = cfg.training, cfg.parallel
    if p.sp:
        local = t.seq_len // p.cp
        require(
            local % p.tp == 0,
            "parallel.sp",
            f"each rank's sequence ({t.seq_len} / cp = {local}) must split into tp={p.tp} equal parts; "
            "choose seq_len, cp and tp accordingly or set parallel.sp=false",
        )


def stages_split_the_layers(cfg: TrainConfig) -> None:
    m, p = cfg.model, cfg.parallel
    stages = p.stages
    if p.pp_layers is not None:
        # the first and last stages may hold none: the embedding, or the norm, head and loss, alone (Megatron's
        # --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split)
        inner = p.pp_layers[1:-1]
        require(
            len(p.pp_layers) == stages
            and sum(p.pp_layers) == m.n_layers
            and min(p.pp_layers) >= 0
            and min(inner, default=1) >= 1,
            "parallel.pp_layers",
            f"{list(p.pp_layers)} must give each of pp * pp_virtual = {stages} stages at least one layer (the "
            f"first and the last may hold none: the embedding, or the head and loss, alone), model.n_layers="
            f"{m.n_layers} in all",
        )
        require(
            p.pp_offset == 0,
            "parallel.pp_offset",
            "applies to the even split; with parallel.pp_layers set it to 0 and write the split you want",
        )
        return
    require(
        m.n_layers % stages == 0,
        "parallel.pp",
        f"pp * pp_virtual = {stages} stages do not divide model.n_layers={m.n_layers}; choose degrees "
        "that divide it, or give the layers per stage in parallel.pp_layers (e.g. [1,2])",
    )
    require(stages > 1 or p.pp_offset == 0, "parallel.pp_offset", "needs a pipeline (parallel.pp > 1)")
    split = p.stage_split(m.n_layers)
    require(
        min(split) >= 1,
        "parallel.pp_offset",
        f"{p.pp_offset} leaves a stage without layers (split {split}); keep |pp_offset| below {m.n_layers // stages}",
    )


def preprocess_fits_stage_0(cfg: TrainConfig) -> None:
    p = cfg.parallel
    if p.pp_schedule != "mpipe":
        return
    first = p.stage_split(cfg.model.n_layers)[0]
    require(
        p.pp_transpose_layers < first,
        "parallel.pp_transpose_layers",
        f"{p.pp_transpose_layers} blocks do not leave stage 0 a body of its own (it has {first}); lower it "
        f"below {first}, or give stage 0 more layers (parallel.pp_layers or pp_offset)",
    )


def frozen_blocks_leave_stage_0_one(cfg: TrainConfig) -> None:
    p, m = cfg.parallel, cfg.model
    if p.pp == 1 or not m.freeze_layers:
        return
    first = p.stage_split(m.n_layers)[0]
    require(
        m.freeze_layers < first,
        "model.freeze_layers",
        f"{m.freeze_layers} frozen blocks leave pipeline stage 0 (its {first} blocks) nothing to train; freeze "
        f"fewer than {first}, or give stage 0 more blocks (parallel.pp_layers or pp_offset)",
    )


def experts_fit_the_layout(cfg: TrainConfig) -> None:
    m, p = cfg.model, cfg.parallel
    require(
        p.ep == 1 or m.n_experts > 0,
        "parallel.ep",
        f"expert parallelism (ep={p.ep}) splits an MoE model's experts; choose model=moe-tiny or moe-small, "
        "or set parallel.ep=1",
    )
    if not m.n_experts:
        return
    block = p.dp_shard * p.cp * p.tp
    require(
        block % (p.ep * p.expert_tp) == 0,
        "parallel.ep",
        f"{p.ep} expert ranks, {p.expert_tp} apart (parallel.etp; null: tp), must divide dp_shard * cp * tp = {block}: "
        "the experts borrow those ranks",
    )
    field = "parallel.tp" if p.etp is None else "parallel.etp"
    require(
        m.expert_width % p.expert_tp == 0,
        field,
        f"{p.expert_tp} does not divide each expert's width (model.moe_ffn_hidden or ffn_hidden = {m.expert_width}); "
        f"choose a {field.split('.')[1]} that divides it",
    )
    require(
        m.n_experts % p.ep == 0,
        "parallel.ep",
        f"{p.ep} ranks do not split model.n_experts={m.n_experts} evenly; choose an ep that divides it",
    )
    require(
        p.expert_tp == p.tp or (p.ep > 1 and p.sp),
        "parallel.etp",
        f"experts split over fewer ranks than tp ({p.expert_tp} of {p.tp}) take each tp rank's own tokens: that "
        "needs expert parallelism (parallel.ep > 1) and sequence parallelism (parallel.sp=true), as in Megatron",
    )


# ---- memory ------------------------------------------------------------------------------------------------------


def recompute_stages_match_the_pipeline(cfg: TrainConfig) -> None:
    stages, given = cfg.parallel.stages, cfg.memory.recompute_stages
    require(
        given is None or len(given) == stages,
        "memory.recompute_stages",
        f"needs one setting per pipeline stage (pp * pp_virtual = {stages}), got {given}",
    )
    counts = cfg.memory.recompute_stage_layers
    require(
        counts is None or len(counts) == stages,
        "memory.recompute_stage_layers",
        f"needs one block count per pipeline stage (pp * pp_virtual = {stages}), got {counts}",
    )


def selective_recompute_saves_memory(cfg: TrainConfig) -> None:
    require(
        not ("selective" in cfg.memory.recompute_settings and selective_costs_memory(cfg.device, cfg.training.mode)),
        "memory.recompute",
        "selective recompute raises the peak under training.mode=jit on CPU (the compiled graph keeps "
        "the recomputed parts' forward temporaries as well: benchmarks/RESULTS.md, 'Recompute'); use "
        "memory.recompute=full, which runs as compiled segments there, or training.mode=pynative",
    )


def selective_costs_memory(device: str, mode: str) -> bool:
    """CPU workaround: under jit MindSpore's CPU runtime keeps a bprop-Cell's forward intermediates as well as
    recomputing them, so selective recompute adds memory there instead of saving it; in PyNative it saves
    (benchmarks/RESULTS.md, "Recompute")."""
    return device == "CPU" and mode == "jit"


def per_op_recompute_fits_the_blocks(cfg: TrainConfig) -> None:
    m = cfg.model
    require(
        "selective_op" not in cfg.memory.recompute_settings or not (m.n_experts or m.mla),
        "memory.recompute",
        "selective_op (torchtitan's per-op policy) is counted for dense GQA blocks; for an MoE or MLA model use "
        "memory.recompute=selective or full",
    )


def recompute_modules_count_megatrons_saving(cfg: TrainConfig) -> None:
    require(
        cfg.memory.recompute_modules is None or cfg.cluster.saved_activations == "megatron",
        "memory.recompute_modules",
        "names Megatron-LM's --recompute-modules, which drop what Megatron keeps for backward: set "
        "cluster.saved_activations=megatron (estimated, not trained), or leave it null for the core's selective "
        "recompute",
    )


def weights_without_masters_are_16_bit(cfg: TrainConfig) -> None:
    c = cfg.cluster
    if c.master_weights:
        return
    require(
        cfg.training.precision != "fp32",
        "cluster.master_weights",
        "false stores the weights in 16 bits, and training.precision=fp32 computes in fp32: set "
        "training.precision=bf16, or leave cluster.master_weights true",
    )
    require(
        c.reduce_precision == "bf16",
        "cluster.reduce_precision",
        "must be bf16 with cluster.master_weights=false: 16-bit weights have 16-bit gradients, reduced as they are",
    )


def swap_runs_where_built(cfg: TrainConfig) -> None:
    if not cfg.memory.swap:
        return
    require(
        cfg.training.mode == "pynative",
        "memory.swap",
        "needs training.mode=pynative: under jit the compiled graph owns the tensors it saves and no hook can "
        "move them (core.memory.swap); or set memory.swap=false",
    )
    require(
        cfg.parallel.pp == 1 and cfg.memory.recompute_settings == {"none"},
        "memory.swap",
        "runs without a pipeline and without recompute (the combinations are not built); set parallel.pp=1 "
        "and memory.recompute=none, or memory.swap=false",
    )


def layer_counts_fit_the_model(cfg: TrainConfig) -> None:
    for name in ("recompute_layers", "swap_layers"):
        r = getattr(cfg.memory, name)
        require(
            r is None or r <= cfg.model.n_layers,
            f"memory.{name}",
            f"{r} exceeds model.n_layers={cfg.model.n_layers}; lower it, or set it to null for every block",
        )
    counts, split = cfg.memory.recompute_stage_layers, cfg.parallel.stage_split(cfg.model.n_layers)
    require(
        counts is None
        or all(c <= n for c, n in zip(counts, split, strict=True)),  # (lengths: recompute_stages_match_the_pipeline)
        "memory.recompute_stage_layers",
        f"{counts} exceeds the blocks of a stage {split}; lower that stage's count",
    )


# ---- the batch and the budget ---------------------------------------------------------------------------------


def batch_splits_over_data_parallel(cfg: TrainConfig) -> None:
    t, dp = cfg.training, cfg.parallel.dp
    require(
        t.global_batch_size % dp == 0,
        "training.global_batch_size",
        f"{t.global_batch_size} must be a multiple of the data-parallel degree {dp} "
        "(parallel.dp_replicate * parallel.dp_shard)",
    )


def batch_splits_into_micro_batches(cfg: TrainConfig) -> None:
    t, dp = cfg.training, cfg.parallel.dp
    per_step = t.micro_batch_size * dp
    require(
        t.global_batch_size % per_step == 0,
        "training.global_batch_size",
        f"{t.global_batch_size} must be a multiple of micro_batch_size * data-parallel degree "
        f"= {t.micro_batch_size} * {dp} = {per_step}",
    )


def interleaving_fills_every_rank(cfg: TrainConfig) -> None:
    p, m = cfg.parallel, cfg.grad_accum_steps
    require(
        (p.pp_schedule != "interleaved" and p.pp_virtual == 1) or p.pp == 1 or m % p.pp == 0,
        "parallel.pp_schedule",
        f"{p.pp_schedule} with {p.pp_virtual} stages per rank needs the micro-batches per step ({m} = "
        "global_batch_size / (micro_batch_size * dp)) to "
        f"be a multiple of pp={p.pp}; change training.micro_batch_size or the batch, or use 1f1b",
    )


def checkpoints_fit_the_budget(cfg: TrainConfig) -> None:
    interval, steps = cfg.checkpoint.interval, cfg.trial.max_steps
    require(
        interval == 0 or steps is None or interval <= steps,
        "checkpoint.interval",
        "is longer than trial.max_steps, so no checkpoint would be written; lower it or set 0",
    )


def ranks_split_over_the_nodes(cfg: TrainConfig, n: int) -> None:
    """A trial over ``n`` nodes (``core.runtime.cluster.nodes``: the agent's Slurm job says) gives each the same
    share of the ranks."""
    require(
        cfg.parallel.world_size % n == 0 and cfg.parallel.world_size >= n,
        "parallel",
        f"the degrees' product ({cfg.parallel.world_size} ranks) must split evenly over the trial's {n} nodes; "
        "change the degrees or the space's resources.nodes",
    )


def fp8_needs_fp8_matmuls(cfg: TrainConfig) -> None:
    c = cfg.cluster
    require(
        cfg.training.precision != "fp8" or c.peak_tflops_fp8 is not None,
        "training.precision",
        f"fp8 runs the blocks' matmuls on FP8 tensor cores, and profile {c.name!r} has none (cluster.peak_tflops_fp8 "
        "null): estimate it on cluster=h100-sxm or h200, or choose training.precision=bf16",
    )


def fp8_is_estimated_not_trained(cfg: TrainConfig) -> None:
    require(
        cfg.training.precision != "fp8",
        "training.precision",
        "fp8 is estimated (`python -m core.perf`, core.memory) for the stacks that train it, not trained here: the "
        "core's blocks build no FP8 matmuls; train training.precision=bf16",
    )


def experts_split_as_the_core_trains_them(cfg: TrainConfig) -> None:
    p = cfg.parallel
    if not cfg.model.n_experts:
        return
    require(
        p.ep == p.dp_shard,
        "parallel.ep",
        f"the core trains experts split over the FSDP ranks (they are not FSDP-sharded themselves): set "
        f"parallel.ep = parallel.dp_shard = {p.dp_shard}; other expert layouts are estimated (python -m core.perf)",
    )
    require(
        p.expert_tp == p.tp,
        "parallel.etp",
        f"the core trains experts split by tp: set parallel.etp = parallel.tp = {p.tp} (or null); etp "
        f"{p.expert_tp} is estimated (python -m core.perf), not trained",
    )


def recompute_as_the_core_trains_it(cfg: TrainConfig) -> None:
    require(
        "selective_op" not in cfg.memory.recompute_settings,
        "memory.recompute",
        "selective_op (torchtitan's per-op policy) is estimated (python -m core.perf), not trained; the core "
        "trains none, selective or full",
    )


# The cluster keys that describe another stack's step for the estimates (python -m core.perf, core.memory): key,
# the core's value (the only one it trains), what another value counts, and what the core trains with.
OTHER_STACKS = (
    ("saved_activations", "autograd", "what another stack keeps for backward", "autograd's"),
    ("master_weights", True, "MindFormers' 16-bit weights without fp32 masters", "fp32 master weights"),
    ("loss", "fused", "another stack's loss", "its fused cross-entropy"),
)


def cluster_keys_describe_the_core(cfg: TrainConfig) -> None:
    for key, core, counts, trains in OTHER_STACKS:
        value = getattr(cfg.cluster, key)
        require(  # values spelled as an override spells them (true, not True)
            value == core,
            f"cluster.{key}",
            f"{str(value).lower()} counts {counts} (python -m core.perf, core.memory); the core trains with "
            f"{trains}: set it to {str(core).lower()}",
        )


# In order: a rule may rely on the ones before it (the micro-batch rules on the data-parallel split).
CROSS_SECTION_RULES = (
    fused_kernels_run_on_the_host,
    sequence_fits_rope_table,
    tp_divides_the_model,
    cp_splits_the_sequence,
    sp_splits_the_local_sequence,
    stages_split_the_layers,
    preprocess_fits_stage_0,
    frozen_blocks_leave_stage_0_one,
    experts_fit_the_layout,
    recompute_stages_match_the_pipeline,
    selective_recompute_saves_memory,
    per_op_recompute_fits_the_blocks,
    recompute_modules_count_megatrons_saving,
    weights_without_masters_are_16_bit,
    swap_runs_where_built,
    layer_counts_fit_the_model,
    batch_splits_over_data_parallel,
    batch_splits_into_micro_batches,
    interleaving_fills_every_rank,
    checkpoints_fit_the_budget,
    fp8_needs_fp8_matmuls,
)

# What this build can run, beyond what is valid: checked by ``core.train`` before it starts a trial, not by the
# estimates, which answer for configs the trainer does not run yet.
RUN_RULES = (
    fp8_is_estimated_not_trained,
    experts_split_as_the_core_trains_them,
    recompute_as_the_core_trains_it,
    cluster_keys_describe_the_core,
)


def check_runnable(cfg: TrainConfig, *, nodes: int = 1) -> None:
    """Raise ConfigError if this build cannot train ``cfg`` (``RUN_RULES``) over ``nodes`` nodes."""
    for rule in RUN_RULES:
        rule(cfg)
    ranks_split_over_the_nodes(cfg, nodes)
