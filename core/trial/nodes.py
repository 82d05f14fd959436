"""How the supervisors of a multi-node trial keep each other informed: node 0's supervisor listens (on the
scheduler's host, the scheduler's port + 1), every other node's connects and sends JSON lines over TCP.

    node k -> 0   {"hello": k}                  joined (its ranks are starting)
                  {"alive": k}                  every HEARTBEAT_SEC
                  {"failed": at, "reason": ..}  one of its ranks failed (node 0 starts the failure grace)
                  {"report": [rank ends]}       its ranks ended: exit codes, reports, peaks (``Rank.end``)
    node 0 -> k   {"abort": reason}             end your ranks now: the trial is over

A peer that goes silent for LOST_AFTER_SEC, or whose connection closes before it reported (its supervisor was
killed, its host went down), is lost; node 0 then ends the trial and says which node. Node k that loses node 0
ends its own ranks the same way. Nothing here needs a shared filesystem: the one summary is written by node 0 from
what the others sent. No MindSpore here.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field

HEARTBEAT_SEC = 1.0
LOST_AFTER_SEC = 10.0  # silence after which a peer's supervisor (or its host) is taken for gone
CONNECT_RETRY_SEC = 0.2


def _send(sock: socket.socket, lock: threading.Lock, message: dict) -> bool:
    try:
        with lock:
            sock.sendall((json.dumps(message) + "\n").encode())
        return True
    except OSError:
        return False


def _close(sock: socket.socket) -> None:
    """Close a connection another thread may be reading: shutdown first, so that the peer sees its end now (a
    plain close leaves it open while a recv is blocked on it)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _lines(sock: socket.socket):
    """The JSON messages a connection sends until it closes (a torn last line ends it too)."""
    buf = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError:
            return
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                yield json.loads(line)
            except ValueError:
                return


@dataclass
class Peer:
    """What node 0 knows of another node."""

    node: int
    joined_at: float
    seen_at: float
    failed_at: float | None = None
    failure: str = ""
    report: list | None = None
    lost: str = ""  # why it is taken for gone ("" while it answers, or once it reported)
    sock: socket.socket | None = field(default=None, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class Hub:
    """Node 0's side: accepts the other nodes, follows them, tells them to abort."""

    def __init__(self, host: str, port: int, nnodes: int):
        self.nnodes, self.peers, self._mutex = nnodes, {}, threading.Lock()
        self._server = socket.create_server((host, port))
        self._server.settimeout(0.5)
        self._closed = False
        threading.Thread(target=self._accept, name="nodes-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._follow, args=(sock,), name="nodes-peer", daemon=True).start()

    def _follow(self, sock: socket.socket) -> None:
        peer = None
        for msg in _lines(sock):
            now = time.time()
            if "hello" in msg:
                peer = Peer(int(msg["hello"]), now, now, sock=sock)
                with self._mutex:
                    self.peers[peer.node] = peer
                continue
            if peer is None:
                continue
            peer.seen_at = now
            if "failed" in msg and peer.failed_at is None:
                peer.failed_at, peer.failure = float(msg["failed"]), str(msg.get("reason", ""))
            if "report" in msg:
                peer.report = list(msg["report"])
        if peer is not None and peer.report is None and not peer.lost:
            peer.lost = f"node {peer.node}'s supervisor was lost (its connection closed before it reported)"
            peer.failed_at = peer.failed_at or time.time()

    def missing(self) -> list[int]:
        """Nodes that have not joined."""
        return [k for k in range(1, self.nnodes) if k not in self.peers]

    def check_silence(self, now: float) -> None:
        for peer in list(self.peers.values()):
            if peer.report is None and not peer.lost and now - peer.seen_at > LOST_AFTER_SEC:
                peer.lost = f"node {peer.node}'s supervisor was lost (silent for {LOST_AFTER_SEC:g} s)"
                peer.failed_at = peer.failed_at or now

    def failure_at(self) -> float | None:
        return min((p.failed_at for p in self.peers.values() if p.failed_at is not None), default=None)

    def settled(self) -> bool:
        """Every node joined and then reported or was lost."""
        return not self.missing() and all(p.report is not None or p.lost for p in self.peers.values())

    def abort(self, reason: str) -> None:
        for peer in list(self.peers.values()):
            if peer.sock is not None and peer.report is None:
                _send(peer.sock, peer.lock, {"abort": reason})

    def close(self) -> None:
        self._closed = True
        self._server.close()
        for peer in self.peers.values():
            if peer.sock is not None:
                _close(peer.sock)


class Link:
    """Node k's side: joins node 0, beats, reports; learns when to abort or that node 0 is gone."""

    def __init__(self, host: str, port: int, *, node: int, join_timeout: float):
        self.node, self.address, self.join_timeout = node, (host, port), join_timeout
        self.sock: socket.socket | None = None
        self.trouble_at: float | None = None  # when node 0 said abort, was lost, or could not be reached
        self.trouble, self.trouble_kind = "", ""  # why; "abort" | "lost" | "unreachable"
        self._lock = threading.Lock()
        self._done = threading.Event()
        threading.Thread(target=self._run, name="nodes-link", daemon=True).start()

    def _run(self) -> None:
        deadline = time.time() + self.join_timeout
        while self.sock is None:
            try:
                self.sock = socket.create_connection(self.address, timeout=5.0)
            except OSError:
                if time.time() > deadline:
                    self._trouble(
                        "unreachable",
                        f"node {self.node} could not reach node 0's supervisor at {self.address[0]}:"
                        f"{self.address[1]} within {self.join_timeout:g} s",
                    )
                    return
                time.sleep(CONNECT_RETRY_SEC)
        self.sock.settimeout(None)
        _send(self.sock, self._lock, {"hello": self.node})
        threading.Thread(target=self._beat, name="nodes-beat", daemon=True).start()
        for msg in _lines(self.sock):
            if "abort" in msg:
                self._trouble("abort", f"node 0 ended the trial: {msg['abort']}")
        if not self._done.is_set():
            self._trouble("lost", "node 0's supervisor was lost (its connection closed)")

    def _beat(self) -> None:
        while not self._done.wait(HEARTBEAT_SEC):
            if not _send(self.sock, self._lock, {"alive": self.node}):
                return

    def _trouble(self, kind: str, why: str) -> None:
        if self.trouble_at is None:
            self.trouble_at, self.trouble, self.trouble_kind = time.time(), why, kind

    def failed(self, at: float, reason: str) -> None:
        if self.sock is not None:
            _send(self.sock, self._lock, {"failed": at, "reason": reason})

    def report(self, ends: list[dict]) -> None:
        self._done.set()
        if self.sock is not None:
            _send(self.sock, self._lock, {"report": ends})
            _close(self.sock)
