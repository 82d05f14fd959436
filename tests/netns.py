"""Hosts for tests and benchmarks that cross a network: network namespaces joined by a veth pair, each with its own
address, interfaces and ports (``ip netns``, ``ip link``; root). ``hosts(n=2)`` yields [(namespace, address)] and
removes them afterwards; ``in_host(namespace, argv)`` is the command line that runs ``argv`` inside one."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess


def missing() -> str:
    """Why this machine cannot make the hosts ("" when it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "ip (iproute2) not found"
    return ""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def hosts():
    """Two namespaces with a veth pair between them, on a /24 of their own: [(namespace, address)], node 0 first.
    Raises subprocess.CalledProcessError when the kernel refuses (then nothing is left behind)."""
    tag = f"{os.getpid() % 10000}"
    subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    names, links = [f"msar{tag}n0", f"msar{tag}n1"], [f"ve{tag}a", f"ve{tag}b"]
    try:
        for ns in names:
            _ip("netns", "add", ns)
        _ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        out = []
        for i, (ns, link) in enumerate(zip(names, links, strict=True)):
            address = f"{subnet}.{i + 1}"
            _ip("link", "set", link, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", ns, "link", "set", link, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            out.append((ns, address))
        yield out
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def node_command(hosts: list, node: int, argv: list[str], env: dict | None = None, port: int = 29500) -> list[str]:
    """``argv`` as node ``node`` of a trial over ``hosts``: inside its namespace, told its place and node 0's
    address as the agent's Slurm job tells it (each namespace has its own ports, so one port serves all)."""
    variables = {
        "MSAR_NNODES": str(len(hosts)),
        "MSAR_NODE_RANK": str(node),
        "MSAR_SCHED_HOST": hosts[0][1],
        "MSAR_SCHED_PORT": str(port),
        **(env or {}),
    }
    return ["ip", "netns", "exec", hosts[node][0], "env", *(f"{k}={v}" for k, v in variables.items()), *argv]
