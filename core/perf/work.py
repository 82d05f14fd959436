"""What one micro-batch costs one rank, block by block: matmul FLOPs (with the shape that bounds their rate),
memory-bound bytes, and the collectives the layout adds, counted from the model definition (no MindSpore).

Per block and micro-batch of ``b`` sequences of ``S`` tokens, a rank holds ``T = b S / cp`` tokens and a 1/tp share
of heads, FFN width and vocabulary (D: width, kv: key/value width, F: FFN width, V: vocabulary):

    forward matmuls      q and o 2 T D A / tp each (A = H E: D unless model.head_dim says), k and v 2 T D kv / tp
                         each (MLA: its down-projections 2 T D (Q + L + R) on every tp rank, its up-projections
                         by heads over tp), SwiGLU 3 x 2 T D F / tp (MoE: the router 2 T D E, the experts
                         3 x 2 T k c D F_e / tp with c the capacity factor (1 dropless), the shared experts as a
                         dense MLP), the causal attention core 2 T S A / tp (half of q k^T and p v); the head
                         2 T D V / tp on the last stage
    backward             twice the forward matmuls; flash attention's core 2.5 times (it recomputes the scores:
                         Dao 2023, FlashAttention-2, section 3.1)
    attention core       at a large matmul's rate, or at the stack's attention kernel's where that is slower
                         (``cluster.attention_tflops_fwd`` and ``_bwd``: FlashAttention-2 on Hopper reaches about a
                         third of the bf16 peak, well under a large GEMM)
    memory-bound         norms and residuals 10 D per token (over tp with sequence parallelism), RoPE 2 (A + kv)
                         / tp, SwiGLU's element-wise 3 F / tp: read and written once forward, twice backward
    recompute            full: the block's forward again in backward; selective: its element-wise work (and the
                         attention core where the S x S matrices are not kept by flash attention), or under
                         Megatron's ``memory.recompute_modules`` what each names: layernorm the norms (4 D a token),
                         moe_act the routed experts' SwiGLU (3 k c F_e / tp), core_attn the attention core without
                         flash attention, under MindFormers' (``cluster.saved_activations=mindformers``) the
                         dense MLP's SwiGLU (3 F / tp; the norms' re-gathered outputs not priced); selective_op
                         (torchtitan's per-op policy): the element-wise work and every second weight matmul (wk,
                         wo, the MLP's up projection; the all-gathers it re-runs under TP are not counted)
    launches             the host's kernel launches, ``cluster.launch_overhead_us`` per block forward, twice
                         backward, once more with full recompute (selective's few kernels are not counted)
    fp8                  the weight matmuls above (not the router, the attention core or the head, which the
                         FP8 recipes of torchtitan and Transformer Engine keep in bf16) at ``cluster.peak_tflops_fp8``,
                         with the casts of tensorwise dynamic scaling as torchao's own roofline counts them
                         (torchao/float8/roofline_utils.py): forward the input (its max-abs fused into the kernel
                         that made it; read in bf16, written in FP8 row- and column-major: 4 bytes an element) and
                         the weight (a max-abs pass more: 6), backward the output gradient (4); backward reuses the
                         FP8 input and weight of the forward. FSDP gathers bf16 weights (FP8 all-gather not priced)

Collectives per block and micro-batch (bytes of the whole tensor; ``core.perf.links`` prices them):

    tp       2 all-reduces forward and 2 backward of T D (with sequence parallelism 2 all-gathers and 2
             reduce-scatters: natively the same volume); hidden by the share ``cluster.overlap_tp``
    cp       an all-gather of the keys and values of the whole sequence forward, a reduce-scatter of their
             gradients backward (``core.parallel.context_parallel``); hidden by ``cluster.overlap_cp``
    ep       2 all-to-alls forward (dispatch, combine) and 2 backward of the routed tokens, each share on the tier
             it crosses (``core.perf.links.expert_all_to_all``; with ``cluster.ep_dedup`` a token crosses the
             network once per remote node, as DeepEP dispatches); hidden by the share ``cluster.overlap_ep``
             (Megatron's all-to-all overlap with 1F1B; 0 by default: a dispatcher waits for its tokens). Under
             ``parallel.etp`` < tp (Megatron's MoE parallel folding, estimated only) each rank routes its own
             T etp / tp tokens to experts whole over ``etp`` ranks, and an MoE block without a shared expert has no
             MLP tp pair
    fsdp     an all-gather of the block's weights forward, again backward, and a reduce-scatter of its
             gradients (fp32 or bf16: ``cluster.reduce_precision``) (FSDP re-gathers in backward:
             ``core.parallel.fsdp``); with ``cluster.overlap_fsdp`` only what the block's compute cannot hide is
             exposed. None under ``parallel.dp_shard_strategy=optim`` (ZeRO-1, ``core.parallel.zero1``): the weights are
             whole on every rank, their gradients reduce-scattered and the updated weights gathered once a step
             (``core.perf.step``)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from core.config import ConfigError, TrainConfig
from core.model.flops import attention_matrices, param_groups
from core.parallel.placement import is_expert, tp_split_dim
from core.perf import links
from core.perf.device import Device, Link

FLASH_BACKWARD = 2.5  # flash attention's backward FLOPs over its forward's
FP8_CAST_BYTES = 4  # a bf16 element read, its FP8 copies written row- and column-major (for the backward's GEMMs)
FP8_AMAX_BYTES = 2  # the max-abs pass over a tensor no earlier kernel produced (the weight): read once more


@dataclass
class Pass:
    """Seconds of one forward or backward of a micro-batch through some blocks, by kind."""

    compute: float = 0.0
    recompute: float = 0.0
    launch: float = 0.0  # host time launching kernels (cluster.launch_overhead_us)
    comm: dict[str, float] = field(default_factory=dict)  # exposed communication by kind: tp, cp, ep, fsdp

    @property
    def total(self) -> float:
        return self.compute + self.recompute + self.launch + sum(self.comm.values())

    def add(self, other: Pass) -> None:
        self.compute += other.compute
        self.recompute += other.recompute
        self.launch += other.launch
        for kind, seconds in other.comm.items():
            self.comm[kind] = self.comm.get(kind, 0.0) + seconds

    def expose(self, kind: str, seconds: float) -> None:
        if seconds > 0:
            self.comm[kind] = self.comm.get(kind, 0.0) + seconds


@dataclass(frozen=True)
class Shape:
    """What the counts need of a config, resolved once."""

    tokens: float  # T: tokens of one micro-batch on one rank
    expert_tokens: float  # of them, those the rank routes: all (etp = tp, each computes its slice of every expert)
    # or its own share of the tp group's (T etp / tp) under a smaller etp
    act_bytes: int  # bytes per activation element (2 in bf16)
    weight_bytes: int  # bytes per compute copy of a weight (2 in bf16)
    flash: bool  # accelerators: flash attention (no S x S matrices, recomputed in backward)

    @classmethod
    def of(cls, cfg: TrainConfig) -> Shape:
        t, par, bf16 = cfg.training, cfg.parallel, cfg.compute_precision == "bf16"  # CPU's bf16 moves fp32
        tokens = t.micro_batch_size * t.seq_len / par.cp
        return cls(
            tokens=tokens,
            expert_tokens=tokens * par.expert_tp / par.tp,
            act_bytes=2 if bf16 else 4,
            weight_bytes=2 if bf16 else 4,
            flash=cfg.device != "CPU",
        )


@dataclass(frozen=True)
class BlockWork:
    """One micro-batch's forward through one block on one rank."""

    matmuls: list[tuple[float, float]]  # (FLOPs, smallest dimension) of each weight matmul, FP8 under fp8
    router: tuple[float, float]  # an MoE block's router, never FP8 ((0, 0) in a dense block)
    attention: tuple[float, float]  # the causal attention core: (FLOPs, head dim)
    elementwise_bytes: float  # memory-bound bytes read and written
    module_bytes: dict[str, float]  # of those, what Megatron's recompute modules re-run (layernorm, moe_act), and
    # MindFormers' select_recompute (swiglu)
    casts: tuple[float, float]  # bytes the weight matmuls' FP8 casts move under fp8: (forward, backward)


class _Matmuls:
    """The weight matmuls of a block as they are added: FLOPs with their rate-bounding dimension, and the bytes an
    FP8 run's casts move for them (forward: input and weight; backward: the output gradient)."""

    def __init__(self) -> None:
        self.items: list[tuple[float, float]] = []
        self.forward = self.backward = 0.0

    def add(self, tokens: float, out: float, inner: float, *, weights: float | None = None, smallest=None) -> None:
        """``tokens`` x ``inner`` times ``inner`` x ``out``; ``weights``: the weight's elements where several
        matrices take turns (experts); ``smallest``: the bounding dimension where the tokens split between them."""
        weights = out * inner if weights is None else weights
        self.items.append((2 * tokens * out * inner, min(tokens, out, inner) if smallest is None else smallest))
        self.forward += FP8_CAST_BYTES * tokens * inner + (FP8_AMAX_BYTES + FP8_CAST_BYTES) * weights
        self.backward += FP8_CAST_BYTES * tokens * out


def block_work(cfg: TrainConfig, i: int) -> BlockWork:
    """The counts of the module docstring for block ``i``."""
    m, par, sh = cfg.model, cfg.parallel, Shape.of(cfg)
    T, D, tp, S = sh.tokens, m.d_model, par.tp, cfg.training.seq_len
    mm, router = _Matmuls(), (0.0, 0.0)
    for name, (rows, cols) in attention_matrices(m).items():  # split by heads over tp, or (MLA's down) replicated
        dim = tp_split_dim(f"attn.{name}.weight")  # 0: heads' rows (column-parallel), 1: wo's columns
        mm.add(T, rows / (tp if dim == 0 else 1), cols / (tp if dim == 1 else 1))
    # causal attention: q k^T and p v over half the S x S pairs. Flash attention tiles it into large blocks of
    # queries and keys (its rate is a large matmul's); without it, per-head (S x hd) matmuls.
    heads = m.n_heads * (m.qk_head_size + m.v_head_size)  # q k^T's and p v's widths: 2 H E without MLA
    core = (T * S * heads / tp, T if sh.flash else m.head_size)
    if m.is_moe_layer(i):
        factor, mine = m.moe_capacity_factor or 1.0, sh.expert_tokens
        routed = mine * m.moe_top_k * factor  # token-expert pairs this rank's share of the experts computes
        per_expert, F = routed * par.ep / m.n_experts, m.expert_width / par.expert_tp
        router = (2 * mine * D * m.n_experts, min(mine, m.n_experts))
        for out, inner in ((F, D), (F, D), (D, F)):  # gate, up, down of this rank's experts
            mm.add(routed, out, inner, weights=m.n_experts / par.ep * out * inner, smallest=min(per_expert, F))
        width = m.expert_width * m.moe_shared_experts
        active = m.moe_top_k * factor * m.expert_width + width
    else:
        width = active = m.ffn_hidden
    if width:
        for out, inner in ((width / tp, D), (width / tp, D), (D, width / tp)):
            mm.add(T, out, inner, smallest=min(T, width / tp))
    rope = m.q_width + m.kv_width / 2  # q and k (MLA: each head's whole q and k, as concatenated)
    norms, routed_act = 4 * D / (tp if par.sp else 1), 3 * (active - width) / tp
    elementwise = T * sh.act_bytes * (norms + 6 * D / (tp if par.sp else 1) + 2 * rope / tp + 3 * active / tp)
    modules = {"layernorm": T * sh.act_bytes * norms, "moe_act": T * sh.act_bytes * routed_act}
    modules["swiglu"] = T * sh.act_bytes * 3 * width / tp  # the dense (or shared) MLP's: MindFormers' selective
    return BlockWork(mm.items, router, core, elementwise, modules, (mm.forward, mm.backward))


def launch_seconds(cfg: TrainConfig, dev: Device) -> float:
    """Host seconds per block forward: the kernel launches, and under PyNative each op's dispatch from Python."""
    if cfg.training.mode != "pynative":
        return dev.launch
    if dev.pynative is None:
        raise ConfigError(
            "cluster.pynative_overhead_us",
            f"profile {cfg.cluster.name!r} does not price training.mode=pynative; set cluster.pynative_overhead_us="
            "<host microseconds per block forward> or plan training.mode=jit",
        )
    return dev.launch + dev.pynative


def block_passes(cfg: TrainConfig, dev: Device, i: int, recompute: str) -> tuple[Pass, Pass]:
    """(forward, backward) of block ``i`` for one micro-batch on one rank; ``recompute``: none, selective,
    selective_op, full."""
    sh, w = Shape.of(cfg), block_work(cfg, i)
    core, elementwise, fp8 = w.attention, w.elementwise_bytes, cfg.training.precision == "fp8"
    weights = sum(dev.matmul_seconds(f, d, fp8=fp8) for f, d in w.matmuls) + dev.matmul_seconds(*w.router)
    casts = w.casts if fp8 else (0.0, 0.0)

    launch = launch_seconds(cfg, dev)
    fwd, bwd = Pass(launch=launch), Pass(launch=2 * launch)
    fwd.compute = weights + dev.attention_seconds(*core) + dev.memory_seconds(elementwise + casts[0])
    core_back = FLASH_BACKWARD if sh.flash else 2.0
    bwd.compute = (
        2 * weights
        + dev.attention_seconds(core_back * core[0], core[1], backward=True)
        + dev.memory_seconds(2 * elementwise + casts[1])
    )
    if recompute == "full":
        bwd.recompute, bwd.launch = fwd.compute, bwd.launch + fwd.launch
    elif recompute == "selective":
        modules = cfg.memory.recompute_modules  # Megatron's; None: the core's (every element-wise op, the core)
        if modules is None and cfg.cluster.saved_activations == "mindformers":
            modules = ["swiglu"]  # MindFormers' select_recompute: silu and the product (its comm re-runs unpriced)
        again = elementwise if modules is None else sum(w.module_bytes.get(name, 0.0) for name in modules)
        attention_again = not sh.flash and (modules is None or "core_attn" in modules)
        bwd.recompute = dev.memory_seconds(again) + (dev.attention_seconds(*core) if attention_again else 0.0)
    elif recompute == "selective_op":  # dense GQA (core.config.rules): wq wk wv wo gate up down; wk, wo, up re-run
        again = sum(dev.matmul_seconds(f, d, fp8=fp8) for f, d in w.matmuls[1::2])
        bwd.recompute = again + dev.memory_seconds(elementwise)
    _block_comm(cfg, dev, sh, i, fwd, bwd)
    return fwd, bwd


def _block_comm(cfg: TrainConfig, dev: Device, sh: Shape, i: int, fwd: Pass, bwd: Pass) -> None:
    m, par, c = cfg.model, cfg.parallel, cfg.cluster
    T, D = sh.tokens, m.d_model
    if par.tp > 1:
        link = links.group_link(par, ("tp",), dev)
        whole = T * D * sh.act_bytes
        if par.sp:  # an all-gather before attention and the MLP, a reduce-scatter after each
            one = links.all_gather(whole, par.tp, link) + links.reduce_scatter(whole, par.tp, link)
        else:
            one = links.all_reduce(whole, par.tp, link)
        # experts on fewer ranks than tp take each rank's own tokens (sequence-parallel): no MLP pair unless a
        # shared expert, split by tp, needs its tokens gathered
        folded = m.is_moe_layer(i) and par.expert_tp < par.tp and not m.moe_shared_experts
        seconds = (1 if folded else 2) * one * (1 - c.overlap_tp)
        fwd.expose("tp", seconds)
        bwd.expose("tp", seconds)
    if par.cp > 1:
        link = links.group_link(par, ("cp",), dev)
        whole = m.kv_width / par.tp * cfg.training.micro_batch_size * cfg.training.seq_len * sh.act_bytes
        seconds = links.all_gather(whole, par.cp, link) * (1 - c.overlap_cp)
        fwd.expose("cp", seconds)
        bwd.expose("cp", seconds)
    if m.is_moe_layer(i) and par.ep > 1:
        held = sh.expert_tokens * m.moe_top_k * (m.moe_capacity_factor or 1.0) * D * sh.act_bytes
        routing = (m.n_experts, m.moe_top_k) if cfg.cluster.ep_dedup else None
        seconds = 2 * links.expert_all_to_all(held, par, dev, routing=routing) * (1 - cfg.cluster.overlap_ep)
        fwd.expose("ep", seconds)
        bwd.expose("ep", seconds)
    experts = expert_numel(cfg, f"layers.{i}.") if par.experts_folded else 0.0  # FSDP over expert_dp ranks
    _fsdp_comm(cfg, dev, sh, sharded_numel(cfg, f"layers.{i}."), fwd, bwd, experts=experts)


def _fsdp_comm(cfg: TrainConfig, dev: Device, sh: Shape, weights: float, fwd: Pass, bwd: Pass, experts=0.0) -> None:
    """FSDP's gather of ``weights`` elements (over the dp_shard x cp ranks) and of folded ``experts`` (over
    ``ParallelConfig.expert_dp`` ranks) forward, again backward, and the reduce-scatter of their gradients; with
    ``cluster.overlap_fsdp`` only what the pass's compute cannot hide is exposed."""
    par, c = cfg.parallel, cfg.cluster
    if not par.shards_weights:  # ZeRO-1: whole weights on every rank, its traffic once a step (core.perf.step)
        return
    groups = sharding_groups(cfg, dev, weights, experts)
    if not groups:
        return
    gather = sum(links.all_gather(w * sh.weight_bytes, n, link) for w, n, link in groups)
    scatter = sum(links.reduce_scatter(w * c.reduce_bytes, n, link) for w, n, link in groups)
    fwd.expose("fsdp", gather if not c.overlap_fsdp else max(0.0, gather - fwd.compute))
    back = gather + scatter
    bwd.expose("fsdp", back if not c.overlap_fsdp else max(0.0, back - bwd.compute - bwd.recompute))


def sharding_groups(cfg: TrainConfig, dev: Device, weights: float, experts: float) -> list[tuple[float, int, Link]]:
    """(elements, ranks, link) of each group that shards weights, for the ``weights`` (over the dp_shard x cp
    ranks) and folded ``experts`` (over ``ParallelConfig.expert_dp`` ranks) of some blocks; groups of one rank or
    no elements left out. FSDP gathers over them per use (``_fsdp_comm``), ZeRO-1 once a step (``core.perf.step``)."""
    par = cfg.parallel
    groups = [
        (weights, par.dp_shard * par.cp, links.group_link(par, ("dp_shard", "cp"), dev)),
        (experts, par.expert_dp, links.group_link(par, ("dp_shard", "cp", "tp"), dev)),
    ]
    return [(w, n, link) for w, n, link in groups if w and n > 1]


def sharded_numel(cfg: TrainConfig, prefix: str) -> float:
    """Elements of the weights of owner ``prefix`` (``"layers.3."``: ``core.model.flops.param_groups``) that one
    rank holds of its tp share and FSDP gathers whole (experts split by expert parallelism are not gathered:
    ``core.parallel.expert_parallel``)."""
    par = cfg.parallel
    return sum(
        math.prod(shape) / par.tp
        for name, shape in param_groups(cfg.model).get(prefix, {}).items()
        if not (par.ep > 1 and is_expert(name))
    )


def expert_numel(cfg: TrainConfig, prefix: str) -> float:
    """Elements of the experts of owner ``prefix`` that one rank holds under expert parallelism, before FSDP (of
    folded experts, ``ParallelConfig.expert_dp``): its ep share of them, split by etp."""
    par = cfg.parallel
    if par.ep <= 1:
        return 0.0
    groups = param_groups(cfg.model).get(prefix, {})
    return sum(math.prod(shape) / par.expert_tp / par.ep for name, shape in groups.items() if is_expert(name))


def head_work(cfg: TrainConfig) -> tuple[float, float]:
    """The output head's forward matmul on one rank: (FLOPs, smallest dimension)."""
    m, par, T = cfg.model, cfg.parallel, Shape.of(cfg).tokens
    return 2 * T * m.d_model * m.vocab_size / par.tp, min(T, m.d_model, m.vocab_size / par.tp)


def edge_passes(cfg: TrainConfig, dev: Device, *, first: bool, last: bool) -> tuple[Pass, Pass]:
    """(forward, backward) of the embedding (first stage) and of the final norm, head and loss (last stage)."""
    m, par, sh = cfg.model, cfg.parallel, Shape.of(cfg)
    T, D, V = sh.tokens, m.d_model, m.vocab_size
    fwd, bwd = Pass(), Pass()
    names = []
    edges = int(first) + int(last)  # each launches about a block's kernels
    launch = launch_seconds(cfg, dev)
    fwd.launch, bwd.launch = edges * launch, 2 * edges * launch
    if first:
        fwd.compute += dev.memory_seconds(2 * T * D * sh.act_bytes)  # the lookup
        bwd.compute += dev.memory_seconds(2 * T * D * 4)  # the table's gradient, scattered
        names.append("embed.")
    if last:
        head = head_work(cfg)
        logits = T * V / par.tp * (sh.act_bytes + 4 + 4)  # logits, their fp32 copy, the loss's gradient
        fwd.compute += dev.matmul_seconds(*head) + dev.memory_seconds(logits)
        bwd.compute += dev.matmul_seconds(2 * head[0], head[1]) + dev.memory_seconds(logits)
        names += ["norm.", "lm_head."]
    _fsdp_comm(cfg, dev, sh, sum(sharded_numel(cfg, n) for n in names), fwd, bwd)
    return fwd, bwd
