"""One optimizer step of a config on a cluster, predicted: every pipeline rank's stages timed block by block
(``core.perf.work``), the pipeline run as a discrete-event simulation of the schedule the runtime executes
(``core.parallel.pipeline.schedules``, with these durations and the point-to-point transfers; mpipe's preprocess
forward, its recompute-and-backward and its two messages timed as well), then the data-parallel gradient
reduction and the optimizer.

    step = makespan of the schedule (or m x (forward + backward) without a pipeline)
           + exposed data-parallel traffic (the replicas' all-reduce; under dp_shard_strategy=optim, ZeRO-1, the
             gradients' reduce-scatter and the updated weights' all-gather, once a step: with cluster.overlap_dp
             under the last micro-batch's backward and the next step's first forward)
           + optimizer (memory-bound: each held parameter's fp32 master, gradient and two states read and written)

With ``cluster.stage_recompute`` (the core's pipeline runtime) each stage but the last runs its forward again in
its backward; the accelerator profiles price the stacks their published rows come from, which keep the
activations of each micro-batch in flight instead (``core.memory.estimate`` counts them either way).

MFU is model FLOPs (``core.model.flops.flops_per_token``: 6N + the attention term, no recompute) per second per
device over the profile's peak at the trial's precision (fp8: bf16's, as torchtitan reports its FP8 runs' MFU;
the FP8 matmuls are priced at ``cluster.peak_tflops_fp8``). Peak memory per rank is ``core.memory``'s estimate with
the cluster's accounting (per tensor and precision, its allocator margin and reserved memory on accelerators;
the measured runtime profile on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from core.config import ConfigError, TrainConfig, compose, load_config
from core.memory.estimate import RuntimeProfile, estimate_memory, runtime_profile
from core.memory.plan import recompute_plan
from core.model.flops import flops_per_token
from core.parallel.pipeline.mpipe import owner
from core.parallel.pipeline.schedules import compile_schedule, schedule_of, stage_layers
from core.perf import links
from core.perf.device import Device, device, memory_bytes
from core.perf.work import Pass, Shape, block_passes, edge_passes, expert_numel, sharded_numel, sharding_groups

ADAMW_BYTES = 4 + 4 + 4 + 8 + 8  # per held parameter: master read+write, gradient read, m and v read+write
ADAMW_BYTES_16 = 2 + 2 + 2 + 8 + 8  # without masters (cluster.master_weights=false): the 16-bit weight and gradient


@dataclass
class StepEstimate:
    step_time_sec: float
    tokens_per_sec: float  # global
    tokens_per_sec_per_device: float
    mfu: float
    peak_memory_bytes_per_rank: int
    memory_bytes_per_device: float | None  # the device's, when the profile gives it
    breakdown: dict[str, float] = field(default_factory=dict)  # seconds of the step, by kind (the slowest rank's)

    @property
    def fits(self) -> bool:
        return _fits(self.peak_memory_bytes_per_rank, self.memory_bytes_per_device)


def check_devices(cfg: TrainConfig) -> None:
    """The layout's ranks must be the cluster's devices: a ConfigError naming cluster.nodes otherwise."""
    cluster, ranks = cfg.cluster, cfg.parallel.world_size
    if ranks != cluster.devices:
        raise ConfigError(
            "cluster.nodes",
            f"the parallel degrees multiply to {ranks} ranks but the cluster has cluster.nodes * "
            f"cluster.devices_per_node = {cluster.nodes} * {cluster.devices_per_node} = {cluster.devices} devices; "
            "make them equal",
        )


def check_precision(cfg: TrainConfig) -> None:
    """bf16 on a CPU cluster is emulated by the trainer (``TrainConfig.compute_precision``), whose casts the model
    does not price: a ConfigError naming training.precision rather than an fp32 step that is not the one it runs."""
    if cfg.compute_precision == "bf16-emulated":
        raise ConfigError(
            "training.precision",
            "bf16 on a CPU cluster is emulated by the trainer (bf16's values in fp32, TrainConfig.compute_precision), "
            "at 1.2-1.3x fp32's step (benchmarks/RESULTS.md, 'bf16 training on CPU'), which this model does not "
            "price; predict training.precision=fp32 here, or bf16 on an accelerator cluster",
        )


def planned_config(overrides: list[str]) -> TrainConfig:
    """The config of ``overrides`` as planned on its cluster: ``device`` is the cluster's (its rules apply, e.g.
    flash attention and in-place accumulation on accelerators), the ranks must be the cluster's devices, and bf16
    must be real (``check_precision``)."""
    try:  # the cluster's device first, from the composed tree: the rules depend on the device
        device = compose(overrides).cluster.device
    except (HydraException, OmegaConfBaseException):
        load_config(overrides)  # raises the ConfigError that names the key
        raise
    cfg = load_config([f"device={device}", *overrides])
    check_devices(cfg)
    check_precision(cfg)
    return cfg


def fits_device(cfg: TrainConfig) -> bool:
    """Whether the memory model's peak per rank fits the cluster's device (``StepEstimate.fits`` without timing the
    step; True when the cluster gives no memory size)."""
    return _fits(estimate_memory(cfg, memory_profile(cfg)).total, memory_bytes(cfg.cluster))


def _fits(peak: int, capacity: float | None) -> bool:
    """A peak per rank within the device's memory; a device of no stated size holds anything."""
    return capacity is None or peak <= capacity


def estimate_step(cfg: TrainConfig) -> StepEstimate:
    """Predict one step of ``cfg`` on ``cfg.cluster`` (whose devices must be the layout's ranks)."""
    dev = device(cfg.cluster, cfg.training.precision)
    par, t = cfg.parallel, cfg.training
    stages = _stage_passes(cfg, dev)
    m = cfg.grad_accum_steps
    if par.pp > 1:
        durations = {(op, s): (f if op == "F" else b).total for s, (f, b) in enumerate(stages) for op in "FB"}
        pre, redo = _preprocess_passes(cfg, dev)
        durations |= {("P", 0): pre.total, ("R", 0): redo.total}
        schedule = compile_schedule(**schedule_of(cfg))
        timing = schedule.time(lambda op, s: durations[(op, s)], _p2p_seconds(cfg, dev))
        pipeline = timing.makespan
        rank = max(range(par.pp), key=lambda r: timing.busy[r])
        mine = [stages[s] for s in range(rank, len(stages), par.pp)]
        if par.pp_schedule == "mpipe":  # the preprocess this rank runs, as a share of a micro-batch's
            runs = _preprocess_runs(cfg, rank)
            mine.append((_scaled(pre, runs / m), _scaled(redo, float(rank == 0 and cfg.preprocess_trains))))
    else:
        mine, rank = stages, 0
        pipeline = m * sum(f.total + b.total for f, b in stages)
    fwd, bwd = Pass(), Pass()
    for f, b in mine:
        fwd.add(f)
        bwd.add(b)
    dp = _dp_seconds(cfg, dev, rank, first_forward=fwd.total, last_backward=bwd.total)
    optimizer = _optimizer_seconds(cfg, dev, rank)
    step = pipeline + dp + optimizer
    busy = m * (fwd.total + bwd.total)
    host = m * (fwd.launch + bwd.launch)
    dispatch = host * dispatch_share(cfg, dev)
    breakdown = {
        "compute": m * (fwd.compute + bwd.compute),
        "recompute": m * bwd.recompute,
        "launch": host - dispatch,
        "dispatch": dispatch,  # PyNative's per-op dispatch from Python (training.mode=pynative), beside the launches
        **{f"comm_{k}": m * v for k, v in _merge(fwd.comm, bwd.comm).items()},
        "comm_pp": pipeline - busy if par.pp > 1 else 0.0,  # bubble and transfers, measured as idle time
        "comm_dp": dp,
        "optimizer": optimizer,
    }
    tokens = t.global_batch_size * t.seq_len / step
    per_device = tokens / par.world_size
    peak = dev.peak_flops
    memory = estimate_memory(cfg, memory_profile(cfg))
    return StepEstimate(
        step_time_sec=step,
        tokens_per_sec=tokens,
        tokens_per_sec_per_device=per_device,
        mfu=flops_per_token(cfg.model, t.seq_len) * per_device / peak,
        peak_memory_bytes_per_rank=memory.total,
        memory_bytes_per_device=dev.memory_bytes,
        breakdown=breakdown,
    )


def _stage_passes(cfg: TrainConfig, dev: Device) -> list[tuple[Pass, Pass]]:
    """(forward, backward) of one micro-batch through each (virtual) pipeline stage; one stage without a pipeline."""
    par, n = cfg.parallel, cfg.model.n_layers
    ranges = stage_layers(n, par.stages, par.stage_split(n)) if par.pp > 1 else [range(n)]
    out, plan = [], recompute_plan(cfg)
    transposed = par.pp_transpose_layers
    ranges[0] = ranges[0][transposed:]  # mpipe: the preprocess block is timed apart (_preprocess_passes)
    for s, blocks in enumerate(ranges):
        fwd, bwd = edge_passes(cfg, dev, first=s == 0 and not transposed, last=s == len(ranges) - 1)
        mode = plan.mode(s)
        # every marked block: the stacks the accelerator profiles price recompute them all (the core's segmented
        # step spares the last one, ``RecomputePlan.rerun``: a block's forward, not priced)
        redo = set(plan.recomputed(blocks, s))
        for i in blocks:
            f, b = block_passes(cfg, dev, i, mode if i in redo else "none")
            fwd.add(f)
            bwd.add(b)
        for _ in range(cfg.model.mtp_layers if s == len(ranges) - 1 else 0):
            # an MTP module (core.model.mtp): a block like the model's last (MoE in an MoE model), then the final
            # norm, head and loss again; its 2 D x D projection is left out (under 1% of a block)
            for f, b in (block_passes(cfg, dev, n - 1, "none"), edge_passes(cfg, dev, first=False, last=True)):
                fwd.add(f)
                bwd.add(b)
        if par.pp > 1 and cfg.cluster.stage_recompute and s < len(ranges) - 1:
            bwd.add(Pass(recompute=fwd.compute, launch=fwd.launch, comm=dict(fwd.comm)))  # the forward again, all of it
        out.append((fwd, bwd))
    return out


def _preprocess_passes(cfg: TrainConfig, dev: Device) -> tuple[Pass, Pass]:
    """mpipe's P (the preprocess block's forward: the embedding and stage 0's first T blocks; T = 0: loading a
    micro-batch, free here) and R (the block again, then its backward, on rank 0)."""
    par = cfg.parallel
    if not par.pp_transpose_layers:
        return Pass(), Pass()
    fwd, bwd = edge_passes(cfg, dev, first=True, last=False)
    for i in range(par.pp_transpose_layers):
        f, b = block_passes(cfg, dev, i, "none")
        fwd.add(f)
        bwd.add(b)
    bwd.add(Pass(recompute=fwd.compute, launch=fwd.launch, comm=dict(fwd.comm)))
    return fwd, bwd


def _preprocess_runs(cfg: TrainConfig, rank: int) -> int:
    """How many micro-batches pipeline rank ``rank`` preprocesses under mpipe."""
    par, m = cfg.parallel, cfg.grad_accum_steps
    return sum(owner(mb, par.pp, m, par.pp_transpose_overflow) == rank for mb in range(m))


def dispatch_share(cfg: TrainConfig, dev: Device) -> float:
    """The share of the host's time per block that is PyNative's dispatch rather than kernel launches: every launch
    unit is ``launch + pynative`` under PyNative (``work.launch_seconds``), ``launch`` otherwise."""
    if cfg.training.mode != "pynative" or not dev.pynative:
        return 0.0
    return dev.pynative / (dev.launch + dev.pynative)


def _scaled(p: Pass, share: float) -> Pass:
    return Pass(
        compute=p.compute * share,
        recompute=p.recompute * share,
        launch=p.launch * share,
        comm={k: v * share for k, v in p.comm.items()},
    )


def _p2p_seconds(cfg: TrainConfig, dev: Device) -> dict[str, float]:
    """Each kind of message between pipeline ranks: one micro-batch's activation (F) or its gradient (B); under
    mpipe a preprocessed micro-batch (P: the block's output, and the tokens R recomputes it from when it trains;
    T = 0 the tokens) and the preprocess weights (W, fp32)."""
    par, sh = cfg.parallel, Shape.of(cfg)
    link = links.group_link(par, ("pp",), dev)
    hidden = sh.tokens * cfg.model.d_model * sh.act_bytes / (par.tp if par.sp else 1)
    tokens = 4 * sh.tokens  # int32, the whole (b, S / cp) on every tensor-parallel rank
    out = {"F": links.p2p(hidden, link), "B": links.p2p(hidden, link)}
    if par.pp_schedule == "mpipe":
        transposed = par.pp_transpose_layers
        out["P"] = links.p2p(
            (hidden if transposed else 0) + (tokens if cfg.preprocess_trains or not transposed else 0), link
        )
        prefixes = ["embed.", *(f"layers.{i}." for i in range(transposed))] if transposed else []
        weights = sum(sharded_numel(cfg, p) for p in prefixes) / (par.dp_shard * par.cp)
        out["W"] = links.p2p(4 * weights, link)
    return out


def _dp_seconds(cfg: TrainConfig, dev: Device, pp_rank: int, *, first_forward: float, last_backward: float) -> float:
    """The exposed data-parallel traffic of a step: the all-reduce of this rank's gradient shards over the replicas
    (dp_replicate) and, under ``parallel.dp_shard_strategy=optim`` (ZeRO-1), the reduce-scatter of its whole
    gradients over the dp_shard x cp ranks (folded experts': over ``expert_dp``) before it and the all-gather of the
    updated weights after the optimizer. With ``cluster.overlap_dp`` the reductions hide under the last
    micro-batch's backward and the gather under the next step's first forward (Megatron's --overlap-grad-reduce and
    --overlap-param-gather)."""
    par, c = cfg.parallel, cfg.cluster
    reduce = gather = 0.0
    if par.dp_replicate > 1:
        reduce = links.all_reduce(
            _state_numel(cfg, pp_rank) * c.reduce_bytes,
            par.dp_replicate,
            links.group_link(par, ("dp_replicate",), dev),
        )
    if not par.shards_weights:
        weight_bytes = Shape.of(cfg).weight_bytes
        for numel, ranks, link in sharding_groups(cfg, dev, *_held_numel(cfg, pp_rank)):
            reduce += links.reduce_scatter(numel * c.reduce_bytes, ranks, link)
            gather += links.all_gather(numel * weight_bytes, ranks, link)
    if not c.overlap_dp:
        return reduce + gather
    return max(0.0, reduce - last_backward) + max(0.0, gather - first_forward)


def _optimizer_seconds(cfg: TrainConfig, dev: Device, pp_rank: int) -> float:
    held = _state_numel(cfg, pp_rank)
    if not cfg.cluster.master_weights:
        return dev.memory_seconds(held * ADAMW_BYTES_16)
    copy = 2 if cfg.training.precision == "bf16" else 0  # the bf16 compute copy written back
    return dev.memory_seconds(held * (ADAMW_BYTES + copy))


def _state_numel(cfg: TrainConfig, pp_rank: int) -> float:
    """Elements of the weights whose optimizer states pipeline rank ``pp_rank`` holds: its tp share, divided over
    the FSDP ranks (dp_shard * cp), and its share of the experts under expert parallelism (folded ones divided over
    ``expert_dp``)."""
    dense, experts = _held_numel(cfg, pp_rank)
    return dense / (cfg.parallel.dp_shard * cfg.parallel.cp) + experts / cfg.parallel.expert_dp


def _held_numel(cfg: TrainConfig, pp_rank: int) -> tuple[float, float]:
    """(dense, experts): elements of pipeline rank ``pp_rank``'s weights a rank holds before data-parallel sharding
    — its tp share of the dense ones, its ep and etp share of the experts."""
    par, n = cfg.parallel, cfg.model.n_layers
    ranges = stage_layers(n, par.stages, par.stage_split(n)) if par.pp > 1 else [range(n)]
    mine = range(pp_rank, len(ranges), par.pp)
    prefixes = [f"layers.{i}." for s in mine for i in ranges[s]]
    if 0 in mine:
        prefixes.append("embed.")
    if len(ranges) - 1 in mine:
        prefixes += ["norm.", "lm_head."]
    return sum(sharded_numel(cfg, p) for p in prefixes), sum(expert_numel(cfg, p) for p in prefixes)


def memory_profile(cfg: TrainConfig) -> RuntimeProfile:
    """How ``cfg``'s cluster holds memory: the runtime profile measured on CPU; on accelerators the tensors
    themselves with the cluster's allocator margin, on top of its reserved memory."""
    c = cfg.cluster
    if c.device == "CPU":
        return runtime_profile(cfg.device, cfg.training.mode)
    return RuntimeProfile(baseline=int(c.memory_reserved_gib * 2**30), margin=c.memory_margin)


def _merge(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in sorted({*a, *b})}
