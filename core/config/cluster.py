"""The cluster section of a trial's config: the devices a run is planned for and how fast they compute, hold and
talk. The step-time model (``core.perf``) reads it; the presets in ``configs/cluster/`` give each number with its
public source. Training reads nothing here: a trial runs on the processes it starts.

Bandwidths are per device and one direction, the way a ring collective uses a link: each device sends to one peer
and receives from another at once. Efficiencies are the achieved share of a peak, fitted (the profile file names
the published row it was fitted on, one per device at most) or measured on this machine (``cpu-local``).
No MindSpore here.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config.rules import positive, require

TOPOLOGIES = ("switched", "full_mesh")  # cluster.intra_node_topology's kinds (core.perf.device.Link.among)


@dataclass
class ClusterConfig:
    """The devices a run is planned for (``configs/cluster/<name>.yaml``); ``core.perf`` predicts a step on them."""

    name: str = "cpu-local"
    """The profile's name (``configs/cluster/<name>.yaml``)."""
    device: str = "CPU"
    """The device type of the profile: CPU, GPU or Ascend."""
    nodes: int = 1
    """Hosts in the run."""
    devices_per_node: int = 1
    """Devices (ranks) per host; nodes * devices_per_node must equal the parallel degrees' product in core.perf."""
    peak_tflops_fp32: float | None = None
    """Dense FP32 peak, TFLOP/s per device; null on cpu-local: the measured reference rate
    (``core.runtime.reference_rate``)."""
    peak_tflops_bf16: float | None = None
    """Dense BF16 peak, TFLOP/s per device (no sparsity); null: the device has no faster BF16 path (FP32's)."""
    peak_tflops_fp8: float | None = None
    """Dense FP8 tensor-core peak, TFLOP/s per device (no sparsity): the rate of ``training.precision=fp8``'s block
    matmuls; null: the device has no FP8 matmuls, and fp8 is refused."""
    memory_gib: float | None = None
    """Device memory per device, GiB; null: no limit is checked (cpu-local: a study's memory gate uses
    memory.limit_gb and the measured runtime profile instead)."""
    memory_bandwidth_gbps: float | None = None
    """Device memory bandwidth, GB/s: what memory-bound work (norms, element-wise ops, the optimizer) runs at;
    null on cpu-local: measured (``python -m core.perf calibrate``)."""
    intra_node_bandwidth_gbps: float | None = None
    """Per device, one direction, GB/s, to the other devices of its node; null on cpu-local: measured."""
    intra_node_latency_us: float | None = None
    """One small message between two devices of a node, microseconds (a collective's alpha per step); null on
    cpu-local: measured."""
    intra_node_topology: str = "switched"
    """How a node's devices are wired, which sets what a group of them reaches (``core.perf.links``).
    ``switched``: through switches (NVSwitch, a PCIe switch), so any group, a pair included, reaches
    intra_node_bandwidth_gbps per device. ``full_mesh``: a link from each device to each other device of its node
    (HCCS in an Atlas 800T A2: 7 links of 28 GB/s each way), intra_node_bandwidth_gbps the sum of a device's links:
    a group of k of the node's devices reaches (k - 1) / (devices_per_node - 1) of it, a pair one link; its
    collectives run as HCCL's mesh algorithm runs them, each rank sending to all its peers at once (one latency
    per phase, not a ring's k - 1). A ring of full-duplex links needs no kind of its own: a ring collective over a
    run of its devices uses one link each way, as a switch gives it. The network between nodes is switched in
    every profile (a NIC per device into the switches: InfiniBand rails, RoCE)."""
    inter_node_bandwidth_gbps: float | None = None
    """Per device, one direction, GB/s, across nodes; null: measured on cpu-local, or a single-node profile."""
    inter_node_latency_us: float | None = None
    """One small message across nodes, microseconds; null as inter_node_bandwidth_gbps."""
    matmul_efficiency: float | None = None
    """Achieved share of the peak by a large matmul (fitted per device: the profile names its row); null on
    cpu-local: fitted on this machine's 1-process trial (``python -m core.perf calibrate``)."""
    matmul_half_dim: int = 128
    """A matmul whose smallest dimension is this reaches half of matmul_efficiency (small shapes underfill the
    device)."""
    attention_tflops_fwd: float | None = None
    """What the stack's fused attention kernel achieves forward at long sequences, TFLOP/s (causal FLOPs: half of
    q k^T and p v, as FlashAttention's benchmarks count them), where it is slower than a large matmul: the
    attention core is priced at the slower of the two. Null: at the matmul rate. A property of the kernel the stack
    runs as much as of the device, so no profile sets it: e.g. FlashAttention-2 on an H100 SXM5 reaches 335
    (FlashAttention-3 paper, arXiv:2407.08608, Fig. 5, head dim 128, causal, 16k), where cuDNN's and
    FlashAttention-3's kernels run faster than the model's matmuls."""
    attention_tflops_bwd: float | None = None
    """The same kernel's backward, TFLOP/s (its FLOPs 2.5 times the forward's); e.g. FlashAttention-2 on an H100
    SXM5: 322 (ibid., Fig. 6, head dim 128, 16k). Null: at the matmul rate."""
    launch_overhead_us: float | None = 0.0
    """Host time to launch the kernels of one block for one micro-batch's forward, microseconds (its backward
    twice, a full recompute once more; the embedding and the head with the loss count as a block each). 0 on
    accelerators, whose graph-mode launches are asynchronous and hidden under device compute; null on cpu-local,
    where the host is the device and every launch adds to the step: measured (``python -m core.perf calibrate``)."""
    pynative_overhead_us: float | None = None
    """Host time added to launch_overhead_us under ``training.mode=pynative``, where each op is dispatched from
    Python instead of from a compiled graph, microseconds per block forward (counted as launches are). Null: not
    priced, and a pynative config is refused naming this key; on cpu-local measured by the calibration."""
    host_cores: float | None = None
    """How many processes one host runs at full speed at once, shared by its ranks for the work the host does
    itself: kernel launches, PyNative's dispatch, and on CPU the collectives. When a node's ranks outnumber them,
    each rank's launches and dispatch take ranks / host_cores times as long, and on CPU its collectives reach
    host_cores / ranks of the bandwidth and wait that much longer per ring step (the compute peak is shared
    already: ``core.perf.device``). Null: not a bottleneck (accelerators, whose hosts have a core per device and
    more); on cpu-local measured by the calibration (about 1 on a 2-vCPU machine, whose vCPUs share one core)."""
    collective_efficiency_intra: float = 0.8
    """Achieved share of the intra-node bandwidth by a large collective."""
    collective_efficiency_inter: float = 0.8
    """Achieved share of the inter-node bandwidth by a large collective."""
    memory_margin: float = 0.1
    """Allocator fragmentation and caches on top of the counted tensors, as a share of them (accelerators)."""
    memory_reserved_gib: float = 1.0
    """Memory a device process holds before the model (runtime context, communication buffers), GiB."""
    reduce_precision: str = "fp32"
    """Gradient reductions (FSDP reduce-scatter, data-parallel all-reduce) in fp32 (torchtitan's FSDP default;
    Megatron's for bf16 runs) or bf16 (Megatron's for fp16 runs, or bf16 ones with --grad-reduce-in-bf16): half the
    bytes. A gradient kept whole (no FSDP) is held in this precision too, as Megatron's gradient buffer takes the
    reduction's dtype (core.memory); FSDP's gradient shards stay fp32."""
    overlap_fsdp: bool = True
    """FSDP gathers the next block's weights while this block computes (prefetch), and reduces gradients while
    backward goes on: only what compute cannot hide is exposed."""
    overlap_dp: bool = True
    """Data-parallel gradient reduction runs under the last micro-batch's backward."""
    overlap_tp: float = 0.0
    """Share of tensor/sequence-parallel communication hidden under compute (0: exposed, as without async TP)."""
    overlap_cp: float = 0.0
    """Share of context parallelism's key/value gathers hidden under compute."""
    overlap_ep: float = 0.0
    """Share of the experts' all-to-alls (dispatch and combine) hidden under compute: 0, exposed, as a plain
    all-to-all dispatcher runs them; Megatron-LM's --overlap-moe-expert-parallel-comm runs one micro-batch's
    all-to-alls under another's compute in the 1F1B steady state (the MoE model zoo's "1F1B overlap")."""
    ep_dedup: bool = False
    """The experts' dispatch and combine across nodes as DeepEP's internode kernels run them: a token bound for
    several experts on one remote node crosses the network once and is forwarded over NVLink there
    (github.com/deepseek-ai/DeepEP); false: each routed copy crosses on its own (an NCCL all-to-all)."""
    saved_activations: str = "autograd"
    """What a block keeps for backward, by the stack that runs it. ``autograd``: what eager autograd keeps, as the
    core and torchtitan run: under sequence parallelism the gathered input of each region's column-parallel
    projections, SwiGLU's gate, up, silu and product, and under fp8 (torchao's float8) every input in bf16.
    ``megatron``: Megatron-LM's own autograd functions with Transformer Engine: a column-parallel projection keeps
    its sequence-parallel input's local shard and gathers it again in backward, under the input gradient's matmul
    (megatron/core/tensor_parallel/layers.py; TE's layernorm_linear.py, ``ln_out_needs_gather``), the fused SwiGLU
    keeps only its input (megatron/core/fusions/fused_bias_swiglu.py), and under fp8 each projection keeps its
    input's FP8 cast, one byte an element, two (row- and column-wise copies) where it is gathered again; flash
    attention keeps its output in bf16 beside the output projection's FP8 copy. ``mindformers``: MindSpore's
    autodiff keeps what autograd keeps, and ``memory.recompute=selective`` is MindFormers' select_recompute and
    select_comm_recompute with their default patterns, as its Llama configs set them together
    (docs/feature_cards/Offset_Recompute.md and mindformers/models/utils.py at 2388c729): the SwiGLU's silu and
    product recomputed (``feed_forward.mul``, ``feed_forward.w1.activation.silu``: its gate and up outputs kept), and
    the communication after each norm (``.*\\.norm``) re-run in backward: under sequence parallelism the norms'
    outputs kept as this rank's shard. The experts keep autograd's count. (``core.memory.activations``)"""
    loss: str = "fused"
    """How the stack takes the output head's logits through the loss: the bytes a logit holds at the loss's peak,
    the start of its backward. ``fused``: the core's cross-entropy with its own backward (``core.model.loss``): the
    logits and, in bf16, their fp32 copy (6 bytes; 4 in fp32). ``eager``: PyTorch's ``cross_entropy`` on a
    ``float()`` copy, as torchtitan ran it until it compiled the loss (train.py at 9dec370, 2024-12: "compiling loss
    function causes CUDA errors, turning off for now"): log-softmax's fp32 output, saved for backward, beside its
    gradient and the input's (12 bytes; the logits themselves freed by ``del pred`` before backward). ``compiled``:
    torch.compile's fused loss (torchtitan with training.compile from 2025, components/loss.py at e7c0cae): the
    logits kept for backward and their gradient, in the logits' precision (twice their bytes)."""
    master_weights: bool = True
    """Whether a 16-bit run keeps fp32 master weights beside its 16-bit compute copies (the core, torchtitan,
    Megatron-LM) or stores the weights in 16 bits and updates them in place, as MindFormers' configs with
    ``param_init_type: bfloat16`` or ``float16`` do (e.g. configs/llama2/finetune_llama2_70b_bf16_32p.yaml at
    2388c729). False counts no master and no copy: the weights and their gradients (MindSpore's take their weight's
    dtype) in 16 bits, reduced so (with cluster.reduce_precision=bf16), the optimizer's states in fp32 (MindFormers'
    FP32StateAdamWeightDecay and AdamW: mindformers/core/optim/adamw.py reads weight and gradient as fp32 and writes
    the weight back in its own dtype)."""
    stage_recompute: bool = True
    """Pipeline stages but the last recompute their forward in backward and keep only their inputs for the
    micro-batches in flight, as the core's pipeline runtime does (``core.parallel.pipeline.runtime``); false: each
    in-flight micro-batch keeps its saved activations and nothing is recomputed unless memory.recompute says so,
    as torchtitan, Megatron-LM and MindFormers run a pipeline (the accelerator profiles, whose published rows come
    from those stacks)."""

    def __post_init__(self):
        positive("cluster", self, "nodes", "devices_per_node", "matmul_half_dim")
        require(
            self.host_cores is None or self.host_cores > 0,
            "cluster.host_cores",
            f"must be > 0, or null (got {self.host_cores})",
        )
        require(
            self.device in ("CPU", "GPU", "Ascend"),
            "cluster.device",
            f"must be CPU, GPU or Ascend (got {self.device!r})",
        )
        for key in (
            "peak_tflops_fp32",
            "peak_tflops_bf16",
            "peak_tflops_fp8",
            "memory_gib",
            "memory_bandwidth_gbps",
            "intra_node_bandwidth_gbps",
            "inter_node_bandwidth_gbps",
            "attention_tflops_fwd",
            "attention_tflops_bwd",
        ):
            value = getattr(self, key)
            require(value is None or value > 0, f"cluster.{key}", f"must be > 0, or null (got {value})")
        for key in ("intra_node_latency_us", "inter_node_latency_us", "launch_overhead_us", "pynative_overhead_us"):
            value = getattr(self, key)
            require(value is None or value >= 0, f"cluster.{key}", f"must be >= 0, or null (got {value})")
        for key in ("memory_reserved_gib", "memory_margin"):
            require(getattr(self, key) >= 0, f"cluster.{key}", f"must be >= 0 (got {getattr(self, key)})")
        for key in (
            "collective_efficiency_intra",
            "collective_efficiency_inter",
        ):
            value = getattr(self, key)
            require(0 < value <= 1, f"cluster.{key}", f"must be in (0, 1] (got {value})")
        value = self.matmul_efficiency
        require(
            value is None or 0 < value <= 1, "cluster.matmul_efficiency", f"must be in (0, 1], or null (got {value})"
        )
        require(
            self.intra_node_topology in TOPOLOGIES,
            "cluster.intra_node_topology",
            f"must be {' or '.join(TOPOLOGIES)} (got {self.intra_node_topology!r})",
        )
        require(
            self.reduce_precision in ("fp32", "bf16"),
            "cluster.reduce_precision",
            f"must be fp32 or bf16 (got {self.reduce_precision!r})",
        )
        require(
            self.saved_activations in ("autograd", "megatron", "mindformers"),
            "cluster.saved_activations",
            f"must be autograd, megatron or mindformers (got {self.saved_activations!r})",
        )
        require(
            self.loss in ("fused", "eager", "compiled"),
            "cluster.loss",
            f"must be fused, eager or compiled (got {self.loss!r})",
        )
        for key in ("overlap_tp", "overlap_cp", "overlap_ep"):
            value = getattr(self, key)
            require(0 <= value <= 1, f"cluster.{key}", f"must be in [0, 1] (got {value})")

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def reduce_bytes(self) -> int:
        """Bytes per gradient element in reductions."""
        return 2 if self.reduce_precision == "bf16" else 4
