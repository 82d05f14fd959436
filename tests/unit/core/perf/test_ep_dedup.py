"""DeepEP's per-node deduplication of the experts' all-to-all (``cluster.ep_dedup``): the share of a token's remote
copies that crosses the network, against a simulation of uniform routing, and what it changes in an all-to-all
and a step (only traffic between nodes)."""

from __future__ import annotations

import numpy as np
import pytest

from core.config import load_config
from core.perf import estimate_step, links, planned_config
from core.perf.device import Device, Link


def _simulated_share(n: int, local: int, experts: int, top_k: int, tokens: int = 20_000) -> float:
    """Route ``tokens`` uniformly (k distinct experts each), experts laid out evenly in rank order over n ranks,
    ``local`` to a node; from a rank on node 0: distinct other nodes reached over other-node copies."""
    rng = np.random.default_rng(0)
    choices = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k]
    node = choices // (experts // n) // local  # expert -> rank -> node
    remote = node != 0
    copies = remote.sum()
    distinct = sum(len(set(row[mask])) for row, mask in zip(node, remote, strict=True))
    return distinct / copies


@pytest.mark.parametrize(
    ("n", "local", "experts", "top_k"),
    [(16, 8, 16, 2), (32, 8, 128, 8), (64, 8, 256, 8), (8, 2, 64, 4)],
)
def test_the_share_that_crosses_is_what_uniform_routing_sends(n, local, experts, top_k):
    want = _simulated_share(n, local, experts, top_k)
    assert links.node_dedup(n, local, experts, top_k) == pytest.approx(want, rel=0.02)


def test_one_choice_per_token_has_nothing_to_deduplicate():
    assert links.node_dedup(32, 8, 128, 1) == pytest.approx(1.0)
    # 2 nodes, 2 of 16 experts: 1 - C(8, 2) / C(16, 2) of tokens reach the other node, sending k 8 / 16 = 1 copy
    assert links.node_dedup(16, 8, 16, 2) == pytest.approx(1 - 28 / 120)


def test_only_the_network_share_shrinks():
    dev = Device(1, 1, 1, 1, None, 0.0, intra=Link(100, 0), inter=Link(10, 0), devices_per_node=8)
    cfg = load_config(
        ["model=moe-small", "model.n_experts=16", "parallel.dp_shard=16", "parallel.ep=16"]
        + ["training.global_batch_size=16"]
    )
    B, share = 1600.0, links.node_dedup(16, 8, 16, 2)
    plain = links.expert_all_to_all(B, cfg.parallel, dev)
    deduped = links.expert_all_to_all(B, cfg.parallel, dev, routing=(16, 2))
    assert plain == pytest.approx(8 / 16 * B / 10)
    assert deduped == pytest.approx(max(7 / 16 * B / 100, 8 / 16 * B * share / 10))
    one_node = load_config(["model=moe-small", "parallel.dp_shard=8", "parallel.ep=8", "training.global_batch_size=8"])
    assert links.expert_all_to_all(B, one_node.parallel, dev, routing=(16, 2)) == links.all_to_all(B, 8, dev.intra)


def test_a_step_pays_less_all_to_all_across_nodes_and_the_same_inside_one():
    base = ["cluster=h100-sxm", "model=qwen3-30b-a3b", "training.precision=bf16", "training.seq_len=4096"]
    base += ["cluster.devices_per_node=8", "parallel.sp=true", "parallel.tp=2", "parallel.etp=1"]

    def comm_ep(nodes: int, ep: int, dedup: bool) -> float:
        cfg = planned_config(
            [*base, f"cluster.nodes={nodes}", f"parallel.dp_shard={4 * nodes}", f"parallel.ep={ep}"]
            + [f"training.global_batch_size={4 * nodes}", f"cluster.ep_dedup={str(dedup).lower()}"]
        )
        return estimate_step(cfg).breakdown["comm_ep"]

    assert comm_ep(4, 32, True) < comm_ep(4, 32, False)
    assert comm_ep(4, 8, True) == comm_ep(4, 8, False)  # 8 expert ranks 1 apart: one node
