"""The typed configuration of one trial: a dataclass per section, each field documented where it is declared.

Hydra composes ``configs/train.yaml`` with the overrides (``core.config.compose``); OmegaConf merges the result
into these dataclasses, rejecting unknown keys and ill-typed values by their full key. Each section checks its
own fields in ``__post_init__``; ``TrainConfig`` then resolves what a null default means and runs the rules
between sections (``core.config.rules``). All of it happens before any process group starts or any tensor is
allocated: a rejected config costs no compute and exits with code 2.

A field's docstring (the string under it) is its documentation: ``python -m core.train --help`` prints it
(``core.config.docs``). No MindSpore here: the agent imports this to validate and estimate proposals cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from core.config.cluster import ClusterConfig
from core.config.model import ModelConfig
from core.config.rules import CROSS_SECTION_RULES, positive, require

PP_SCHEDULES = ("gpipe", "1f1b", "interleaved", "mpipe")
PP_TRANSPOSE_OVERFLOWS = ("full", "min")
DP_SHARD_STRATEGIES = ("optim_grads_params", "optim")  # Megatron-FSDP's names (data_parallel_sharding_strategy)
RECOMPUTE = ("none", "selective", "selective_op", "full")
SWAP_OPS = ("attention", "mlp", "norm")  # the parts of a block memory.swap_ops chooses from (core.memory.swap)
RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act")  # Megatron-LM's --recompute-modules the estimates count
DEVICES = ("CPU", "Ascend", "GPU")
PRECISIONS = ("fp32", "bf16", "fp8")
DEFAULT_GRACE_SEC = 30.0  # trial.grace_sec: the one home of the grace default (the agent's watchdog reads it)


@dataclass
class OptimConfig:
    """Optimizer, learning-rate schedule and clipping."""

    name: str = "adamw"
    """adamw, or muon (Muon on 2-D hidden weights; embeddings, head, routers and 1-D parameters take AdamW)."""
    lr: float = 3e-3
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of ``lr`` (cosine, linear, wsd)."""
    weight_decay: float = 0.1
    """Decoupled weight decay (Loshchilov & Hutter 2019); not applied to 1-D parameters."""
    beta1: float = 0.9
    """Adam's first-moment decay."""
    beta2: float = 0.95
    """Adam's second-moment decay."""
    eps: float = 1e-8
    """Adam's epsilon."""
    warmup_steps: int = 10
    """Linear warm-up steps."""
    schedule: str = "cosine"
    """Decay after warm-up: cosine, linear, wsd (warmup-stable-decay) or constant."""
    decay_ratio: float = 0.2
    """wsd: the fraction of the steps spent decaying, at the end."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables clipping (the norm is still computed)."""
    momentum: float = 0.95
    """Muon: Nesterov momentum."""
    ns_steps: int = 5
    """Muon: Newton-Schulz iterations."""

    def __post_init__(self):
        require(self.name in ("adamw", "muon"), "optim.name", f"must be adamw or muon (got {self.name!r})")
        require(
            self.schedule in ("cosine", "linear", "wsd", "constant"),
            "optim.schedule",
            f"must be cosine, linear, wsd or constant (got {self.schedule!r})",
        )
        positive("optim", self, "lr", "eps", "ns_steps")
        require(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        require(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        require(self.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (0 disables clipping)")
        require(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", "must be in [0, 1]")
        require(0 < self.decay_ratio <= 1, "optim.decay_ratio", "must be in (0, 1]")
        for name in ("beta1", "beta2", "momentum"):
            require(0 <= getattr(self, name) < 1, f"optim.{name}", "must be in [0, 1)")


@dataclass
class ParallelConfig:
    """Degrees of the device mesh (``core.parallel.dims``); their product is the world size.

    torchtitan's names: ``dp_replicate`` replicas (gradients all-reduced) of ``dp_shard`` ranks over which
    parameters, gradients and optimizer states are sharded (FSDP; both > 1: HSDP); ``cp`` splits the sequence
    (its ranks share the FSDP shards too), ``tp`` splits heads, FFN width and vocabulary (Megatron), ``sp`` adds
    sequence parallelism to the norm/residual regions of ``tp``.
    """

    dp_replicate: int = 1
    """Data-parallel replicas; their gradients are all-reduced."""
    dp_shard: int = 1
    """FSDP degree: parameters, gradients and optimizer states sharded over these ranks (HSDP with dp_replicate)."""
    dp_shard_strategy: str = "optim_grads_params"
    """What the dp_shard x cp ranks shard (Megatron-FSDP's names): optim_grads_params (ZeRO-3, FSDP: weights
    gathered for each use, gradients reduce-scattered each micro-batch; what the core trains) or optim (ZeRO-1,
    Megatron's distributed optimizer: fp32 master weights and optimizer states sharded, weights and gradients
    whole on every rank, the gradients reduce-scattered and the updated weights all-gathered once a step; folded
    experts likewise over ``expert_dp``; core.parallel.zero1 trains it, folded experts aside)."""
    tp: int = 1
    """Tensor parallelism: heads, KV heads, FFN width and vocabulary split over these ranks."""
    pp: int = 1
    """Pipeline stages (``core.parallel.pipeline``)."""
    cp: int = 1
    """Context parallelism: the sequence split into 2 * cp load-balanced chunks."""
    ep: int = 1
    """Expert parallelism: an MoE model's experts split over this many ranks of a pipeline stage's dp_shard x cp x
    tp block. The core trains ep = dp_shard (the experts over the FSDP ranks); any other ep that divides the block
    (with ``etp``: Megatron's MoE parallel folding) is estimated (core.perf, core.memory), not trained."""
    etp: int | None = None
    """Expert tensor parallelism: the ranks each expert's width splits over; null: ``tp`` (as the core trains).
    1 under tp > 1 keeps each expert whole (Megatron's ETP 1): the tp ranks route their own tokens (sequence
    parallelism) to experts spread over ep ranks ``etp`` apart. Estimated, not trained, unless it equals tp."""
    sp: bool = False
    """Sequence parallelism in the norm and residual regions (needs tp > 1)."""
    pp_schedule: str = "1f1b"
    """Pipeline schedule: gpipe, 1f1b, interleaved, or mpipe ((interleaved) 1F1B with stage 0's preprocess block
    run by the other ranks in their warm-up: MindSpore hyper-parallel's MPipe Transpose,
    ``core.parallel.pipeline.mpipe``)."""
    pp_virtual: int = 1
    """Stages per rank (the interleaved schedule, or mpipe's interleaved body)."""
    pp_transpose_layers: int = 0
    """mpipe: the blocks of stage 0 in its preprocess block with the embedding (T); 0 transposes the data loading
    alone."""
    pp_transpose_overflow: str = "full"
    """mpipe: who preprocesses the micro-batches past the first pp: full (round-robin over the ranks) or min
    (rank 0, inline)."""
    pp_layers: list[int] | None = None
    """Layers per stage, pp * pp_virtual of them (e.g. [1,3]; the first and last may be 0: the embedding, or the
    head and loss, alone, as Megatron counts them in its split); null: an even split, moved by ``pp_offset``."""
    pp_offset: int = 0
    """Layers moved from the last stage to the first on an even split (negative: the other way; MindFormers'
    offset): the embedding and the head are not free."""

    def __post_init__(self):
        positive("parallel", self, "dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "pp_virtual")
        require(
            self.pp_schedule in PP_SCHEDULES,
            "parallel.pp_schedule",
            f"must be {', '.join(PP_SCHEDULES[:-1])} or {PP_SCHEDULES[-1]} (got {self.pp_schedule!r})",
        )
        require(
            self.pp_virtual == 1 or self.pp_schedule in ("interleaved", "mpipe"),
            "parallel.pp_virtual",
            f"{self.pp_virtual} stages per rank need parallel.pp_schedule=interleaved (or mpipe); or set pp_virtual=1",
        )
        require(
            self.pp_schedule == "mpipe" or (self.pp_transpose_layers == 0 and self.pp_transpose_overflow == "full"),
            "parallel.pp_transpose_layers",
            "and pp_transpose_overflow shape the mpipe schedule; set parallel.pp_schedule=mpipe, or leave them at "
            "0 and full",
        )
        require(
            self.pp_transpose_layers >= 0,
            "parallel.pp_transpose_layers",
            f"must be >= 0 (got {self.pp_transpose_layers})",
        )
        require(
            self.pp_transpose_overflow in PP_TRANSPOSE_OVERFLOWS,
            "parallel.pp_transpose_overflow",
            f"must be full or min (got {self.pp_transpose_overflow!r})",
        )
        require(
            self.pp_schedule != "mpipe" or self.pp > 1,
            "parallel.pp_schedule",
            "mpipe transposes stage 0's preprocess to the other pipeline ranks; it needs parallel.pp > 1",
        )
        require(
            not self.sp or self.tp > 1,
            "parallel.sp",
            "sequence parallelism splits the tensor-parallel group's work; it needs parallel.tp > 1",
        )
        require(
            self.dp_shard_strategy in DP_SHARD_STRATEGIES,
            "parallel.dp_shard_strategy",
            f"must be {' or '.join(DP_SHARD_STRATEGIES)} (got {self.dp_shard_strategy!r})",
        )
        require(
            self.dp_shard_strategy != "optim" or self.dp_shard * self.cp > 1,
            "parallel.dp_shard_strategy",
            "optim shards the optimizer over the dp_shard x cp ranks, and there is one; set parallel.dp_shard > 1 "
            "or leave the strategy at optim_grads_params",
        )
        require(
            self.etp is None or (self.etp >= 1 and self.tp % self.etp == 0),
            "parallel.etp",
            f"{self.etp} must divide parallel.tp = {self.tp} (or be null: tp)",
        )

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp * self.cp

    @property
    def shards_weights(self) -> bool:
        """FSDP (ZeRO-3): the dp_shard x cp ranks (and folded experts' ``expert_dp``) hold weight and gradient
        shards, gathered for each use; False under ``dp_shard_strategy=optim`` (ZeRO-1), whose ranks shard only the
        master weights and the optimizer states."""
        return self.dp_shard_strategy == "optim_grads_params"

    @property
    def expert_tp(self) -> int:
        """The ranks an expert's width splits over: ``etp``, or ``tp`` when unset."""
        return self.tp if self.etp is None else self.etp

    @property
    def experts_folded(self) -> bool:
        """Experts laid out by Megatron's MoE parallel folding rather than as the core trains them (ep = dp_shard,
        etp = tp): estimated, not trained."""
        return self.ep > 1 and (self.ep != self.dp_shard or self.expert_tp != self.tp)

    @property
    def expert_dp(self) -> int:
        """Folded experts: the ranks of a pipeline stage's dp_shard x cp x tp block that hold the same experts
        (Megatron's EDP), over which their weights, gradients and states are FSDP-sharded (torchtitan's and
        Megatron-FSDP's layout). 1 otherwise: the core's expert copies over cp (or tp) compute the same gathered
        tokens (core.parallel.expert_parallel)."""
        return self.dp_shard * self.cp * self.tp // (self.ep * self.expert_tp) if self.experts_folded else 1

    @property
    def dp(self) -> int:
        """Ranks that see different rows of the batch."""
        return self.dp_replicate * self.dp_shard

    @property
    def stages(self) -> int:
        """Pipeline stages in all (pp * pp_virtual)."""
        return self.pp * self.pp_virtual

    def stage_split(self, n_layers: int) -> list[int]:
        """Layers per pipeline stage: ``pp_layers``, or even with ``pp_offset``."""
        if self.pp_layers is not None:
            return list(self.pp_layers)
        split = [n_layers // self.stages] * self.stages
        split[0] += self.pp_offset
        split[-1] -= self.pp_offset
        return split


@dataclass
class MemoryConfig:
    """Memory settings: activation recompute and SWAP, and the per-rank budget (``core.memory``)."""

    recompute: str = "none"
    """none, selective (norms, SwiGLU, attention's softmax) or full (whole blocks); ``core.memory.recompute``
    says how each runs under jit and in PyNative. selective_op is torchtitan's per-op policy (attention's output, the
    reduce-scatters and every second matmul's output saved, the rest recomputed): estimated (``core.memory``,
    ``core.perf``) for dense GQA blocks, not trained."""
    recompute_layers: int | None = None
    """Recompute the first this many blocks (of each pipeline stage); null: every block."""
    recompute_stage_layers: list[int] | None = None
    """One count per pipeline stage (pp * pp_virtual), in place of ``recompute_layers``: recompute the first this
    many blocks of each stage, 0 none. Early stages hold more micro-batches in flight, so they recompute more
    (MindFormers' per-stage ``select_recompute: [10, 8, 6, 4, 2, 0, 0, 0]``)."""
    recompute_stages: list[str] | None = None
    """One recompute setting per pipeline stage (pp * pp_virtual), overriding ``recompute``."""
    recompute_modules: list[str] | None = None
    """Megatron-LM's ``--recompute-modules``: what selective recompute drops and rebuilds in backward, in place of
    the core's own policy: core_attn (attention's S x S matrices, which flash attention never keeps), layernorm (the
    two norms' outputs), moe_act (the experts' activation output); null: the core's policy. Counted against what
    Megatron keeps (``cluster.saved_activations=megatron``): estimated, not trained."""
    swap: bool = False
    """Move saved activations to a slower tier until backward reads them (``core.memory.swap``; PyNative)."""
    swap_layers: int | None = None
    """Swap the first this many blocks (they wait longest); null: every block, and the tensors outside blocks
    too when ``swap_ops`` is null as well."""
    swap_ops: list[str] | None = None
    """Parts of a swapped block: attention, mlp, norm; null: all."""
    swap_prefetch: int = 0
    """Backward: when a block's tensors are first read, load the next this many blocks' in a background thread;
    0: each tensor when read (on CPU a prefetched block costs a block's memory and hides nothing)."""
    limit_gb: float | None = None
    """Per-rank memory budget in GiB; passing it ends the trial with exit 10 (oom). null: no budget."""

    def __post_init__(self):
        require(
            self.recompute in RECOMPUTE,
            "memory.recompute",
            f"must be one of {', '.join(RECOMPUTE)} (got {self.recompute!r})",
        )
        for value in self.recompute_stages or []:
            require(
                value in RECOMPUTE, "memory.recompute_stages", f"must be one of {', '.join(RECOMPUTE)} (got {value!r})"
            )
        require(
            self.recompute_layers is None or self.recompute_layers >= 1,
            "memory.recompute_layers",
            f"must be >= 1, or null for every block (got {self.recompute_layers})",
        )
        require(
            self.recompute_stage_layers is None or min(self.recompute_stage_layers, default=0) >= 0,
            "memory.recompute_stage_layers",
            f"must count blocks (>= 0) per stage, or be null (got {self.recompute_stage_layers})",
        )
        require(
            self.recompute_stage_layers is None or self.recompute_layers is None,
            "memory.recompute_stage_layers",
            "counts the recomputed blocks per stage in place of memory.recompute_layers; set one of them to null",
        )
        require(self.limit_gb is None or self.limit_gb > 0, "memory.limit_gb", "must be > 0 or null")
        require(
            self.swap_layers is None or self.swap_layers >= 1,
            "memory.swap_layers",
            f"must be >= 1, or null for every block (got {self.swap_layers})",
        )
        for value in self.swap_ops or []:
            require(
                value in SWAP_OPS,
                "memory.swap_ops",
                f"must name parts of a block among {', '.join(SWAP_OPS)}, or be null for all (got {value!r})",
            )
        require(
            self.swap_ops is None or len(self.swap_ops) > 0,
            "memory.swap_ops",
            f"must name at least one of {', '.join(SWAP_OPS)}, or be null for all (got [])",
        )
        require(
            self.swap_prefetch >= 0, "memory.swap_prefetch", f"must be >= 0 (0: no prefetch; got {self.swap_prefetch})"
        )
        for value in self.recompute_modules or []:
            require(
                value in RECOMPUTE_MODULES,
                "memory.recompute_modules",
                f"must name Megatron-LM recompute modules among {', '.join(RECOMPUTE_MODULES)}, or be null for the "
                f"core's selective recompute (got {value!r})",
            )
        defaults = {f.name: f.default for f in fields(MemoryConfig)}
        for name in ("swap_layers", "swap_ops", "swap_prefetch"):  # settings of swap, meaningless without it
            require(
                self.swap or getattr(self, name) == defaults[name],
                f"memory.{name}",
                "chooses what activation SWAP moves; set memory.swap=true, or leave it at its default",
            )

    def recompute_of(self, stage: int) -> str:
        """The recompute setting of pipeline stage ``stage`` (of the whole model without a pipeline)."""
        return self.recompute_stages[stage] if self.recompute_stages else self.recompute

    def recompute_layers_of(self, stage: int) -> int | None:
        """How many leading blocks of pipeline stage ``stage`` recompute (None: all of them)."""
        return self.recompute_stage_layers[stage] if self.recompute_stage_layers is not None else self.recompute_layers

    @property
    def recompute_settings(self) -> set[str]:
        """Every recompute setting some stage uses."""
        return set(self.recompute_stages or [self.recompute])


@dataclass
class DataConfig:
    """The token files a trial reads (``core.data``)."""

    train_path: str | None = None
    """Token file: ``.bin`` with its ``.json`` sidecar (``python -m core.data prepare``) or a Megatron indexed dataset
    (``.bin`` + ``.idx``, named by either file or their prefix); null: the embedded corpus."""
    blend: list[str] | None = None
    """Datasets sampled in proportion to weights, Megatron's form: ``[0.7, path_a, 0.3, path_b]`` (instead of
    ``train_path``); each path as ``train_path`` takes it."""
    val_path: str | None = None
    """Held-out token file; null with ``train_path`` null: the embedded corpus's validation split."""
    token_dtype: str | None = None
    """uint16 or uint32, only for raw files without a ``.json`` sidecar."""

    def blend_pairs(self) -> tuple[list[float], list[str]]:
        """(weights, paths) of ``blend``."""
        return [float(w) for w in self.blend[::2]], [str(p) for p in self.blend[1::2]]

    def __post_init__(self):
        if self.blend is not None:
            require(self.train_path is None, "data.blend", "replaces data.train_path; set one of them")
            require(
                len(self.blend) >= 2 and len(self.blend) % 2 == 0,
                "data.blend",
                f"must be [weight, path, weight, path, ...] (got {len(self.blend)} items)",
            )
            for w in self.blend[::2]:
                try:
                    ok = float(w) > 0
                except (TypeError, ValueError):
                    ok = False
                require(ok, "data.blend", f"weights must be numbers > 0 (got {w!r}), each before its path")
        require(
            self.token_dtype in (None, "uint16", "uint32"),
            "data.token_dtype",
            "must be uint16, uint32 or null (read from the file's sidecar)",
        )
        require(
            self.val_path is None or self.train_path is not None or self.blend is not None,
            "data.val_path",
            "needs data.train_path or data.blend too (the embedded corpus brings its own validation split)",
        )


@dataclass
class TrainingConfig:
    """Batch, sequence and how a step runs."""

    global_batch_size: int = 8
    """Sequences per optimizer step, over all data-parallel ranks."""
    micro_batch_size: int | None = None
    """Sequences per forward/backward on one rank; null: global_batch_size / data-parallel degree (no
    gradient accumulation)."""
    seq_len: int = 64
    """Tokens per sequence."""
    mode: str = "jit"
    """jit (``mindspore.jit`` around forward+backward) or pynative."""
    log_interval: int = 1
    """Steps between lines of ``metrics.jsonl``."""
    eval_interval: int = 0
    """Steps between validation passes; 0: only at the end."""
    health_interval: int = 0
    """Steps between the L2 norms of each block's gradients and parameters (embedding, every transformer block,
    final norm, head) in ``metrics.jsonl``, to see where a divergence starts; 0: never."""
    max_attention_logit: float | None = None
    """Stop the trial as ``nan`` (exit 12) when a step's largest attention logit (q k^T times the softmax scale,
    over every layer, head, micro-batch and rank) exceeds this: logits that grow without bound come before loss
    spikes and divergence (Dehghani et al. 2023; Kimi K2's MuonClip; MindFormers' MaxLogits check), so the trial
    stops paying before its loss does. Tracked whenever set, and recorded in each line of ``metrics.jsonl`` and the
    summary's ``metrics.max_attention_logit``; null: not tracked (no cost)."""
    eval_batches: int = 2
    """Global batches of fixed validation windows per validation pass."""
    profile: bool = False
    """Profile the steps after the first two (``core.runtime.profiling``): ``metrics.comm_time_share``."""
    precision: str = "fp32"
    """fp32, bf16 or fp8. bf16: bf16 compute copies of the weights and bf16 activations, fp32 master weights,
    gradient reductions, optimizer state and loss (``core.model.precision``); on CPU emulated
    (``TrainConfig.compute_precision``): bf16's numbers at about fp32's speed and memory. fp8: bf16 whose blocks'
    weight matmuls run in FP8 with dynamic scaling (torchtitan's Float8Linear, Transformer Engine's current
    scaling), on a cluster with FP8 matmuls (``cluster.peak_tflops_fp8``): estimated (``core.perf``,
    ``core.memory``) for the stacks that train it, not trained by the core (``core.config.rules.RUN_RULES``)."""

    def __post_init__(self):
        positive("training", self, "global_batch_size", "seq_len", "log_interval", "eval_batches")
        require(
            self.micro_batch_size is None or self.micro_batch_size > 0,
            "training.micro_batch_size",
            "must be > 0 or null (null: global_batch_size / data-parallel degree, no accumulation)",
        )
        require(self.mode in ("jit", "pynative"), "training.mode", f"must be jit or pynative (got {self.mode!r})")
        require(self.eval_interval >= 0, "training.eval_interval", "must be >= 0")
        require(self.health_interval >= 0, "training.health_interval", "must be >= 0")
        require(
            self.max_attention_logit is None or self.max_attention_logit > 0,
            "training.max_attention_logit",
            "must be > 0, or null for no check",
        )
        require(
            self.precision in PRECISIONS,
            "training.precision",
            f"must be {' or '.join(PRECISIONS)} (got {self.precision!r})",
        )


@dataclass
class ExecutionConfig:
    """How graphs compile and run (``core.runtime.settings``; the space of ``search_spaces/compile.yaml``)."""

    jit_level: str = "O0"
    """O0, or O1 (MindSpore's common graph optimisations and operator fusion)."""
    capture_mode: str = "ast"
    """How ``mindspore.jit`` turns Python into a graph: ast or bytecode."""
    graph_kernel_fusion: bool = False
    """Fuse element-wise ops into generated kernels (AKG); a kernel it cannot build is exit 11."""
    kernel_threads: int | None = None
    """Kernel thread pool; null: this rank's share of the cores."""
    dispatch_threads: int | None = None
    """Runtime (actor) threads; null: MindSpore's default."""
    host_pipeline: bool | None = None
    """MindSpore's asynchronous host queues; null: off on CPU (waiting on them spins a core the kernels need),
    on elsewhere."""
    eval_mode: str = "auto"
    """Validation under training.mode=jit: jit, pynative, or auto (compiled only when the trial validates more
    than once)."""
    compile_cache: bool = True
    """Load graphs that a finished trial of the same code and graph config compiled (``core.runtime.compile_cache``);
    not with graph_kernel_fusion."""
    compile_cache_dir: str | None = None
    """Where the compile cache lives; null: ``~/.cache/mindspore-autoresearch/compile``
    (``core.runtime.cache_dirs``)."""
    cpu_kernels: bool | None = None
    """The clipping norm and AdamW as fused C++ kernels (``core.runtime.kernels``); null: on for CPU when built."""

    def __post_init__(self):
        require(self.jit_level in ("O0", "O1"), "execution.jit_level", f"must be O0 or O1 (got {self.jit_level!r})")
        require(
            self.eval_mode in ("auto", "jit", "pynative"),
            "execution.eval_mode",
            f"must be auto, jit or pynative (got {self.eval_mode!r})",
        )
        require(
            self.capture_mode in ("ast", "bytecode"),
            "execution.capture_mode",
            f"must be ast or bytecode (got {self.capture_mode!r})",
        )
        for name in ("kernel_threads", "dispatch_threads"):
            value = getattr(self, name)
            require(value is None or value >= 1, f"execution.{name}", f"must be >= 1, or null (got {value})")


@dataclass
class TrialConfig:
    """The trial's budgets and directory (the trial contract: ``core.trial``)."""

    max_steps: int | None = 20
    """Step budget; null: run until the wall budget."""
    max_wall_time_sec: float | None = None
    """Wall budget in seconds from process start; exit 13 (timeout) if it ends before the step budget."""
    grace_sec: float = DEFAULT_GRACE_SEC
    """A run still alive this long after its wall budget is killed."""
    dir: str | None = None
    """The trial directory; null: ``trials/manual/<timestamp>``."""

    def __post_init__(self):
        require(
            self.max_steps is not None or self.max_wall_time_sec is not None,
            "trial.max_steps",
            "set trial.max_steps or trial.max_wall_time_sec: a trial needs a budget",
        )
        require(self.max_steps is None or self.max_steps > 0, "trial.max_steps", "must be > 0 or null")
        require(
            self.max_wall_time_sec is None or self.max_wall_time_sec > 0,
            "trial.max_wall_time_sec",
            "must be > 0 or null",
        )
        require(self.grace_sec >= 0, "trial.grace_sec", "must be >= 0")


@dataclass
class CheckpointConfig:
    """Checkpoints of the run (``core.ckpt``)."""

    interval: int = 0
    """Save every this many steps; 0: never during the run."""
    at_end: bool = False
    """Save when the trial ends normally."""
    resume: str | None = None
    """A checkpoint directory to resume from (written by any layout), or auto: the latest in
    ``<trial.dir>/checkpoints``."""
    keep: int = 2
    """Newest checkpoints kept."""
    async_save: bool = False
    """Write checkpoints in the background: the tensors are copied to host memory, the steps go on while each rank
    writes its file, and the checkpoint is published (its index written, the step directory renamed into place)
    after the next step, or at the end of the trial; until then it is invisible, never half there."""
    load_weights: str | None = None
    """Weights to start from (at step 0, the optimizer fresh): a Hugging Face model directory, ``hf:<dir>``, read
    into any layout, each rank cutting its shards; its config must give this model (start from ``model=hf:<dir>``).
    A checkpoint that ``resume`` finds wins."""

    def __post_init__(self):
        require(
            self.load_weights is None or self.load_weights.startswith("hf:"),
            "checkpoint.load_weights",
            "must be hf:<dir> (a Hugging Face model directory); a checkpoint of this project is read by "
            "checkpoint.resume",
        )
        require(self.interval >= 0, "checkpoint.interval", "must be >= 0")
        require(self.keep >= 1, "checkpoint.keep", "must be >= 1")


@dataclass
class TrainConfig:
    """One trial: the sections above, the seed and the device."""

    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    trial: TrialConfig = field(default_factory=TrialConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    seed: int = 0
    """Seeds the weights and the data order: the same seed gives the same run on every layout."""
    device: str = "CPU"
    """CPU here; Ascend in production (GPU is accepted as MindSpore's)."""

    def __post_init__(self):
        require(
            self.device in DEVICES,
            "device",
            f"must be {', '.join(DEVICES[:-1])} or {DEVICES[-1]} (got {self.device!r})",
        )
        self._resolve_defaults()
        for rule in CROSS_SECTION_RULES:
            rule(self)

    def _resolve_defaults(self) -> None:
        """What a null default means, filled in before any rule reads it: ``training.micro_batch_size`` null is
        the whole per-rank batch (no accumulation). Left null where the batch does not split over the data-parallel
        ranks: the rule ``batch_splits_over_data_parallel`` then names the field."""
        t, dp = self.training, self.parallel.dp
        if t.micro_batch_size is None and t.global_batch_size % dp == 0:
            t.micro_batch_size = t.global_batch_size // dp

    @property
    def compute_precision(self) -> str:
        """How the trainer computes ``training.precision``: ``fp32``, ``bf16``, or ``bf16-emulated`` on CPU (fp8: as
        bf16).

        CPU workaround: MindSpore 2.10 has no CPU bf16 kernel for MatMul, BatchMatMul, Softmax, Sigmoid,
        Rsqrt, ReduceSum or Gather (benchmarks/RESULTS.md, "bf16 on CPU"), so on CPU every value an accelerator
        would hold in bf16 is rounded to bf16 and kept in fp32 storage, and the arithmetic runs in fp32 (as an
        accelerator's matmul accumulates). The loss curve is bf16's; step time and memory are fp32's plus the
        rounding, so the estimates count an emulated run as fp32.
        """
        p = self.training.precision
        p = "bf16" if p == "fp8" else p  # fp8 is its matmuls' rate (core.perf); every value it holds is bf16's
        return "bf16-emulated" if p == "bf16" and self.device == "CPU" else p

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches per optimizer step on each rank."""
        return self.training.global_batch_size // (self.training.micro_batch_size * self.parallel.dp)

    @property
    def preprocess_trains(self) -> bool:
        """mpipe: whether its preprocess block (the embedding and the first ``pp_transpose_layers`` blocks) has
        weights that train, so that rank 0 sends them every step and recomputes the block in backward
        (``core.parallel.pipeline.mpipe``); a frozen block (``model.freeze_embedding``, ``model.freeze_layers``)
        is only run forward where it is."""
        T, m = self.parallel.pp_transpose_layers, self.model
        return T > 0 and not (m.freeze_embedding and m.freeze_layers >= T)

    @property
    def eval_compiled(self) -> bool:
        """Whether validation runs as a compiled graph. ``execution.eval_mode=auto``: only if the trial validates
        more than once; one pass over the validation batches costs less op by op than compiling its graph first
        (benchmarks/RESULTS.md, "Start-up: what a trial compiles and waits for")."""
        t, e = self.training, self.execution
        if t.mode != "jit" or e.eval_mode == "pynative":
            return False
        max_steps = self.trial.max_steps
        return e.eval_mode == "jit" or (t.eval_interval > 0 and (max_steps is None or max_steps > t.eval_interval))


# The sections of a TrainConfig, by key (``core.config.compose.from_dict`` rebuilds them; ``docs`` lists them).
SECTIONS = {
    "model": ModelConfig,
    "optim": OptimConfig,
    "parallel": ParallelConfig,
    "memory": MemoryConfig,
    "data": DataConfig,
    "training": TrainingConfig,
    "execution": ExecutionConfig,
    "trial": TrialConfig,
    "checkpoint": CheckpointConfig,
    "cluster": ClusterConfig,
}
