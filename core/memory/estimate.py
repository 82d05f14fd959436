"""The memory estimate: a config's per-rank peak before it runs, from the textbook count of a step's tensors
(``Terms``, device-independent) turned into bytes by a ``RuntimeProfile``: how one device and execution mode
really hold those tensors. ``python -m core.memory <overrides>`` prints it by component (``core.memory.breakdown``);
``core.memory.probe`` measures the real peak while a trial runs.

Profiles are measured, not guessed: ``python benchmarks/memory_model.py collect`` runs a sweep of configs (model
size, batch, sequence, optimizer, recompute, ranks) and ``fit`` fits the profile by least squares; its errors, in
sample and held out, are in benchmarks/RESULTS.md, "Memory estimate".

No MindSpore here: the agent estimates every proposal with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.config import SWAP_OPS, ModelConfig, TrainConfig
from core.memory.activations import (
    block_activation_bytes,
    block_activation_parts,
    element_bytes,
    per_op_saved_bytes,
    score_floats,
)
from core.memory.plan import recompute_plan
from core.model.flops import param_groups, param_shapes
from core.optim.param_rules import uses_muon
from core.parallel.pipeline.mpipe import owner
from core.parallel.pipeline.schedules import compile_schedule, schedule_of, stage_layers
from core.parallel.placement import is_expert, layout_placement

GiB, MiB = 1024**3, 1024**2


@dataclass(frozen=True)
class Terms:
    """Textbook bytes of one rank's training step (fp32), before any runtime overhead. Under a mesh layout every
    term is this rank's share: states divided by the degrees that shard them (tp for split weights, fsdp =
    dp_shard * cp for all), activations and logits by the degrees that split tokens, heads and vocabulary."""

    params: int
    grads: int  # accumulating over micro-batches: the old sum, the new gradient and the new sum
    optimizer: int
    activations: int  # saved for backward by the blocks
    recomputed: int | None  # what recompute saves instead (full: block inputs + one block's); None without
    logits: int  # (tokens on this rank, vocab / tp) floats of the output head
    layers: int
    muon_hidden: int  # bytes of the hidden matrices Muon orthogonalises, whole (0 with AdamW)
    ranks: int
    gathered: int = 0  # FSDP: bytes of the largest weight gathered whole for one op (0 without FSDP)
    comm_params: int = 0  # bytes of the parameters as a collective buffer: dp_replicate all-reduce, FSDP shards
    stash: int = 0  # pipeline: stage inputs (and last-stage input gradients) of the micro-batches in flight
    selective: bool = False  # ``recomputed`` is selective recompute's count (of some stage)
    scores: int = 0  # of ``activations``: attention's S x S scores and probabilities (they grow with S^2)
    recomputed_scores: int = 0  # of ``recomputed``: the same
    rebuilt: int = 0  # of ``recomputed``: the block full recompute rebuilds in backward
    sharded_ops: int = 0  # FSDP: weights whose op re-gathers and differentiates itself in backward (ShardedOp)

    @property
    def states(self) -> int:
        return self.params + self.grads + self.optimizer


def pipeline_rank(cfg: TrainConfig, pp_rank: int) -> tuple[set[str], dict[int, range], bool, int]:
    """What pipeline rank ``pp_rank`` holds: (its parameter names, the blocks of each of its (virtual) stages,
    whether it computes the loss, the most micro-batch stages in flight on it). Without a pipeline: everything."""
    m, par = cfg.model, cfg.parallel
    n_stages = par.stages
    ranges = stage_layers(m.n_layers, n_stages, par.stage_split(m.n_layers))
    mine = range(pp_rank, n_stages, par.pp)
    names = {f"layers.{i}." for s in mine for i in ranges[s]}
    groups = param_groups(m)
    held = {n for p in names for n in groups.get(p, ())}
    last = n_stages - 1 in mine
    if 0 in mine or (last and m.tie_embeddings):
        held.add("embed.weight")  # the last stage's copy of a tied table is its head
    if last:
        held |= {"norm.weight"} | ({"lm_head.weight"} if not m.tie_embeddings else set())
        held |= set(groups.get("mtp.", ())) | ({"embed.weight"} if m.mtp_layers else set())  # MTP reads the table
    chunks = {s: ranges[s] for s in mine}
    in_flight = 1
    if par.pp > 1:  # the schedule simulated once per shape (compile_schedule caches it), not per rank
        schedule = compile_schedule(**schedule_of(cfg))
        in_flight = schedule.in_flight[pp_rank]
    return held, chunks, last, in_flight


def preprocess_copy(cfg: TrainConfig, pp_rank: int) -> set[str]:
    """mpipe: the parameter names of the preprocess block pipeline rank ``pp_rank`` holds a copy of (a rank but 0
    that preprocesses a micro-batch, T >= 1; ``core.parallel.pipeline.mpipe``); empty otherwise."""
    par, m = cfg.parallel, cfg.model
    if not par.pp_transpose_layers or pp_rank == 0:  # (T is 0 but under mpipe)
        return set()
    micro = cfg.grad_accum_steps
    if all(owner(mb, par.pp, micro, par.pp_transpose_overflow) != pp_rank for mb in range(micro)):
        return set()
    return _block_names(m, par.pp_transpose_layers, embedding=True)


def frozen_names(m: ModelConfig) -> set[str]:
    """The weights ``model.freeze_embedding`` and ``model.freeze_layers`` keep as they start."""
    return _block_names(m, m.freeze_layers, embedding=m.freeze_embedding)


def _block_names(m: ModelConfig, blocks: int, *, embedding: bool) -> set[str]:
    """The parameter names of the first ``blocks`` blocks, and the embedding's table if ``embedding``."""
    groups = param_groups(m)
    return ({"embed.weight"} if embedding else set()) | {n for i in range(blocks) for n in groups[f"layers.{i}."]}


def terms(cfg: TrainConfig, pp_rank: int = 0) -> Terms:
    """The textbook bytes of one rank's step for ``cfg`` (no MindSpore: the agent calls this on proposals); with
    a pipeline, of a rank of pipeline stage ``pp_rank``."""
    m, t, par = cfg.model, cfg.training, cfg.parallel
    fsdp = par.dp_shard * par.cp
    muon = cfg.optim.name == "muon"
    # bf16: activations and compute copies of the weights in bf16 (FSDP gathers them in bf16; without FSDP each
    # rank keeps one beside its fp32 master), gradients, states and the loss in fp32. Accelerators run flash
    # attention (no S x S matrices saved) and accumulate gradients in place. CPU emulates bf16 in fp32 storage
    # (TrainConfig.compute_precision): counted as fp32. Without master weights (cluster.master_weights=false,
    # MindFormers' 16-bit param_init_type) the weights and their gradients are the 16-bit ones, the states fp32.
    bf16, accelerator = cfg.compute_precision == "bf16", cfg.device != "CPU"
    masters = cfg.cluster.master_weights
    act_bytes = weight_bytes = element_bytes(cfg)
    held_names, chunks, has_loss, in_flight = pipeline_rank(cfg, pp_rank)
    preprocess, frozen = preprocess_copy(cfg, pp_rank), frozen_names(m)
    plan = recompute_plan(cfg)
    redone = {
        f"layers.{i}." for s, blocks in chunks.items() if plan.mode(s) == "full" for i in plan.recomputed(blocks, s)
    }
    used = plan.modes_used(chunks)
    # ZeRO-1 (parallel.dp_shard_strategy=optim, core.parallel.zero1): the master weights and states sharded as FSDP
    # shards them, each weight and its gradient whole on every rank
    gathers = par.shards_weights
    n = stored = whole = grad_bytes = state_floats = hidden = gathered = copies = copied = sharded_ops = apart = 0
    for name, shape in param_shapes(m).items():
        p = layout_placement(name, shape, par.expert_tp if is_expert(name) else par.tp, fsdp, ep=par.ep)
        if par.expert_dp > 1 and is_expert(name):  # folded experts: FSDP over the ranks holding the same experts
            p = p.with_fsdp(par.expert_dp, 0)
        sharded = gathers and p.fsdp_size > 1  # the weight is gathered for each use
        size = p.shard_len if p.fsdp_size > 1 else p.local_numel  # of the master weight and the states
        resident = p.shard_len if sharded else p.local_numel  # of the weight and its gradient
        if name in preprocess:  # weights only: rank 0's copy is the one that trains
            copied += resident
        if name not in held_names:
            continue
        # core.parallel.fsdp wraps every weight's op but the head's (the loss gathers it) in a ShardedOp, except in
        # the blocks full recompute re-runs (there a plain gather)
        if sharded and name != "lm_head.weight" and not any(name.startswith(b) for b in redone):
            sharded_ops += 1
        if name in frozen:  # weights only, used as they are (FSDP still gathers them)
            copied += resident
            gathered = max(gathered, p.local_numel) if sharded else gathered
            continue
        n, stored, whole = n + p.local_numel, stored + size, whole + resident
        # The core's ZeRO-1 keeps its fp32 masters apart from the fp32 weights (core.parallel.zero1), counted on
        # the CPU it runs on; on accelerators the stacks priced keep fp32 weights as their own masters (Megatron)
        apart += size if not accelerator and not gathers and p.fsdp_size > 1 else 0
        # A gradient FSDP shards lands in the fp32 master's gradient (torchtitan); on accelerators one kept whole
        # accumulates in the buffer it is reduced from, in the reduction's precision (Megatron-LM's
        # ``grad_reduce_in_fp32`` sets its gradient buffer's dtype)
        grad_bytes += resident * (
            weight_bytes if not masters else cfg.cluster.reduce_bytes if accelerator and not sharded else 4
        )
        copies += p.local_numel if bf16 and masters and not sharded else 0
        if muon and uses_muon(name, shape):
            hidden += math.prod(shape)
            state_floats += size  # Muon: one momentum buffer
        else:
            state_floats += 2 * size  # AdamW: m and v
        gathered = max(gathered, p.local_numel) if sharded else gathered

    def per_layer(selective: bool) -> list[int]:
        kinds = {
            moe: block_activation_bytes(cfg, moe, selective=selective)
            for moe in {m.is_moe_layer(i) for i in range(m.n_layers)}
        }
        return [kinds[m.is_moe_layer(i)] for i in range(m.n_layers)]

    act, act_selective = per_layer(False), per_layer(True)
    scores_each = 0 if accelerator else act_bytes * t.micro_batch_size * score_floats(m, t.seq_len, par.tp, par.cp)
    sc = [scores_each] * m.n_layers  # S x S, in act
    local_tokens = t.micro_batch_size * t.seq_len // par.cp
    block_input = act_bytes * local_tokens * m.d_model // (par.tp if par.sp else 1)
    # A stage's backward runs one micro-batch at a time (core.parallel.pipeline): the largest stage's activations
    # are live at once. Full recompute keeps each recomputed block's input and rebuilds one block at a time;
    # selective keeps less of each recomputed block.
    largest = max(chunks.values(), key=lambda blocks: sum(act[i] for i in blocks))
    activations, scores = sum(act[i] for i in largest), sum(sc[i] for i in largest)
    if has_loss and m.mtp_layers:  # MTP modules (core.model.mtp), never recomputed: a block each, its norms and
        # projection's inputs (4 D a token), and its S x S scores
        activations += m.mtp_layers * (block_activation_bytes(cfg, m.n_experts > 0) + 4 * block_input)
        scores += m.mtp_layers * scores_each

    def saved(stage: int, blocks: range) -> tuple[int, int, int]:
        """(bytes, their S x S scores, the rebuilt block's bytes) saved by the blocks of stage ``stage``."""
        redo, r = plan.rerun(blocks, stage), plan.mode(stage)
        keep = blocks[len(redo) :]
        kept = (sum(act[i] for i in keep), sum(sc[i] for i in keep))
        if not redo:
            return *kept, 0
        if r == "full":
            i = max(redo, key=lambda i: act[i])
            return block_input * len(redo) + act[i] + kept[0], sc[i] + kept[1], act[i]
        if r == "selective":
            return sum(act_selective[i] for i in redo) + kept[0], kept[1], 0
        if r == "selective_op":
            return per_op_saved_bytes(cfg) * len(redo) + kept[0], kept[1], 0
        return sum(act[i] for i in redo) + kept[0], sum(sc[i] for i in redo) + kept[1], 0

    recomputed = recomputed_scores = rebuilt = None
    if used:
        recomputed, recomputed_scores, rebuilt = max(saved(s, blocks) for s, blocks in chunks.items())
    if cfg.memory.swap:
        recomputed, recomputed_scores = _swap_resident(cfg, act, sc)
    stash = block_input * in_flight * (2 if has_loss else 1) if par.pp > 1 else 0
    if preprocess:  # mpipe: a preprocessed micro-batch waiting to be sent (and its tokens, for R)
        stash += block_input + (4 * local_tokens if cfg.preprocess_trains else 0)
    if par.pp > 1 and not cfg.cluster.stage_recompute:
        # Each micro-batch stage in flight keeps what its blocks save (torchtitan, Megatron-LM): no stash, the
        # largest chunk's activations times the schedule's in-flight count.
        stash, activations, scores = 0, in_flight * activations, in_flight * scores
        if recomputed is not None:  # full recompute rebuilds one block at a time, whatever is in flight
            recomputed = in_flight * (recomputed - rebuilt) + rebuilt
            recomputed_scores = in_flight * recomputed_scores
    layers = sum(len(blocks) for blocks in chunks.values())
    return Terms(
        # fp32 masters (bf16: beside the compute copies; fp32: the weights themselves, whole under ZeRO-1), or
        # without masters the weights as they are held, in their 16 bits
        params=4 * ((stored if bf16 else whole) + copied + apart) + weight_bytes * copies
        if masters
        else weight_bytes * (whole + copied),
        grads=grad_bytes * (3 if cfg.grad_accum_steps > 1 and not accelerator else 1),
        optimizer=4 * state_floats,
        activations=activations,
        recomputed=recomputed,
        logits=logit_bytes(cfg) * local_tokens * (m.vocab_size // par.tp) if has_loss else 0,
        layers=layers,
        muon_hidden=4 * hidden,
        ranks=par.world_size,
        gathered=weight_bytes * gathered,
        comm_params=4 * whole if par.world_size > 1 else 0,
        stash=stash,
        selective="selective" in used,
        scores=scores,
        recomputed_scores=recomputed_scores or 0,
        rebuilt=rebuilt or 0,
        sharded_ops=sharded_ops,
    )


def logit_bytes(cfg: TrainConfig) -> int:
    """Bytes one logit holds at the loss's peak, by the stack's loss (``cluster.loss``): the core's fused loss keeps
    the logits and, in bf16, their fp32 copy; PyTorch's eager cross-entropy the fp32 log-softmax output with its
    gradient and the input's; a compiled loss the logits and their gradient."""
    loss = cfg.cluster.loss
    if loss == "eager":
        return 12
    if loss == "compiled":
        return 2 * element_bytes(cfg)
    return 6 if cfg.compute_precision == "bf16" else 4


def _swap_resident(cfg: TrainConfig, act: list[int], sc: list[int]) -> tuple[int, int]:
    """Saved activations resident under ``core.memory.swap`` (no pipeline): the blocks and parts it does not move, and
    the moved tensors of the largest blocks backward holds back at once. Without prefetch one, the block backward
    is in: each tensor comes back when read and goes when used (the memory sweep's two SWAP runs, never fitted, at
    2026-12-05: model=small at seq 512 within 0.5% of its peak, a 6-block tiny at seq 256 4.8% under it; counting
    two, as a single config of 2026-11-30 suggested, over-predicted the first by 25%: benchmarks/RESULTS.md, "Memory
    estimate"). A prefetch brings whole blocks back ahead, and the block being read is then whole too: measured on
    CPU, each depth adds about a block, the first nearly two (benchmarks/RESULTS.md, "core/memory/swap.py"), so 3 +
    swap_prefetch blocks are counted then (not measured again). Returns (bytes, the S x S scores among them)."""
    m, mem = cfg.model, cfg.memory
    ops = set(mem.swap_ops or SWAP_OPS)
    moved = sorted(
        (
            (
                sum(part for op, part in block_activation_parts(cfg, m.is_moe_layer(i)).items() if op in ops),
                sc[i] if "attention" in ops else 0,
            )
            for i in range(mem.swap_layers or m.n_layers)
        ),
        reverse=True,
    )
    back = moved[: 3 + mem.swap_prefetch if mem.swap_prefetch else 1]
    return (
        sum(act) - sum(b for b, _ in moved) + sum(b for b, _ in back),
        sum(sc) - sum(s for _, s in moved) + sum(s for _, s in back),
    )


@dataclass(frozen=True)
class RuntimeProfile:
    """How a device and execution mode hold a step's tensors, relative to ``Terms`` (bytes are per rank)."""

    baseline: int = 0  # before the model: libraries, kernels, thread pools, allocator pools
    per_layer: int = 0  # graph and kernel caches per block (jit compiles the unrolled model)
    state_copies: float = 1.0  # params, grads and optimizer states as the runtime holds them
    activation_copies: float = 1.0  # of the textbook saved-for-backward count (but attention's scores) ...
    score_copies: float = 1.0  # ... and of attention's S x S scores and probabilities
    rebuilt_copies: float = 1.0  # full recompute: blocks' worth of activations rebuilt at once in backward
    logits_copies: float = 1.0  # of the (tokens, vocab) logits
    muon_graph: int = 0  # Muon's Newton-Schulz graph
    muon_copies: float = 0.0  # of the hidden matrices, for Newton-Schulz temporaries
    recompute_saves: bool = True  # False: recompute keeps the activations (and adds recompute_per_layer)
    recompute_per_layer: int = 0
    selective_saves: bool = True  # False: count selective recompute as keeping every activation
    distributed: int = 0  # the collective runtime of a 2-rank trial ...
    distributed_per_rank: int = 0  # ... and what each further rank adds to it ...
    distributed_param_copies: float = 0.0  # ... and its buffers, as copies of this rank's parameters
    gathered_copies: float = 0.0  # FSDP: of the largest weight gathered whole
    sharded_op_graph: int = 0  # FSDP: per ShardedOp, the graph of its backward (its op differentiated again)
    margin: float = 0.0  # allocator fragmentation and caches, as a share of the step's tensors (accelerators)


# Fitted with MindSpore 2.10 on a 2-core AMD EPYC to the peaks of real 10-step trials per mode (as studies run
# them; benchmarks/data/memory_cpu.json; when, how many runs, and the errors: benchmarks/RESULTS.md, "Memory
# estimate"); more configs were held out of the fit (seq 512, partial/selective recompute, SWAP, pipelines, MoE,
# combined layouts) to measure its error out of sample. Under jit the CPU runtime keeps several times the textbook
# activations, attention's S x S scores and logits (forward and backward temporaries, fp32, little reuse by the
# memory pool); full recompute saves (compiled segments, core.memory.segmented) and holds part of a rebuilt block
# beside what it keeps, MindSpore's recompute in PyNative about two; a collective runtime takes a fixed amount on
# 2 ranks and more per further rank, and FSDP's gathers many copies of the largest weight. A least-squares fit: a
# few coefficients come out slightly negative or near zero where terms are nearly collinear; they are what fits the
# data, not a physical count. Selective recompute is not fitted (it saved little of the peak in PyNative, where the
# textbook expects far more: benchmarks/RESULTS.md, "Recompute"): counted as saving nothing, it over-predicts
# rather than under; under jit on CPU it is refused.
PROFILES = {
    ("CPU", "jit"): RuntimeProfile(
        baseline=625 * MiB,
        per_layer=16 * MiB,
        state_copies=1.31,
        activation_copies=4.03,
        score_copies=2.61,
        rebuilt_copies=0.667,
        logits_copies=5.0,
        muon_graph=1 * MiB,
        muon_copies=15.1,
        recompute_saves=True,
        selective_saves=False,
        distributed=4 * MiB,
        distributed_per_rank=0,
        distributed_param_copies=4.82,
        gathered_copies=56.9,
        sharded_op_graph=4 * MiB,
    ),
    ("CPU", "pynative"): RuntimeProfile(
        baseline=551 * MiB,
        per_layer=0 * MiB,
        state_copies=1.21,
        activation_copies=1.88,
        score_copies=1.85,
        rebuilt_copies=1.36,
        logits_copies=2.59,
        muon_graph=42 * MiB,
        muon_copies=17.6,
        recompute_saves=True,
        selective_saves=False,
        distributed=17 * MiB,
        distributed_per_rank=3 * MiB,
        distributed_param_copies=3.91,
        gathered_copies=9.68,
        sharded_op_graph=0,
    ),
}


def runtime_profile(device: str, mode: str) -> RuntimeProfile:
    """The measured profile of ``device`` in ``mode``, or the textbook one (all copies 1, no overhead) where
    nothing was measured: on Ascend the agent's memory model learns the offset from measured peaks
    (autoresearch.search.memory_model.MemoryModel) until a profile is fitted there."""
    return PROFILES.get((device, mode), RuntimeProfile())


@dataclass
class MemoryEstimate:
    """Bytes per rank by component: the textbook states, then what the runtime profile says the step holds.
    Components come from a least-squares fit, so one can be slightly negative where terms are collinear
    (``PROFILES``): the total is what is fitted, the split is the best reading of it."""

    params: int
    grads: int
    optimizer: int
    activations: int  # saved for backward by the blocks (after recompute or SWAP), as the runtime holds them
    logits: int = 0  # the head's logits and the loss's buffers
    stash: int = 0  # pipeline: stage inputs (and input gradients) of the micro-batches in flight
    state_copies: int = 0  # the runtime's further copies of params, grads and states (graph inputs, updates)
    optimizer_temps: int = 0  # Muon's Newton-Schulz graph and temporaries
    communication: int = 0  # collective runtime, parameter buffers, FSDP's gathered weights
    graphs: int = 0  # compiled graphs and kernel caches per block (and recompute's)
    baseline: int = 0  # before the model: libraries, thread pools, allocator pools
    allocator: int = 0  # fragmentation and caches on top of the tensors (the profile's margin)

    @property
    def runtime(self) -> int:
        """What the runtime adds beyond the step's tensors."""
        return (
            self.state_copies + self.optimizer_temps + self.communication + self.graphs + self.baseline + self.allocator
        )

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.logits + self.stash + self.runtime


def estimate_memory(cfg: TrainConfig, profile: RuntimeProfile | None = None) -> MemoryEstimate:
    """Per-rank peak estimate (the largest pipeline stage's): the textbook ``terms`` through the device's measured
    ``runtime_profile`` (or ``profile``: ``core.perf`` passes the cluster's). The agent recalibrates it against
    measured peaks (autoresearch.search.feasibility)."""
    profile = profile or runtime_profile(cfg.device, cfg.training.mode)
    return max((apply_profile(terms(cfg, r), profile) for r in range(cfg.parallel.pp)), key=lambda e: e.total)


def apply_profile(t: Terms, p: RuntimeProfile) -> MemoryEstimate:
    (saved, scores, rebuilt), graphs = (
        (t.activations, t.scores, 0),
        p.per_layer * t.layers + p.sharded_op_graph * t.sharded_ops,
    )
    if t.recomputed is not None and not (t.selective and not p.selective_saves):
        if p.recompute_saves:
            saved, scores, rebuilt = t.recomputed, t.recomputed_scores, t.rebuilt
        else:  # the activations stay and the recompute graph comes on top
            graphs += p.recompute_per_layer * t.layers
    held = p.activation_copies * (saved - scores + (p.rebuilt_copies - 1.0) * rebuilt) + p.score_copies * scores
    optimizer_temps = p.muon_graph + p.muon_copies * t.muon_hidden if t.muon_hidden else 0
    communication = 0
    if t.ranks > 1:
        communication = (
            p.distributed
            + p.distributed_per_rank * (t.ranks - 2)
            + p.distributed_param_copies * t.comm_params
            + p.gathered_copies * t.gathered
        )
    tensors = t.states + int(held) + int(p.logits_copies * t.logits) + t.stash
    return MemoryEstimate(
        allocator=int(p.margin * tensors),
        params=t.params,
        grads=t.grads,
        optimizer=t.optimizer,
        activations=int(held),
        logits=int(p.logits_copies * t.logits),
        stash=t.stash,
        state_copies=int((p.state_copies - 1.0) * t.states),
        optimizer_temps=int(optimizer_temps),
        communication=int(communication),
        graphs=int(graphs),
        baseline=p.baseline,
    )


def estimate_memory_bytes(cfg: TrainConfig) -> int:
    return estimate_memory(cfg).total
