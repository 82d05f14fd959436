"""Collectives on the mesh: which tier a process group's traffic crosses, and what each collective costs there.

The mesh is laid out as ``core.parallel.dims.MESH`` (pp, dp_replicate, dp_shard, cp, tp; tp innermost) and
ranks fill nodes in order, so a group over some axes spans ``stride(outermost axis) * degree(outermost axis)``
consecutive ranks: inside one node when that fits in ``devices_per_node``, across nodes otherwise (and then the
slower tier bounds the ring).

Costs are the alpha-beta model of the ring algorithms (Thakur et al. 2005; NCCL's "bus bandwidth"): for n ranks and
a full tensor of B bytes, all-reduce 2(n-1)/n * B / bw + 2(n-1) * alpha; all-gather and reduce-scatter (n-1)/n *
B / bw + (n-1) * alpha; all-to-all (n-1)/n * B / bw + (n-1) * alpha (B: what one rank holds before); point-to-point
B / bw + alpha. ``bw`` is what the group reaches on its tier (the profile's collective efficiency times its peak,
per device and direction): all of it through a switch, the links to its peers on a full mesh (``Link.among``: an
8-NPU HCCS node's TP4 group reaches 3/7 of a device's links, a pipeline's pair one), whose collectives send to every
peer at once, one latency per phase (HCCL's mesh algorithm: ``Link.steps``). An all-to-all over several nodes is
point-to-point sends to every peer (NCCL's), so the shares for peers on the rank's node and for the other nodes
cross their own tiers at once (``group_all_to_all``): max((l-1)/n * B / bw_intra, (n-l)/n * B / bw_inter) with l of
the n ranks on each node; the experts' dispatch under DeepEP sends the network's share once per remote node
(``node_dedup``). On a link whose collectives are composed from all-reduce (the core on CPU: ``Link.composed``) each
is priced as the all-reduce it runs.
"""

from __future__ import annotations

import math

from core.config import ParallelConfig
from core.parallel.dims import MESH
from core.perf.device import Device, Link


def degree(par: ParallelConfig, axis: str) -> int:
    return getattr(par, axis)


def group_link(par: ParallelConfig, axes: tuple[str, ...], dev: Device) -> Link:
    """The tier a group over ``axes`` (names of ``MESH``) crosses."""
    outer = min(MESH.index(a) for a in axes)
    span = math.prod(degree(par, a) for a in MESH[outer:])
    return dev.intra if span <= dev.devices_per_node else dev.inter


def all_reduce(nbytes: float, n: int, link: Link) -> float:
    return 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / link.among(n) + 2 * link.steps(n) * link.latency


def all_gather(nbytes: float, n: int, link: Link) -> float:
    """All-gather of a tensor of ``nbytes`` when whole."""
    if n <= 1:
        return 0.0
    if link.composed:  # the local block among zeros, all-reduced
        return all_reduce(nbytes, n, link)
    return (n - 1) / n * nbytes / link.among(n) + link.steps(n) * link.latency


def reduce_scatter(nbytes: float, n: int, link: Link) -> float:
    """Reduce-scatter of a tensor of ``nbytes`` when whole."""
    if link.composed:  # the whole tensor all-reduced, this rank's block kept
        return all_reduce(nbytes, n, link)
    return all_gather(nbytes, n, link)


def all_to_all(nbytes: float, n: int, link: Link) -> float:
    """All-to-all of the ``nbytes`` one rank holds."""
    if n <= 1:
        return 0.0
    if link.composed:  # every rank's whole tensor all-gathered (composed), this rank's blocks selected
        return all_gather(n * nbytes, n, link)
    return (n - 1) / n * nbytes / link.among(n) + link.steps(n) * link.latency


def group_all_to_all(
    nbytes: float, par: ParallelConfig, axis: str, dev: Device, *, routing: tuple[int, int] | None = None
) -> float:
    """All-to-all of the ``nbytes`` one rank holds over the group of ``axis``, each share on the tier it crosses
    (module docstring)."""
    stride = math.prod(degree(par, a) for a in MESH[MESH.index(axis) + 1 :])
    return strided_all_to_all(nbytes, degree(par, axis), stride, dev, routing=routing)


def expert_all_to_all(
    nbytes: float, par: ParallelConfig, dev: Device, *, routing: tuple[int, int] | None = None
) -> float:
    """All-to-all of the ``nbytes`` one rank routes to the experts' ranks: in the layout the core trains (ep =
    dp_shard, etp = tp) the dp_shard group; otherwise Megatron's folding, ``ep`` ranks ``etp`` apart in the
    pipeline stage's dp_shard x cp x tp block (its expert mesh orders etp innermost, then ep). ``routing``
    (experts, top_k): deduplicated per node as DeepEP dispatches (``cluster.ep_dedup``, ``node_dedup``)."""
    if not par.experts_folded:
        return group_all_to_all(nbytes, par, "dp_shard", dev, routing=routing)
    return strided_all_to_all(nbytes, par.ep, par.expert_tp, dev, routing=routing)


def strided_all_to_all(
    nbytes: float, n: int, stride: int, dev: Device, *, routing: tuple[int, int] | None = None
) -> float:
    """All-to-all of the ``nbytes`` one rank holds over ``n`` ranks ``stride`` apart (ranks fill nodes in order);
    with ``routing``, the network's share deduplicated per node (``node_dedup``)."""
    local = max(1, min(n, dev.devices_per_node // stride))
    link = dev.intra if n * stride <= dev.devices_per_node else dev.inter
    if n <= 1 or local >= n or link.composed:
        return all_to_all(nbytes, n, link)
    share = node_dedup(n, local, *routing) if routing else 1.0
    inside = (local - 1) / n * nbytes / dev.intra.among(local) + dev.intra.steps(local) * dev.intra.latency
    across = (n - local) / n * nbytes * share / dev.inter.bandwidth + (n - local) * dev.inter.latency
    return max(inside, across)


def node_dedup(n: int, local: int, experts: int, top_k: int) -> float:
    """Of a token's routed copies bound for other nodes, the share that crosses the network when each remote node
    receives the token once and forwards it to its experts over NVLink (DeepEP's internode dispatch; the combine
    likewise, reduced on the node before it crosses). Uniform routing: ``top_k`` distinct experts of ``experts``,
    spread evenly over the n / local nodes of the group; a node holding none of them with probability
    C(E - E_node, k) / C(E, k). Group-limited routing (DeepSeek-V3's) reaches fewer nodes than this counts; the
    forwarding inside the node is not priced (NVLink, in parallel with the network)."""
    nodes, per_node = n // local, experts * local // n
    miss = math.comb(experts - per_node, top_k) / math.comb(experts, top_k)
    return (nodes - 1) * (1 - miss) / (top_k * (n - local) / n)


def p2p(nbytes: float, link: Link) -> float:
    """A send between two devices of the tier ``link`` (on a full mesh: one link)."""
    return nbytes / link.among(2) + link.latency
