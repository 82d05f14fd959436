"""Typed configuration of one trial.

Hydra composes ``configs/train.yaml`` with the command-line overrides; the result is merged into the
structured schema below (OmegaConf rejects unknown keys and ill-typed values, naming the full key) and turned
into these dataclasses, whose ``__post_init__`` checks the rules between fields. Every rule runs before any
process group starts or any tensor is allocated: a rejected config costs no compute and exits with code 2.

This module must not import MindSpore: the agent imports it to validate and estimate proposals cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from core.config_rules import ConfigError, check_layout, positive, require, selective_costs_memory

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


@dataclass
class ModelConfig:
    """A GPT (Llama-style block: RMSNorm, RoPE, GQA attention, SwiGLU MLP)."""

    name: str = "tiny"
    vocab_size: int = 256          # byte-level tokenizer by default
    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int = 2            # grouped-query attention: n_heads % n_kv_heads == 0
    ffn_hidden: int = 384          # SwiGLU hidden width
    max_seq_len: int = 256         # RoPE table length; training.seq_len must not exceed it
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True    # lm_head shares the token embedding
    init_std: float = 0.02         # residual projections use init_std / sqrt(2 * n_layers) (GPT-2)
    # Mixture of experts (core.model.moe): n_experts > 0 replaces the MLP of every block after the dense ones.
    n_experts: int = 0             # routed experts; 0: a dense model
    moe_top_k: int = 2             # experts per token
    moe_router: str = "softmax"    # softmax (Mixtral) | sigmoid (DeepSeek-V3) scores; the top k renormalised
    moe_capacity_factor: Optional[float] = None  # slots per expert: moe_capacity(); null: dropless
    moe_aux_loss_weight: float = 0.01  # load-balance loss (Switch) weight
    moe_shared_experts: int = 0    # experts every token uses (DeepSeek-MoE), as one MLP of that many widths
    moe_dense_layers: int = 0      # the first blocks keep a dense MLP
    moe_ffn_hidden: Optional[int] = None  # each expert's width; null: ffn_hidden

    def __post_init__(self):
        positive("model", self, "vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "ffn_hidden",
                 "max_seq_len", "rope_theta", "norm_eps", "init_std")
        require(self.d_model % self.n_heads == 0, "model.d_model",
                f"must be divisible by model.n_heads={self.n_heads} (got {self.d_model})")
        require((self.d_model // self.n_heads) % 2 == 0, "model.d_model",
                "head dim (d_model / n_heads) must be even for RoPE")
        require(self.n_heads % self.n_kv_heads == 0, "model.n_kv_heads",
                f"must divide model.n_heads={self.n_heads} (got {self.n_kv_heads})")
        require(self.n_experts >= 0, "model.n_experts", f"must be >= 0 (got {self.n_experts})")
        if self.n_experts:
            require(1 <= self.moe_top_k <= self.n_experts, "model.moe_top_k",
                    f"must be between 1 and model.n_experts={self.n_experts} (got {self.moe_top_k})")
            require(self.moe_router in ("softmax", "sigmoid"), "model.moe_router",
                    f"must be softmax or sigmoid (got {self.moe_router!r})")
            require(self.moe_capacity_factor is None or self.moe_capacity_factor > 0, "model.moe_capacity_factor",
                    f"must be > 0, or null for dropless routing (got {self.moe_capacity_factor})")
            require(self.moe_aux_loss_weight >= 0, "model.moe_aux_loss_weight", "must be >= 0")
            require(self.moe_shared_experts >= 0, "model.moe_shared_experts", "must be >= 0")
            require(0 <= self.moe_dense_layers < self.n_layers, "model.moe_dense_layers",
                    f"must leave at least one MoE block of model.n_layers={self.n_layers}")
            require(self.moe_ffn_hidden is None or self.moe_ffn_hidden > 0, "model.moe_ffn_hidden", "must be > 0")

    def is_moe_layer(self, i: int) -> bool:
        """Whether block ``i`` has a mixture of experts (every block after the dense ones, in an MoE model)."""
        return self.n_experts > 0 and i >= self.moe_dense_layers

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass
class OptimConfig:
    """Optimizer, learning-rate schedule and clipping."""

    name: str = "adamw"            # adamw | muon (muon: 2-D hidden weights; embeddings, head, 1-D -> AdamW)
    lr: float = 3e-3               # peak learning rate
    min_lr_ratio: float = 0.1      # final lr = lr * min_lr_ratio (cosine, linear, wsd)
    weight_decay: float = 0.1      # decoupled (Loshchilov & Hutter 2019); not applied to 1-D params
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    warmup_steps: int = 10
    schedule: str = "cosine"       # cosine | linear | wsd | constant
    decay_ratio: float = 0.2       # wsd: fraction of steps spent decaying at the end
    grad_clip: float = 1.0         # global grad-norm clip; 0 disables
    momentum: float = 0.95         # muon: Nesterov momentum
    ns_steps: int = 5              # muon: Newton-Schulz iterations

    def __post_init__(self):
        require(self.name in ("adamw", "muon"), "optim.name", f"must be adamw or muon (got {self.name!r})")
        require(self.schedule in ("cosine", "linear", "wsd", "constant"), "optim.schedule",
                f"must be cosine, linear, wsd or constant (got {self.schedule!r})")
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

    dp_replicate: int = 1          # data-parallel replicas; gradients all-reduced between them
    dp_shard: int = 1              # FSDP degree: parameters, gradients, optimizer states sharded (HSDP with dp_replicate)
    tp: int = 1                    # tensor parallel: heads, KV heads, FFN width and vocabulary split
    pp: int = 1                    # pipeline stages (core.parallel.pipeline)
    cp: int = 1                    # context parallel: the sequence split into 2*cp load-balanced chunks
    ep: int = 1                    # expert parallel: an MoE model's experts split over the dp_shard ranks
    sp: bool = False               # sequence parallel in the norm/residual regions (with tp > 1)
    pp_schedule: str = "1f1b"      # gpipe | 1f1b | interleaved
    pp_virtual: int = 1            # stages per rank (the interleaved schedule)
    pp_layers: Optional[list[int]] = None  # layers per stage (pp * pp_virtual of them); null: an even split ...
    pp_offset: int = 0             # ... with this many layers moved from the last stage to the first (negative:
                                   # the other way; MindFormers' offset): the embedding and the head are not free

    def __post_init__(self):
        positive("parallel", self, "dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "pp_virtual")
        require(self.pp_schedule in ("gpipe", "1f1b", "interleaved"), "parallel.pp_schedule",
                f"must be gpipe, 1f1b or interleaved (got {self.pp_schedule!r})")
        require(self.pp_virtual == 1 or self.pp_schedule == "interleaved", "parallel.pp_virtual",
                f"{self.pp_virtual} stages per rank need parallel.pp_schedule=interleaved; or set pp_virtual=1")
        require(not self.sp or self.tp > 1, "parallel.sp",
                "sequence parallelism splits the tensor-parallel group's work; it needs parallel.tp > 1")
        require(self.ep == 1 or (self.dp_shard * self.cp * self.tp) % self.ep == 0, "parallel.ep",
                f"{self.ep} must divide dp_shard * cp * tp = {self.dp_shard * self.cp * self.tp} (experts borrow "
                "those ranks)")

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp * self.cp

    def stage_split(self, n_layers: int) -> list[int]:
        """Layers per pipeline stage (pp * pp_virtual stages): ``pp_layers``, or even with ``pp_offset``."""
        if self.pp_layers is not None:
            return list(self.pp_layers)
        stages = self.pp * self.pp_virtual
        split = [n_layers // stages] * stages
        split[0] += self.pp_offset
        split[-1] -= self.pp_offset
        return split

    @property
    def dp(self) -> int:
        """Ranks that see different rows of the batch."""
        return self.dp_replicate * self.dp_shard


RECOMPUTE = ("none", "selective", "full")
SWAP_OPS = ("attention", "mlp", "norm")  # the parts of a block memory.swap_ops chooses from (core.swap)


@dataclass
class MemoryConfig:
    recompute: str = "none"        # none | selective (norms, SwiGLU, attention's softmax) | full (whole blocks);
                                   # core.recompute says how each runs under jit and PyNative
    recompute_layers: Optional[int] = None  # recompute the first this many blocks (of each stage); null: all
    recompute_stages: Optional[list[str]] = None  # per pipeline stage (pp * pp_virtual), overriding recompute
    swap: bool = False             # saved activations to a slower tier until backward (core.swap; PyNative)
    swap_layers: Optional[int] = None  # swap the first this many blocks (they wait longest); null: all, and the
                                   # tensors outside blocks too when swap_ops is null as well
    swap_ops: Optional[list[str]] = None  # parts of a swapped block: attention, mlp, norm; null: all
    swap_prefetch: int = 0         # backward: when a block's tensors are first read, load the next this many
                                   # blocks' in a background thread; 0: each tensor when read (on CPU each
                                   # prefetched block costs a block's memory and hides nothing: core.swap)
    limit_gb: Optional[float] = None  # per-rank memory budget; exceeding it ends the trial with exit 10

    def __post_init__(self):
        require(self.recompute in RECOMPUTE, "memory.recompute",
                f"must be one of {', '.join(RECOMPUTE)} (got {self.recompute!r})")
        for value in self.recompute_stages or []:
            require(value in RECOMPUTE, "memory.recompute_stages",
                    f"must be one of {', '.join(RECOMPUTE)} (got {value!r})")
        require(self.recompute_layers is None or self.recompute_layers >= 1, "memory.recompute_layers",
                f"must be >= 1, or null for every block (got {self.recompute_layers})")
        require(self.limit_gb is None or self.limit_gb > 0, "memory.limit_gb", "must be > 0 or null")
        require(self.swap_layers is None or self.swap_layers >= 1, "memory.swap_layers",
                f"must be >= 1, or null for every block (got {self.swap_layers})")
        for value in self.swap_ops or []:
            require(value in SWAP_OPS, "memory.swap_ops",
                    f"must name parts of a block among {', '.join(SWAP_OPS)}, or be null for all (got {value!r})")
        require(self.swap_ops is None or len(self.swap_ops) > 0, "memory.swap_ops",
                f"must name at least one of {', '.join(SWAP_OPS)}, or be null for all (got [])")
        require(self.swap_prefetch >= 0, "memory.swap_prefetch",
                f"must be >= 0 (0: no prefetch; got {self.swap_prefetch})")
        defaults = {f.name: f.default for f in fields(MemoryConfig)}
        for name in ("swap_layers", "swap_ops", "swap_prefetch"):  # settings of swap, meaningless without it
            require(self.swap or getattr(self, name) == defaults[name], f"memory.{name}",
                    "chooses what activation SWAP moves; set memory.swap=true, or leave it at its default")

    def recompute_of(self, stage: int) -> str:
        """The recompute setting of pipeline stage ``stage`` (of the whole model without a pipeline)."""
        return self.recompute_stages[stage] if self.recompute_stages else self.recompute


@dataclass
class DataConfig:
    train_path: Optional[str] = None   # token file (.bin, from `python -m core.data prepare`); null: embedded corpus
    val_path: Optional[str] = None     # held-out token file; null with train_path null: the corpus's val split
    token_dtype: Optional[str] = None  # uint16 | uint32, only for raw files without a .json sidecar

    def __post_init__(self):
        require(self.token_dtype in (None, "uint16", "uint32"), "data.token_dtype",
                "must be uint16, uint32 or null (read from the file's sidecar)")
        require(self.val_path is None or self.train_path is not None, "data.val_path",
                "needs data.train_path too (the embedded corpus brings its own validation split)")


@dataclass
class TrainingConfig:
    global_batch_size: int = 8     # sequences per optimizer step, over all data-parallel ranks
    micro_batch_size: Optional[int] = None  # sequences per forward/backward on one rank; null: no accumulation
    seq_len: int = 64
    mode: str = "jit"              # jit (mindspore.jit around forward+backward) | pynative
    log_interval: int = 1
    eval_interval: int = 0         # steps between validation passes; 0: only at the end
    eval_batches: int = 2          # global batches of fixed validation windows per validation pass
    profile: bool = False          # profile the steps after the first two (core.profiling): comm_time_share

    def __post_init__(self):
        positive("training", self, "global_batch_size", "seq_len", "log_interval", "eval_batches")
        require(self.micro_batch_size is None or self.micro_batch_size > 0, "training.micro_batch_size",
                "must be > 0 or null (null: global_batch_size / data-parallel degree, no accumulation)")
        require(self.mode in ("jit", "pynative"), "training.mode", f"must be jit or pynative (got {self.mode!r})")
        require(self.eval_interval >= 0, "training.eval_interval", "must be >= 0")


@dataclass
class ExecutionConfig:
    """How graphs compile and run (core.execution; the space of search_spaces/compile.yaml)."""
    jit_level: str = "O0"          # O0 | O1 (MindSpore's common graph optimisations and operator fusion)
    capture_mode: str = "ast"      # ast | bytecode: how mindspore.jit turns Python into a graph
    graph_kernel_fusion: bool = False  # fuse element-wise ops into generated kernels (AKG); may fail: exit 11
    kernel_threads: Optional[int] = None    # kernel thread pool; null: this rank's share of the cores
    dispatch_threads: Optional[int] = None  # runtime (actor) threads; null: MindSpore's default
    host_pipeline: Optional[bool] = None    # MindSpore's asynchronous host queues; null: off on CPU, where waiting
                                            # on them spins a core the kernels need (core.execution), on elsewhere
    eval_mode: str = "auto"        # auto | jit | pynative: validation under training.mode=jit; auto: compiled only
                                   # when the trial validates more than once (config_rules.eval_compiled)
    compile_cache: bool = True     # load graphs a finished trial of the same code and graph config compiled
                                   # (core.compile_cache); not with graph_kernel_fusion
    compile_cache_dir: Optional[str] = None  # null: core.user_cache (~/.cache/mindspore-autoresearch/compile)
    cpu_kernels: Optional[bool] = None  # the clipping norm and AdamW as fused kernels (core.kernels); null: on CPU

    def __post_init__(self):
        require(self.jit_level in ("O0", "O1"), "execution.jit_level", f"must be O0 or O1 (got {self.jit_level!r})")
        require(self.eval_mode in ("auto", "jit", "pynative"), "execution.eval_mode",
                f"must be auto, jit or pynative (got {self.eval_mode!r})")
        require(self.capture_mode in ("ast", "bytecode"), "execution.capture_mode",
                f"must be ast or bytecode (got {self.capture_mode!r})")
        for name in ("kernel_threads", "dispatch_threads"):
            value = getattr(self, name)
            require(value is None or value >= 1, f"execution.{name}", f"must be >= 1, or null (got {value})")


@dataclass
class TrialConfig:
    max_steps: Optional[int] = 20          # step budget; null: run until the wall budget
    max_wall_time_sec: Optional[float] = None  # wall budget from process start; exit 13 if it ends first
    grace_sec: float = 30.0                # a run still alive this long after its wall budget is killed
    dir: Optional[str] = None              # default: trials/manual/<timestamp>

    def __post_init__(self):
        require(self.max_steps is not None or self.max_wall_time_sec is not None, "trial.max_steps",
                "set trial.max_steps or trial.max_wall_time_sec: a trial needs a budget")
        require(self.max_steps is None or self.max_steps > 0, "trial.max_steps", "must be > 0 or null")
        require(self.max_wall_time_sec is None or self.max_wall_time_sec > 0, "trial.max_wall_time_sec",
                "must be > 0 or null")
        require(self.grace_sec >= 0, "trial.grace_sec", "must be >= 0")


@dataclass
class CheckpointConfig:
    interval: int = 0              # save every N steps; 0: never during the run
    at_end: bool = False           # save when the trial ends normally
    resume: Optional[str] = None   # a checkpoint directory, or "auto": the latest in <trial.dir>/checkpoints
    keep: int = 2                  # newest checkpoints kept

    def __post_init__(self):
        require(self.interval >= 0, "checkpoint.interval", "must be >= 0")
        require(self.keep >= 1, "checkpoint.keep", "must be >= 1")


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    trial: TrialConfig = field(default_factory=TrialConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    seed: int = 0
    device: str = "CPU"            # CPU here; Ascend in production

    def __post_init__(self):
        require(self.device in ("CPU", "Ascend", "GPU"), "device", f"must be CPU, Ascend or GPU (got {self.device!r})")
        require(not (self.execution.cpu_kernels and self.device != "CPU"), "execution.cpu_kernels",
                f"the fused kernels run on the host CPU, not on {self.device}; set it to null or false")
        t, p = self.training, self.parallel
        require(t.seq_len <= self.model.max_seq_len, "training.seq_len",
                f"{t.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}; lower it or raise model.max_seq_len")
        check_layout(self.model, t, p)
        stages = p.pp * p.pp_virtual
        require(self.memory.recompute_stages is None or len(self.memory.recompute_stages) == stages,
                "memory.recompute_stages", f"needs one setting per pipeline stage (pp * pp_virtual = {stages}), "
                f"got {self.memory.recompute_stages}")
        settings = set(self.memory.recompute_stages or [self.memory.recompute])
        require(not ("selective" in settings and selective_costs_memory(self.device, t.mode)),
                "memory.recompute", "selective recompute raises the peak under training.mode=jit on CPU (measured "
                "1.10x of none: the recomputation is compiled on top of the saved graph, benchmarks/RESULTS.md "
                "'Recompute'); use memory.recompute=full, which runs as compiled segments there, or training.mode="
                "pynative")
        if self.memory.swap:
            require(t.mode == "pynative", "memory.swap", "needs training.mode=pynative: under jit the compiled graph "
                    "owns the tensors it saves and no hook can move them (core.swap); or set memory.swap=false")
            require(p.pp == 1 and settings == {"none"}, "memory.swap",
                    "runs without a pipeline and without recompute (the combinations are not built); set "
                    "parallel.pp=1 and memory.recompute=none, or memory.swap=false")
        for name in ("recompute_layers", "swap_layers"):
            r = getattr(self.memory, name)
            require(r is None or r <= self.model.n_layers, f"memory.{name}",
                    f"{r} exceeds model.n_layers={self.model.n_layers}; lower it, or set it to null for every block")
        require(t.global_batch_size % p.dp == 0, "training.global_batch_size",
                f"{t.global_batch_size} must be a multiple of the data-parallel degree {p.dp} "
                "(parallel.dp_replicate * parallel.dp_shard)")
        if t.micro_batch_size is None:
            t.micro_batch_size = t.global_batch_size // p.dp
        per_step = t.micro_batch_size * p.dp
        require(t.global_batch_size % per_step == 0, "training.global_batch_size",
                f"{t.global_batch_size} must be a multiple of micro_batch_size * data-parallel degree "
                f"= {t.micro_batch_size} * {p.dp} = {per_step}")
        require(p.pp_schedule != "interleaved" or p.pp == 1 or self.grad_accum_steps % p.pp == 0,
                "parallel.pp_schedule", f"interleaved needs the micro-batches per step ({self.grad_accum_steps} = "
                f"global_batch_size / (micro_batch_size * dp)) to be a multiple of pp={p.pp}; change "
                "training.micro_batch_size or the batch, or use 1f1b")
        require(self.checkpoint.interval == 0 or self.trial.max_steps is None
                or self.checkpoint.interval <= self.trial.max_steps, "checkpoint.interval",
                "is longer than trial.max_steps, so no checkpoint would be written; lower it or set 0")

    @property
    def grad_accum_steps(self) -> int:
        return self.training.global_batch_size // (self.training.micro_batch_size * self.parallel.dp)


def compose(overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """Hydra-compose ``configs/train.yaml`` with ``overrides``; returns the raw OmegaConf tree."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name="train", overrides=list(overrides))


def _config_error_from_omegaconf(exc: Exception) -> ConfigError:
    key = getattr(exc, "full_key", None) or "config"
    msg = str(exc).splitlines()[0]
    return ConfigError(key, f"{msg} (check the key's spelling and type: `python -m core.train --help`)")


def _unknown_override(exc: Exception) -> ConfigError:
    """Hydra says "Could not override 'model.foo'" or "Key 'foo' is not in struct"; name the key either way."""
    import re

    text = str(exc)
    missing = re.search(r"Could not find '(\w+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        options = sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))
        return ConfigError(group, f"no option {option!r} in configs/{group}/; choose one of {', '.join(options)}")
    m = re.search(r"override '([^']+)'", text) or re.search(r"Key '([^']+)'", text)
    key = m.group(1) if m else "overrides"
    cause = exc.__cause__ or exc.__context__
    detail = (str(cause) if cause else text).splitlines()[0]
    return ConfigError(key, f"{detail}. Unknown keys are rejected: check the spelling against configs/train.yaml")


def from_container(raw: dict) -> TrainConfig:
    """Validate a plain dict (e.g. a resolved config.yaml) into a TrainConfig."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), raw)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise _config_error_from_omegaconf(exc) from exc


def load_config(overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Compose, type-check and cross-check; raises ConfigError naming the field and the fix."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        raw = compose(overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise _unknown_override(exc) from exc
    return from_container(OmegaConf.to_container(raw, resolve=True))


def to_dict(cfg: TrainConfig) -> dict:
    from dataclasses import asdict

    return asdict(cfg)


def from_dict(d: dict) -> TrainConfig:
    """The TrainConfig that ``to_dict`` made ``d`` from, rebuilt (and re-checked) without Hydra or OmegaConf: how
    a supervisor hands its validated config to its workers, each of which would otherwise spend ~1 s of CPU
    composing it again (measured: ``load_config`` 1.0 s, this ~1 ms)."""
    sections = {f.name: globals()[f.type] for f in fields(TrainConfig) if f.type in globals()}
    return TrainConfig(**{k: sections[k](**v) if k in sections else v for k, v in d.items()})


__all__ = [
    "CONFIG_DIR", "ConfigError", "ModelConfig", "OptimConfig", "ParallelConfig", "MemoryConfig", "DataConfig",
    "TrainingConfig", "ExecutionConfig", "TrialConfig", "CheckpointConfig", "TrainConfig", "load_config",
    "from_container", "to_dict", "from_dict",
    "compose",
]
