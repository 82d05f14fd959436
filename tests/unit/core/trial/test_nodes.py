"""The supervisors' channel of a multi-node trial on loopback, without ranks: joining, failures, reports, a lost
peer, an abort, a node 0 that cannot be reached (tests/integration/test_multi_node.py runs it across hosts)."""

from __future__ import annotations

import socket
import time

import pytest

from core.trial import nodes
from tests.integration.agent_helpers import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def hub():
    port = free_port()
    hub = nodes.Hub("127.0.0.1", port, 3)
    hub.port = port
    yield hub
    hub.close()


def test_nodes_join_report_and_settle(hub):
    links = [nodes.Link("127.0.0.1", hub.port, node=k, join_timeout=10) for k in (1, 2)]
    wait_for(lambda: not hub.missing(), 10, "both nodes to join")
    assert not hub.settled() and hub.failure_at() is None
    links[0].failed(123.0, "rank 2 ran out of memory")
    wait_for(lambda: hub.failure_at() == 123.0, 10, "the failure")
    assert hub.peers[1].failure == "rank 2 ran out of memory"
    for k, link in zip((1, 2), links, strict=True):
        link.report([{"rank": 2 * k, "exit_code": 0}])
    wait_for(hub.settled, 10, "both reports")
    assert hub.peers[2].report == [{"rank": 4, "exit_code": 0}] and not hub.peers[2].lost


def test_a_peer_whose_connection_closes_before_it_reports_is_lost(hub):
    link = nodes.Link("127.0.0.1", hub.port, node=1, join_timeout=10)
    wait_for(lambda: 1 in hub.peers, 10, "node 1 to join")
    link.sock.shutdown(socket.SHUT_RDWR)  # what a kill -9 of its supervisor does: the kernel ends it
    wait_for(lambda: hub.peers[1].lost, 10, "node 1 to be lost")
    assert "node 1's supervisor was lost" in hub.peers[1].lost and hub.failure_at() is not None
    assert hub.missing() == [2] and not hub.settled()  # node 2 never joined


def test_a_silent_peer_is_lost_after_its_grace(hub, monkeypatch):
    monkeypatch.setattr(nodes, "HEARTBEAT_SEC", 3600.0)  # the link stops beating
    nodes.Link("127.0.0.1", hub.port, node=1, join_timeout=10)
    wait_for(lambda: 1 in hub.peers, 10, "node 1 to join")
    hub.check_silence(time.time() + nodes.LOST_AFTER_SEC - 1)
    assert not hub.peers[1].lost
    hub.check_silence(time.time() + nodes.LOST_AFTER_SEC + 1)
    assert "silent for" in hub.peers[1].lost


def test_an_abort_reaches_the_other_nodes(hub):
    link = nodes.Link("127.0.0.1", hub.port, node=1, join_timeout=10)
    wait_for(lambda: 1 in hub.peers, 10, "node 1 to join")
    hub.abort("rank 0 ran out of memory")
    wait_for(lambda: link.trouble_at is not None, 10, "the abort")
    assert link.trouble_kind == "abort" and "rank 0 ran out of memory" in link.trouble


def test_node_0_lost_or_unreachable():
    port = free_port()
    hub = nodes.Hub("127.0.0.1", port, 2)
    link = nodes.Link("127.0.0.1", port, node=1, join_timeout=10)
    wait_for(lambda: 1 in hub.peers, 10, "node 1 to join")
    hub.close()  # node 0's supervisor is gone
    wait_for(lambda: link.trouble_at is not None, 10, "node 0 to be lost")
    assert link.trouble_kind == "lost"
    alone = nodes.Link("127.0.0.1", free_port(), node=1, join_timeout=0.5)
    wait_for(lambda: alone.trouble_at is not None, 10, "the join timeout")
    assert alone.trouble_kind == "unreachable" and "could not reach node 0" in alone.trouble
