"""A real Slurm cluster for the tests: munged, slurmctld and slurmd from Debian's packages (slurm-wlm, munge),
started in a temporary directory with a configuration of their own: one node (this host, over loopback), or one
node per network namespace of ``tests.netns.hosts`` (a slurmd in each, slurmctld on their bridge).

Clients (sbatch, squeue, scontrol, scancel) find it through ``SLURM_CONF``, which ``SlurmCluster.env`` sets; the
machine's own Slurm configuration, if any, is never touched. The daemons run as root (slurmd must, to start jobs
as their user); the tests that use it skip where that or the packages are missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests import netns

DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("sbatch", "squeue", "scontrol", "scancel")


def missing() -> str:
    """Why this machine cannot run the test cluster ("" when it can)."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (slurmd starts jobs as their user)"
    absent = [d for d in (*DAEMONS, *COMMANDS) if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if absent:
        return f"{', '.join(absent)} not found (apt-get install slurm-wlm munge)"
    if not Path("/etc/munge/munge.key").exists():
        return "no /etc/munge/munge.key (apt-get install munge creates it)"
    return ""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    """One node, this host as ``NodeName=<hostname>`` at 127.0.0.1; or, given ``hosts`` (``tests.netns.Hosts``),
    nodes ``n0``, ``n1``, ... at their addresses, one CPU each. ``start()``, ``stop()``; ``stop_slurmd()`` and
    ``start_slurmd()`` for a node failure (one node)."""

    def __init__(self, cpus: int | None = None, slurmd_timeout: int = 10, hosts=None):
        self.home = Path(tempfile.mkdtemp(prefix="msar-slurm-"))
        self.node = socket.gethostname()
        self.cpus = cpus or os.cpu_count() or 1
        self.slurmd_timeout = slurmd_timeout
        self.hosts = hosts
        self.conf = self.home / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_conf(self) -> None:
        h = self.home
        ctld, slurmd = _free_ports(2)
        for d in ("state", "spool", "log", "munge"):
            (h / d).mkdir(exist_ok=True)
        if self.hosts:
            controller = self.hosts.gateway
            nodes = [
                f"NodeName=n{i} NodeAddr={address} CPUs=1 State=UNKNOWN" for i, (_, address) in enumerate(self.hosts)
            ]
            for i in range(len(self.hosts)):
                (h / f"spool-n{i}").mkdir(exist_ok=True)
        else:
            controller = "127.0.0.1"
            nodes = [f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN"]
        node = "-%n" if self.hosts else ""  # slurmd's files, one set per node on this one machine
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=msartest",
                    f"SlurmctldHost={self.node}({controller})",
                    f"SlurmctldPort={ctld}",
                    f"SlurmdPort={slurmd}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={h}/munge/sock",
                    "SlurmUser=root",
                    f"StateSaveLocation={h}/state",
                    f"SlurmdSpoolDir={h}/spool{node}",
                    f"SlurmctldPidFile={h}/slurmctld.pid",
                    f"SlurmdPidFile={h}/slurmd{node}.pid",
                    f"SlurmctldLogFile={h}/log/slurmctld.log",
                    f"SlurmdLogFile={h}/log/slurmd{node}.log",
                    # No cgroups in a container: follow a job's processes through /proc (new sessions included).
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "MpiDefault=none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "SchedulerType=sched/backfill",
                    "ReturnToService=2",
                    "MinJobAge=3600",  # scontrol answers for an ended job this long (no accounting here)
                    "KillWait=5",
                    "InactiveLimit=0",
                    f"SlurmdTimeout={self.slurmd_timeout}",
                    *nodes,
                    "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        shutil.copy("/etc/munge/munge.key", h / "munge" / "key")
        os.chmod(h / "munge", 0o755)
        os.chmod(h / "munge" / "key", 0o600)

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, check=check, timeout=60)

    def start(self) -> SlurmCluster:
        self._write_conf()
        h = self.home / "munge"
        self._run(
            _binary("munged"),
            "--force",
            f"--socket={h}/sock",
            f"--key-file={h}/key",
            f"--log-file={self.home}/log/munged.log",
            f"--pid-file={h}/pid",
            f"--seed-file={h}/seed",
        )
        self._run(_binary("slurmctld"), "-c")  # -c: a clean start, no state of an earlier cluster
        self.start_slurmd()
        return self

    def start_slurmd(self) -> None:
        if self.hosts:
            for i, (ns, _) in enumerate(self.hosts):
                self._run(*netns.enter(ns, [_binary("slurmd"), "-N", f"n{i}"]))
        else:
            self._run(_binary("slurmd"))
            self._run("scontrol", "update", f"nodename={self.node}", "state=resume", check=False)
        self.wait_idle()

    def wait_idle(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self._run("sinfo", "--noheader", "--format=%T", check=False).stdout.strip()
            if out and set(out.split()) <= {"idle", "mixed", "allocated"}:
                return
            time.sleep(0.5)
        raise RuntimeError(f"slurm node not idle after {timeout}s: {out!r}; see {self.home}/log")

    def stop_slurmd(self) -> None:
        """A node failure: slurmd and every job process on the node end at once (kill -9): the processes started
        under this cluster (SLURM_CONF naming it in their environment: its step daemons and their jobs), not its
        controller, not munged, not this test, nor another test's cluster."""
        self._kill_pidfile(self.home / "slurmd.pid")
        keep = {os.getpid(), os.getppid(), *(self._pid(self.home / f) for f in ("slurmctld.pid", "munge/pid"))}
        mark = f"SLURM_CONF={self.conf}".encode()
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and int(proc.name) not in keep and mark in (proc / "environ").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                pass

    def jobs(self) -> list[dict]:
        """Every job slurmctld knows: id, name, state."""
        out = self._run("scontrol", "show", "job", "--oneliner", check=False).stdout
        rows = []
        for line in out.splitlines():
            fields = dict(p.split("=", 1) for p in line.split() if "=" in p)
            if "JobId" in fields:
                rows.append({"id": fields["JobId"], "name": fields.get("JobName"), "state": fields.get("JobState")})
        return rows

    @staticmethod
    def _pid(path: Path) -> int | None:
        try:
            return int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _kill_pidfile(self, path: Path) -> None:
        pid = self._pid(path)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def stop(self) -> None:
        self._run("scancel", "--full", "--user=root", check=False)
        time.sleep(1)
        for pidfile in self.home.glob("slurmd*.pid"):
            self._kill_pidfile(pidfile)
        self._kill_pidfile(self.home / "slurmctld.pid")
        self._kill_pidfile(self.home / "munge" / "pid")
        shutil.rmtree(self.home, ignore_errors=True)
