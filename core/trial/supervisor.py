"""The supervisor: runs a multi-rank trial on this machine and turns its ranks' ends into one summary.

It does what ``msrun`` does — one scheduler process (MS_ROLE=MS_SCHED) and N workers (MS_ROLE=MS_WORKER) joined
through MindSpore's dynamic-cluster environment — but keeps each worker's real exit code (msrun turns any
failure into rc=1, and only after a long wait: docs/mindspore-cpu.md, "Launching ranks"), owns the per-rank logs,
samples each rank's peak memory from /proc (so that a rank killed by a signal still has a measured peak), enforces
the wall budget with a hard kill after a grace period, and merges the per-rank results.

Multi-node: one supervisor per node, told node 0's address (``MSAR_SCHED_HOST``/``MSAR_SCHED_PORT``) and its
own place (``MSAR_NODE_RANK``/``MSAR_NNODES``, or ``MSAR_NODE_RANKS``: ``core.runtime.cluster``), as the agent's
Slurm job does. Node 0 also starts MindSpore's scheduler, follows the other supervisors (``core.trial.nodes``: a
failure anywhere ends the trial everywhere after the failure grace; a node that never joins, or is lost, ends it
with a reason naming it) and writes the one summary from every node's rank ends; node k writes its own view to
``nodes/node_<k>.json``.

A rank that is stopped (SIGSTOP: /proc state T) or stuck in the kernel (state D for STUCK_SEC or more) when its
peers' collectives give up is the trial's cause: the trial is a timeout naming it, not an error of the peers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from core.config import TrainConfig, to_dict
from core.runtime.cluster import CONFIG_ENV, START_ENV, node_ranks, nodes
from core.runtime.ranks import free_port
from core.trial import fork_server
from core.trial.contract import CLASSIFIED, STATUS, Exit
from core.trial.nodes import Hub, Link
from core.trial.processes import kill_group
from core.trial.recorder import TrialRecorder, write_json_atomic

POLL_SEC = 0.1
SUPERVISOR_ENV = "MSAR_SUPERVISOR_PID"  # a rank ends itself when its supervisor is gone (core.trial.watchdog)
# After the first rank fails, how long the others get to end by themselves (and so report a classified cause,
# say OOM, rather than the communication error it causes) before they are killed.
FAILURE_GRACE_SEC = 5.0
_SCHEDULER = "from mindspore.communication import init; init()"
# How long node 0 waits for every other node's supervisor to join, and node k for node 0 (seconds; the cluster's
# own start-up, e.g. Slurm starting the job's steps, is well within it).
JOIN_TIMEOUT_ENV, JOIN_TIMEOUT_SEC = "MSAR_JOIN_TIMEOUT_SEC", 300.0


def _vm_hwm(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


STUCK_SEC = 5.0  # uninterruptible sleep (state D) this long is a hang, not a disk read


def _state(pid: int) -> str:
    """The process's state letter (/proc: R running, S sleeping, D in the kernel, T stopped, ...), "" if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


@dataclass
class Rank:
    rank: int
    proc: subprocess.Popen | fork_server.WarmProcess
    peak: int | None = None
    ended_at: float | None = None
    killed_by_us: bool = False
    hung: str = ""  # how it hung when last seen running: stopped (state T) or stuck in the kernel (state D)
    _d_since: float | None = None

    def poll(self) -> int | None:
        rc = self.proc.poll()
        if rc is None:
            self.peak = max(self.peak or 0, _vm_hwm(self.proc.pid) or 0) or self.peak
            state, now = _state(self.proc.pid), time.time()
            if state != "D":
                self._d_since = None
            elif self._d_since is None:
                self._d_since = now
            if state in ("T", "t"):
                self.hung = "stopped (SIGSTOP or a tracer: state T)"
            elif self._d_since is not None and now - self._d_since >= STUCK_SEC:
                self.hung = f"stuck in the kernel (state D for {now - self._d_since:.0f} s)"
            else:
                self.hung = ""
        elif self.ended_at is None:
            self.ended_at = time.time()
        return rc

    def end(self, trial_dir: Path, node: int) -> dict:
        """How this rank ended, as every node's supervisor reports it (JSON: it may travel to node 0)."""
        path = trial_dir / "ranks" / f"rank_{self.rank}.json"
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            report = None
        return {
            "rank": self.rank,
            "node": node,
            "exit_code": self.proc.returncode,
            "ended_at": self.ended_at,
            "killed_by_supervisor": self.killed_by_us,
            "hung": self.hung,
            "peak_memory_bytes": self.peak,
            "report": report,
        }


@dataclass(kw_only=True)
class Supervisor:
    overrides: list[str]
    trial_dir: Path
    world_size: int
    started: float
    wall_budget: float | None
    grace: float
    config: dict
    ranks: list[Rank] = field(default_factory=list)
    scheduler: subprocess.Popen | fork_server.WarmProcess | None = None
    timed_out: bool = False
    node: int = 0
    nnodes: int = 1
    hub: Hub | None = None  # node 0 of a multi-node trial: the other nodes' supervisors
    link: Link | None = None  # node k > 0: its line to node 0
    never_joined: str = ""

    def _env(self, host: str, port: int) -> dict:
        env = dict(os.environ)
        env.update(
            {
                "MS_WORKER_NUM": str(self.world_size),
                "MS_SCHED_HOST": host,
                "MS_SCHED_PORT": str(port),
                START_ENV: repr(self.started),
                CONFIG_ENV: json.dumps(self.config),
                "PYTHONUNBUFFERED": "1",
                SUPERVISOR_ENV: str(os.getpid()),
            }
        )
        env.setdefault("GLOG_v", "3")  # MindSpore's INFO/WARNING lines would drown the rank logs
        # A worker learns that every rank has joined from its heartbeat's reply, sent every 3-5 s by default, so
        # ranks left init() seconds apart (and one of them then still sleeps 3 s, a fixed poll, for the other's
        # address). A 1 s heartbeat takes seconds off every multi-rank trial (benchmarks/RESULTS.md,
        # "Start-up: what a trial compiles and waits for").
        env.setdefault("MS_RETRY_INTERVAL_LOWER", "1")
        env.setdefault("MS_RETRY_INTERVAL_UPPER", "1")
        return env

    def start(self) -> None:
        logs = self.trial_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        # A scheduler (Slurm) names node 0 by host name; MindSpore's MS_SCHED_HOST wants its address.
        host = socket.gethostbyname(os.environ.get("MSAR_SCHED_HOST", "127.0.0.1"))
        port = int(os.environ.get("MSAR_SCHED_PORT") or free_port())
        self.node, self.nnodes = nodes()
        first, count = node_ranks(self.world_size)
        self.join_timeout = float(os.environ.get(JOIN_TIMEOUT_ENV) or JOIN_TIMEOUT_SEC)
        if self.nnodes > 1 and self.node == 0:
            self.hub = Hub(host, port + 1, self.nnodes)
        elif self.nnodes > 1:
            self.link = Link(host, port + 1, node=self.node, join_timeout=self.join_timeout)
        self.join_deadline = time.time() + self.join_timeout
        env = self._env(host, port)
        if first == 0:  # fork_server.popen: forked from the warm server when an agent runs one, else a new process
            self.scheduler = fork_server.popen(
                [sys.executable, "-c", _SCHEDULER],
                env={**env, "MS_ROLE": "MS_SCHED"},
                stdout=open(logs / "scheduler.log", "wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if isinstance(self.scheduler, fork_server.WarmProcess):
            _wait_listening(host, port, self.scheduler)
        for r in range(first, first + count):
            worker_env = {
                **env,
                "MS_ROLE": "MS_WORKER",
                "MS_NODE_ID": str(r),
                "RANK_ID": str(r),
                "RANK_SIZE": str(self.world_size),
            }
            proc = fork_server.popen(
                [sys.executable, "-m", "core.train", *self.overrides],
                env=worker_env,
                stdout=open(logs / f"rank_{r}.log", "wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.ranks.append(Rank(r, proc))
        pids = {
            "scheduler": self.scheduler.pid if self.scheduler else None,
            "ranks": {r.rank: r.proc.pid for r in self.ranks},
        }
        name = "pids.json" if self.nnodes == 1 else f"pids_node_{self.node}.json"
        (logs / name).write_text(json.dumps(pids))

    def _failure_at(self) -> float | None:
        """When the trial first failed, anywhere: a rank of this node, another node (node 0), or node 0's word
        (node k: an abort ends this node's ranks at once, node 0 having waited the grace already)."""
        times = [r.ended_at for r in self.ranks if r.proc.returncode not in (None, 0)]
        if self.hub is not None:
            times.append(self.hub.failure_at())
        if self.link is not None and self.link.trouble_at is not None:
            times.append(self.link.trouble_at - FAILURE_GRACE_SEC)
        return min((t for t in times if t is not None), default=None)

    def wait(self) -> None:
        told = False  # node k: node 0 was told of this node's first failure
        ended_at = None  # when the last of this node's ranks ended
        hard_deadline = None if self.wall_budget is None else self.started + self.wall_budget + self.grace
        while True:
            codes = [r.poll() for r in self.ranks]
            now = time.time()
            if self.hub is not None:
                self.hub.check_silence(now)
                if self.hub.missing() and now > self.join_deadline and not self.never_joined:
                    late = ", ".join(map(str, self.hub.missing()))
                    self.never_joined = f"node(s) {late} never joined within {self.join_timeout:g} s"
                    self.kill()
            if all(c is not None for c in codes):
                if self.hub is None or self.hub.settled() or self.never_joined:
                    return
                # The other nodes' ranks end with these (they run the same steps): wait for their reports, and
                # end what still runs there only after the grace (a rank still writing its checkpoint shard).
                ended_at = ended_at or now
                if now > ended_at + FAILURE_GRACE_SEC:
                    self.hub.abort("node 0's ranks ended")
            failed_at = self._failure_at()
            if self.link is not None and failed_at is not None and not told and self.link.trouble_at is None:
                told = True
                self.link.failed(failed_at, "a rank of this node failed")
            if failed_at is not None and now > failed_at + FAILURE_GRACE_SEC:
                self.kill()
            elif hard_deadline is not None and now > hard_deadline:
                self.timed_out = True
                self.kill()
            time.sleep(POLL_SEC)

    def kill(self) -> None:
        for r in self.ranks:
            if r.proc.poll() is None:
                r.killed_by_us = True
                kill_group(r.proc.pid, term_wait=0)
        for r in self.ranks:
            r.proc.wait()
            r.poll()
        if self.hub is not None:
            self.hub.abort(self.never_joined or "node 0 ended its ranks")

    def stop_scheduler(self) -> None:
        if self.scheduler is not None and self.scheduler.poll() is None:
            kill_group(self.scheduler.pid, term_wait=0)
            self.scheduler.wait()
        if self.hub is not None:
            self.hub.close()

    def ends(self) -> list[dict]:
        """Every rank's end this supervisor knows: its own, and (node 0) those the other nodes reported."""
        ends = [r.end(self.trial_dir, self.node) for r in self.ranks]
        if self.hub is not None:
            for peer in self.hub.peers.values():
                ends += peer.report or []
        return sorted(ends, key=lambda e: e["rank"])

    def merge(self, ends: list[dict]) -> dict:
        """One summary from the ranks' ends (``ends()``: their own summaries, exit codes and what the supervisors
        saw)."""
        reports = {e["rank"]: e["report"] for e in ends if e["report"] is not None}
        code, reason, culprit = self._verdict(ends)
        base = reports.get(0) or next(iter(reports.values()), None)
        if base is None:
            rec = TrialRecorder(
                trial_dir=self.trial_dir,
                config=self.config,
                overrides=self.overrides,
                started=self.started,
                world_size=self.world_size,
            )
            _recover_progress(rec, self.trial_dir / "metrics.jsonl")
            base = rec.summary(code, reason)
        summary = dict(base)
        peaks = [
            ((e["report"] or {}).get("metrics") or {}).get("peak_memory_bytes") or e["peak_memory_bytes"] for e in ends
        ]
        summary["metrics"] = dict(
            summary["metrics"],
            peak_memory_bytes=max((p for p in peaks if p), default=None),
            peak_memory_bytes_per_rank=peaks,
        )
        summary.update(
            status=STATUS[code],
            exit_code=int(code),
            reason=reason,
            wall_time_sec=round(time.time() - self.started, 3),
            ranks=[_rank_row(e) for e in ends],
        )
        summary["error"] = (
            None
            if code == Exit.OK
            else (reports.get(culprit) or {}).get("error") or {"type": STATUS[code], "message": reason, "rank": culprit}
        )
        return summary

    def _lost_nodes(self) -> list[tuple[Exit, float, int | None, str]]:
        """Failures that are no rank's: a node that never joined, was lost, or (node k) lost node 0."""
        lost = []
        if self.hub is not None:
            for peer in self.hub.peers.values():
                if peer.lost:
                    lost.append((Exit.ERROR, peer.failed_at or 0.0, None, peer.lost))
        if self.link is not None and self.link.trouble_kind == "lost":
            lost.append((Exit.ERROR, self.link.trouble_at, None, self.link.trouble))
        return lost

    def _verdict(self, ends: list[dict]) -> tuple[Exit, str, int | None]:
        if self.never_joined:
            return Exit.TIMEOUT, f"timeout: {self.never_joined}; killed", None
        if self.link is not None and self.link.trouble_kind == "unreachable":
            return Exit.TIMEOUT, f"timeout: {self.link.trouble}; killed", None
        own = []  # (code, ended_at, rank, reason) for ranks that ended by themselves
        for e in ends:
            if e["killed_by_supervisor"]:
                continue
            rank, rc, report, at = e["rank"], e["exit_code"], e["report"], e["ended_at"] or 0.0
            if report is not None:
                own.append((Exit(report["exit_code"]), at, rank, report["reason"]))
            elif rc is not None and rc < 0:
                name = signal.Signals(-rc).name
                own.append((Exit.ERROR, at, rank, f"rank {rank} was killed by {name} (see logs/rank_{rank}.log)"))
            else:
                code = Exit(rc) if rc in Exit._value2member_map_ else Exit.ERROR
                own.append(
                    (code, at, rank, f"rank {rank} exited with code {rc} without a report (see logs/rank_{rank}.log)")
                )
        failures = [o for o in own if o[0] != Exit.OK] + self._lost_nodes()
        hung = [e for e in ends if e["hung"]]
        if hung and not any(f[0] in CLASSIFIED for f in failures):
            # its peers' collectives gave up waiting for it: the hung rank is the cause, and it is a hang
            first = hung[0]
            return (
                Exit.TIMEOUT,
                f"timeout: rank {first['rank']} {first['hung']} and its peers' collectives gave up",
                first["rank"],
            )
        if self.timed_out:
            classified = [f for f in failures if f[0] in CLASSIFIED]
            if not classified:
                return (
                    Exit.TIMEOUT,
                    (
                        "timeout: ranks still running past the wall budget plus grace "
                        f"({self.wall_budget:g}+{self.grace:g} s); killed"
                    ),
                    None,
                )
            failures = classified
        if not failures:
            if not own:  # the supervisor itself was told to stop (SIGTERM) and killed every rank
                return Exit.ERROR, "the supervisor stopped every rank before any ended", None
            return Exit.OK, own[0][3], None
        # The first classified failure wins over the communication errors it causes; then the earliest.
        failures.sort(key=lambda f: (f[0] not in CLASSIFIED, f[1]))
        code, _, rank, reason = failures[0]
        if rank is None or f"rank {rank}" in reason:
            return code, reason, rank
        return code, f"rank {rank}: {reason}", rank


def _rank_row(e: dict) -> dict:
    report = e["report"] or {}
    return {
        "rank": e["rank"],
        "node": e["node"],
        "exit_code": e["exit_code"],
        "killed_by_supervisor": e["killed_by_supervisor"],
        "status": report.get("status"),
        "peak_memory_bytes": e["peak_memory_bytes"],
        "state_bytes": (report.get("metrics") or {}).get("state_bytes"),
        "log": f"logs/rank_{e['rank']}.log",
    }


def _wait_listening(host: str, port: int, scheduler, timeout: float = 30.0) -> None:
    """Until the scheduler accepts connections. A warm worker starts within milliseconds, before the scheduler
    has bound its port, and MindSpore's topology build then waits for a retry, which made the cluster join several
    times longer (benchmarks/RESULTS.md, "core/trial/supervisor.py"); a cold worker's imports (seconds) always left
    the scheduler time."""
    deadline = time.time() + timeout
    while time.time() < deadline and scheduler.poll() is None:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.02)


def _recover_progress(rec: TrialRecorder, metrics_path: Path) -> None:
    """No rank left a report: take the steps and losses that rank 0 had logged."""
    if not metrics_path.exists():
        return
    for line in metrics_path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by the kill
        if "loss" in row:
            rec.steps, rec.tokens = row["step"], row.get("tokens", rec.tokens)
            rec.losses.append(row["loss"])


def supervise(cfg: TrainConfig, *, overrides: list[str], trial_dir: Path, started: float) -> int:
    """Run the trial's ranks on this node, wait for them, merge their ends into ``trial_summary.json``; returns
    the trial's exit code."""
    sup = Supervisor(
        overrides=overrides,
        trial_dir=trial_dir,
        world_size=cfg.parallel.world_size,
        started=started,
        wall_budget=cfg.trial.max_wall_time_sec,
        grace=cfg.trial.grace_sec,
        config=to_dict(cfg),
    )

    def on_signal(signum, _frame):  # an agent's watchdog or Ctrl-C: still leave a summary
        sup.kill()
        sup.stop_scheduler()
        ends = sup.ends()
        summary = sup.merge(ends)
        summary.update(
            status=Exit.ERROR.status,
            exit_code=int(Exit.ERROR),
            reason=f"supervisor received {signal.Signals(signum).name}",
        )
        _write(sup, ends, summary)
        os._exit(1)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        sup.start()
        sup.wait()
    finally:
        sup.kill()
        sup.stop_scheduler()
    ends = sup.ends()  # each rank's report read once: for the summary, and for node 0 when this is node k
    summary = sup.merge(ends)
    _write(sup, ends, summary)
    return summary["exit_code"]


def _write(sup: Supervisor, ends: list[dict], summary: dict) -> None:
    """Node 0 (or a one-node trial) writes the trial's summary; node k reports its ranks' ends to node 0, which
    writes the summary from them, and keeps its own view in nodes/node_<k>.json."""
    if sup.link is None:
        write_json_atomic(sup.trial_dir / "trial_summary.json", summary)
        return
    sup.link.report(ends)
    (sup.trial_dir / "nodes").mkdir(exist_ok=True)
    write_json_atomic(sup.trial_dir / "nodes" / f"node_{sup.node}.json", summary)
