"""Hosts for tests and benchmarks that cross a network: network namespaces, each with its own address, interfaces
and ports, joined through a bridge (``ip netns``, ``ip link``; root). ``hosts(n)`` makes them and removes them
afterwards; ``node_command`` runs a trial's node inside one, ``enter`` any command."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess


def missing() -> str:
    """Why this machine cannot make the hosts ("" when it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} ({package}) not found"
    return ""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Hosts(list):
    """[(namespace, address)] of the hosts, node 0 first; ``gateway``: this (the root) namespace's address on
    their bridge, where a service of the tests (slurmctld) listens for them."""

    def __init__(self, gateway: str):
        super().__init__()
        self.gateway = gateway


@contextlib.contextmanager
def hosts(n: int = 2):
    """``n`` namespaces, each with a veth into one bridge of this namespace, on a /24 of their own: ``Hosts``.
    Raises subprocess.CalledProcessError when the kernel refuses (then nothing is left behind)."""
    tag = f"{os.getpid() % 10000}"
    subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    bridge, names = f"msar{tag}br", [f"msar{tag}n{i}" for i in range(n)]
    made = Hosts(gateway=f"{subnet}.254")
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{made.gateway}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, ns in enumerate(names):
            inside, outside, address = f"ve{tag}i{i}", f"ve{tag}o{i}", f"{subnet}.{i + 1}"
            _ip("netns", "add", ns)
            _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", outside, "master", bridge)
            _ip("link", "set", outside, "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inside)
            _ip("-n", ns, "link", "set", inside, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            made.append((ns, address))
        yield made
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # its veth ends go with it
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def enter(namespace: str, argv: list[str]) -> list[str]:
    """``argv`` inside ``namespace``'s network only (nsenter): unlike ``ip netns exec``, which mounts a sysfs of
    the namespace's own over /sys and so hides /sys/fs/cgroup, which slurmd needs."""
    return ["nsenter", f"--net=/var/run/netns/{namespace}", *argv]


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
    return enter(hosts[node][0], ["env", *(f"{k}={v}" for k, v in variables.items()), *argv])
