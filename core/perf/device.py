"""A cluster profile turned into the rates the step-time model divides by: FLOP/s for a matmul of a given shape,
bytes/s of device memory, and a link (bandwidth, latency) per tier. Everything in SI units (seconds, bytes).

Each block's forward of a micro-batch also pays ``launch_overhead_us`` of host time (its backward twice): nothing
on accelerators, whose graph-mode launches hide under device compute; on a CPU the host is the device, and a
micro-batch of few tokens costs mostly launches (``model=tiny``, 1 process, 8 micro-batches of 256 tokens: 6,096
tokens/s measured, 14,993 predicted from FLOPs and bytes alone; benchmarks/data/table_layouts.json, collected at
258c677).

The achieved matmul rate is ``peak * matmul_efficiency * d / (d + matmul_half_dim)`` with ``d`` the matmul's
smallest dimension: a large matmul reaches the fitted efficiency, a thin one (few tokens per micro-batch, a narrow
tensor-parallel shard) underfills the device. On ``cpu-local`` the peak is the machine's measured reference rate
(``core.runtime.reference_rate``, read from its cache, never measured here), shared by the node's ranks.

Ranks that outnumber their host's cores (``cluster.host_cores``) share them for the host's own work as well:
launches and dispatch take ranks / cores times as long, and on CPU so do the collectives (``_host_run``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from core.config import ClusterConfig, ConfigError
from core.runtime.cache_dirs import cache_root
from core.runtime.files import write_atomic
from core.runtime.reference_rate import cache_path, machine_key

TFLOPS, GBPS, US = 1e12, 1e9, 1e-6


@dataclass(frozen=True)
class Link:
    """What a collective over one tier achieves: bytes/s per device and direction, seconds per message step.
    ``mesh``: 0 on a switched tier, where any group reaches ``bandwidth``; else the links each device has on a
    full mesh (``cluster.intra_node_topology``), ``bandwidth`` their sum."""

    bandwidth: float
    latency: float
    composed: bool = False  # every collective is an all-reduce here (see composes_collectives)
    mesh: int = 0

    def among(self, n: int) -> float:
        """Bytes/s per device and direction over a group of ``n`` devices of this tier: all of ``bandwidth``
        through a switch; on a full mesh the links to its n - 1 peers, all used at once."""
        if not self.mesh or n <= 1:  # (a group of one sends nothing)
            return self.bandwidth
        return self.bandwidth * min(n - 1, self.mesh) / self.mesh

    def steps(self, n: int) -> int:
        """Message steps of one phase of a collective over ``n`` devices (a reduce-scatter, an all-gather): n - 1
        around a ring; one on a full mesh, where each device sends to all its peers at once."""
        return 1 if self.mesh and n > 1 else n - 1


@dataclass(frozen=True)
class Device:
    peak_flops: float  # FLOP/s of one device at the trial's precision (fp8: bf16's, its FP8 matmuls' in fp8_flops)
    efficiency: float
    half_dim: int
    memory_bandwidth: float  # bytes/s
    memory_bytes: float | None
    launch: float  # host seconds to launch one block's kernels forward (cluster.launch_overhead_us)
    intra: Link
    inter: Link
    devices_per_node: int
    pynative: float | None = None  # host seconds more per block forward under PyNative; None: not priced
    fp8_flops: float | None = None  # FLOP/s of an FP8 matmul (training.precision=fp8); None: none run in FP8
    attention: tuple[float | None, float | None] = (None, None)  # FLOP/s of the stack's attention kernel,
    # (forward, backward); None: at the matmul rate (cluster.attention_tflops_fwd, _bwd)

    def matmul_seconds(self, flops: float, smallest_dim: float, *, fp8: bool = False) -> float:
        """A matmul of ``flops`` whose smallest dimension is ``smallest_dim``; ``fp8``: one that a trial in fp8
        runs in FP8 (at the same fitted efficiency: FP8 rows are held out, none fitted)."""
        if flops <= 0:
            return 0.0
        peak = self.fp8_flops if fp8 else self.peak_flops
        return flops / (peak * self.efficiency * smallest_dim / (smallest_dim + self.half_dim))

    def attention_seconds(self, flops: float, smallest_dim: float, *, backward: bool = False) -> float:
        """The fused attention core of ``flops``: a large matmul's time, or the stack's kernel's where that kernel
        is slower (``cluster.attention_tflops_fwd``, ``_bwd``)."""
        seconds = self.matmul_seconds(flops, smallest_dim)
        rate = self.attention[backward]
        return seconds if rate is None else max(seconds, flops / rate)

    def memory_seconds(self, nbytes: float) -> float:
        return nbytes / self.memory_bandwidth


def memory_bytes(cluster: ClusterConfig) -> float | None:
    """One device's memory (None where the profile gives no size), known without measuring anything."""
    return None if cluster.memory_gib is None else cluster.memory_gib * 2**30


def device(cluster: ClusterConfig, precision: str) -> Device:
    """The rates of ``cluster``'s devices at ``precision``; a number the profile leaves null and nothing measured
    gives is a ConfigError naming the key."""
    half = precision in ("bf16", "fp8") and cluster.peak_tflops_bf16  # fp8: its other matmuls run in bf16
    peak = cluster.peak_tflops_bf16 if half else cluster.peak_tflops_fp32
    if peak is None and cluster.device == "CPU":
        peak = _reference_rate(cluster) / TFLOPS / cluster.devices_per_node  # the node's cores, shared by its ranks
    measured = measured_numbers() if cluster.device == "CPU" else {}

    def need(key: str, value: float | None = None) -> float:
        return _need(cluster, key, measured, value)

    share = _host_share(cluster, measured)
    host = _host_run(cluster, share)

    def link(tier: str, efficiency: float, mesh: int = 0) -> Link:
        bandwidth = need(f"{tier}_node_bandwidth_gbps") * GBPS * efficiency / host
        return Link(bandwidth, need(f"{tier}_node_latency_us") * US * host, composes_collectives(cluster), mesh)

    pynative = _known(cluster, "pynative_overhead_us", measured)
    return Device(
        peak_flops=need("peak_tflops_fp32", peak) * TFLOPS,
        efficiency=need("matmul_efficiency"),
        half_dim=cluster.matmul_half_dim,
        memory_bandwidth=need("memory_bandwidth_gbps") * GBPS,
        memory_bytes=memory_bytes(cluster),
        launch=need("launch_overhead_us") * US * share,
        intra=link("intra", cluster.collective_efficiency_intra, mesh_links(cluster)),
        # a single node's groups never leave it: its inter-node link is never used
        inter=Link(float("inf"), 0.0) if cluster.nodes == 1 else link("inter", cluster.collective_efficiency_inter),
        devices_per_node=cluster.devices_per_node,
        pynative=None if pynative is None else pynative * US * share,
        fp8_flops=need("peak_tflops_fp8") * TFLOPS if precision == "fp8" else None,
        attention=tuple(
            None if r is None else r * TFLOPS for r in (cluster.attention_tflops_fwd, cluster.attention_tflops_bwd)
        ),
    )


def _host_share(cluster: ClusterConfig, measured: dict) -> float:
    """How many of a node's ranks share each of its host cores (at least 1): the factor by which a rank's host work
    slows (``cluster.host_cores``, else the calibration's; 1 when neither gives it)."""
    cores = _known(cluster, "host_cores", measured)
    return max(1.0, cluster.devices_per_node / cores) if cores else 1.0


def _host_run(cluster: ClusterConfig, share: float) -> float:
    """CPU workaround, priced as it runs: MindSpore's CPU collectives copy and sum on the host and wait for peers
    that share its cores, so with more ranks per core each rank's share of the bandwidth falls and each ring step
    takes longer, in proportion (the all-reduce micro-benchmark on 4 ranks of 2 vCPUs against 2 ranks, bandwidth
    and latency moved by this rule: benchmarks/RESULTS.md, "Step-time model"). Accelerators' collectives run on
    the devices and their links."""
    return share if cluster.device == "CPU" else 1.0


def mesh_links(cluster: ClusterConfig) -> int:
    """The links each device has to its node's others on a full mesh (``Link.mesh``), 0 on a switched node."""
    return cluster.devices_per_node - 1 if cluster.intra_node_topology == "full_mesh" else 0


def composes_collectives(cluster: ClusterConfig) -> bool:
    """CPU workaround, priced as it runs: MindSpore's CPU collectives lack reduce-scatter and all-to-all and gather
    only on the world group, so the core composes every collective from AllReduce there
    (``core.parallel.comm.collectives.compose_from_all_reduce``): an all-gather costs an all-reduce of the whole
    tensor, not (n - 1) / n of it."""
    return cluster.device == "CPU"


def _known(cluster: ClusterConfig, key: str, measured: dict) -> float | None:
    """The profile's number, else the machine's calibration's, else None (a number only some configs need)."""
    value = getattr(cluster, key)
    return measured.get(key) if value is None else value


def _need(cluster: ClusterConfig, key: str, measured: dict, value: float | None = None) -> float:
    """The profile's number, else the machine's calibration's (``measured``: a CPU profile's), else a
    ConfigError naming the key."""
    value = _known(cluster, key, measured) if value is None else value
    if value is None:
        fix = f"set cluster.{key}=<value>"
        if cluster.device == "CPU":
            fix = f"run `python -m core.perf calibrate [--micro]` to measure this machine, or {fix}"
        raise ConfigError(f"cluster.{key}", f"profile {cluster.name!r} gives no value; {fix}")
    return value


def calibration_path() -> Path:
    return cache_root() / "perf_calibration.json"


# What a fitted number means depends on the model it was fitted through: an entry of another method is stale
# (2: collectives priced as the core composes them on CPU, ``composes_collectives``; 3: kernel launches priced;
# 4: PyNative's dispatch priced; 5: the link from the all-reduce micro-benchmark, host cores shared by ranks).
CALIBRATION_METHOD = 5


def calibration() -> dict | None:
    """This machine's cpu-local calibration (``core.perf.calibrate``), or None when it has none or it was fitted
    through an older model (``CALIBRATION_METHOD``)."""
    return _entry(calibration_path(), CALIBRATION_METHOD)


def _entry(path: Path, method: int) -> dict | None:
    """This machine's entry of a cache table (``machine key -> entry``), or None without one of ``method``."""
    try:
        entry = json.loads(path.read_text()).get(machine_key("CPU"))
    except (OSError, ValueError):
        return None
    return entry if entry and entry.get("method") == method else None


def store(path: Path, entry: dict) -> None:
    """Write this machine's ``entry`` into the cache table at ``path``, beside other machines' (atomically)."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    table[machine_key("CPU")] = entry
    write_atomic(path, json.dumps(table, indent=2) + "\n")


def _reference_rate(cluster: ClusterConfig) -> float:
    """The cached reference rate of this machine (FLOP/s of the whole host), without measuring it."""
    try:
        entry = json.loads(cache_path().read_text()).get(machine_key("CPU"))
    except (OSError, ValueError):
        entry = None
    if not entry:
        raise ConfigError(
            "cluster.peak_tflops_fp32",
            f"profile {cluster.name!r} takes this machine's reference rate, which is not measured yet: run "
            "`python -m core.reference_rate`, or set cluster.peak_tflops_fp32",
        )
    return float(entry["flops_per_sec"])


def micro_path() -> Path:
    return cache_root() / "perf_micro.json"


MICRO_METHOD = 1  # what the micro-benchmarks measure and how (core.perf.micro); an entry of another is stale


def micro_calibration() -> dict | None:
    """This machine's micro-benchmarks (``core.perf.micro``: ``numbers``, ``seconds``, ``device_seconds``,
    ``date``), or None when they have not run here (or ran an older method)."""
    return _entry(micro_path(), MICRO_METHOD)


def measured_numbers() -> dict:
    """The numbers a cpu-local profile leaves null, as this machine measured them: its calibration on trials
    (``calibration``) where it has one, else its micro-benchmarks (``micro_calibration``), else none."""
    return calibration() or (micro_calibration() or {}).get("numbers") or {}
