"""The supervisor: runs a multi-rank trial on this machine and turns its ranks' ends into one summary.

It does what ``msrun`` does — one scheduler process (MS_ROLE=MS_SCHED) and N workers (MS_ROLE=MS_WORKER) joined
through MindSpore's dynamic-cluster environment — but keeps each worker's real exit code (msrun turns any
failure into rc=1, and only after a long wait: docs/mindspore-cpu.md, "Launching ranks"), owns the per-rank logs,
samples each rank's peak memory from /proc (so that a rank killed by a signal still has a measured peak), enforces
the wall budget with a hard kill after a grace period, and merges the per-rank results.

Multi-node: run one supervisor per node with ``MSAR_SCHED_HOST``/``MSAR_SCHED_PORT`` pointing at node 0 and
``MSAR_NODE_RANKS=first:count`` naming this node's ranks (``core.runtime.cluster``); node 0 also starts the
scheduler.
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
from core.runtime.cluster import CONFIG_ENV, START_ENV, node_ranks
from core.trial import fork_server
from core.trial.contract import CLASSIFIED, STATUS, Exit
from core.trial.processes import kill_group
from core.trial.recorder import TrialRecorder, write_json_atomic

POLL_SEC = 0.1
# After the first rank fails, how long the others get to end by themselves (and so report a classified cause,
# say OOM, rather than the communication error it causes) before they are killed.
FAILURE_GRACE_SEC = 5.0
_SCHEDULER = "from mindspore.communication import init; init()"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vm_hwm(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass
class Rank:
    rank: int
    proc: subprocess.Popen | fork_server.WarmProcess
    peak: int | None = None
    ended_at: float | None = None
    killed_by_us: bool = False

    def poll(self) -> int | None:
        rc = self.proc.poll()
        if rc is None:
            self.peak = max(self.peak or 0, _vm_hwm(self.proc.pid) or 0) or self.peak
        elif self.ended_at is None:
            self.ended_at = time.time()
        return rc


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
        port = int(os.environ.get("MSAR_SCHED_PORT") or _free_port())
        first, count = node_ranks(self.world_size)
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
        (logs / "pids.json").write_text(json.dumps(pids))

    def wait(self) -> None:
        first_failure: float | None = None
        hard_deadline = None if self.wall_budget is None else self.started + self.wall_budget + self.grace
        while True:
            codes = [r.poll() for r in self.ranks]
            if all(c is not None for c in codes):
                return
            if first_failure is None and any(c not in (None, 0) for c in codes):
                first_failure = time.time()
            now = time.time()
            if first_failure is not None and now > first_failure + FAILURE_GRACE_SEC:
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

    def stop_scheduler(self) -> None:
        if self.scheduler is not None and self.scheduler.poll() is None:
            kill_group(self.scheduler.pid, term_wait=0)
            self.scheduler.wait()

    def merge(self) -> dict:
        """One summary from the ranks' own summaries, their exit codes and what the supervisor saw."""
        reports = {}
        for r in self.ranks:
            path = self.trial_dir / "ranks" / f"rank_{r.rank}.json"
            if path.exists():
                reports[r.rank] = json.loads(path.read_text())
        code, reason, culprit = self._verdict(reports)
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
        peaks = [(reports.get(r.rank, {}).get("metrics") or {}).get("peak_memory_bytes") or r.peak for r in self.ranks]
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
            ranks=self._rank_table(reports),
        )
        summary["error"] = (
            None
            if code == Exit.OK
            else (
                (reports.get(culprit) or {}).get("error") or {"type": STATUS[code], "message": reason, "rank": culprit}
            )
        )
        return summary

    def _verdict(self, reports: dict) -> tuple[Exit, str, int | None]:
        own = []  # (code, ended_at, rank, reason) for ranks that ended by themselves
        for r in self.ranks:
            if r.killed_by_us:
                continue
            rc = r.proc.returncode
            report = reports.get(r.rank)
            if report is not None:
                own.append((Exit(report["exit_code"]), r.ended_at or 0, r.rank, report["reason"]))
            elif rc < 0:
                name = signal.Signals(-rc).name
                own.append(
                    (
                        Exit.ERROR,
                        r.ended_at or 0,
                        r.rank,
                        f"rank {r.rank} was killed by {name} (see logs/rank_{r.rank}.log)",
                    )
                )
            else:
                code = Exit(rc) if rc in Exit._value2member_map_ else Exit.ERROR
                own.append(
                    (
                        code,
                        r.ended_at or 0,
                        r.rank,
                        f"rank {r.rank} exited with code {rc} without a report (see logs/rank_{r.rank}.log)",
                    )
                )
        failures = [o for o in own if o[0] != Exit.OK]
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
        return code, reason if f"rank {rank}" in reason else f"rank {rank}: {reason}", rank

    def _rank_table(self, reports: dict) -> list[dict]:
        return [
            {
                "rank": r.rank,
                "exit_code": r.proc.returncode,
                "killed_by_supervisor": r.killed_by_us,
                "status": (reports.get(r.rank) or {}).get("status"),
                "peak_memory_bytes": r.peak,
                "state_bytes": ((reports.get(r.rank) or {}).get("metrics") or {}).get("state_bytes"),
                "log": f"logs/rank_{r.rank}.log",
            }
            for r in self.ranks
        ]


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
        summary = sup.merge()
        summary.update(
            status=Exit.ERROR.status,
            exit_code=int(Exit.ERROR),
            reason=f"supervisor received {signal.Signals(signum).name}",
        )
        write_json_atomic(trial_dir / "trial_summary.json", summary)
        os._exit(1)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        sup.start()
        sup.wait()
    finally:
        sup.kill()
        sup.stop_scheduler()
    summary = sup.merge()
    write_json_atomic(trial_dir / "trial_summary.json", summary)
    return summary["exit_code"]
