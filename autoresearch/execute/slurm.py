"""The Slurm executor (``--executor slurm``): each trial one Slurm job, submitted with ``sbatch`` from the agent's
host (a login node), its states mapped to the project's statuses.

The job (``trial_dir/job.sh``, kept beside the trial for a person to read or resubmit): ``srun`` starts one
``core.train`` per node (``--ntasks-per-node=1``); each is that node's supervisor (``core.trial.supervisor``),
told its node rank and the node count (``MSAR_NODE_RANK``, ``MSAR_NNODES``) and where node 0's MindSpore
scheduler listens (``MSAR_SCHED_HOST``: the job's first node's address; ``MSAR_SCHED_PORT``: from the job id, so that jobs
sharing a node do not collide). The trial's arguments reach ``srun`` as the script's own arguments, never through
a shell line: values can come from an LLM. The trial directory must be on a filesystem every node sees (the
trial's summary, logs and checkpoints are written there), as on any cluster that runs Megatron or MindFormers.

Time: the job's ``--time`` is the trial's budget + grace + margin, rounded up to Slurm's minutes; Slurm enforces
it (``TIMEOUT``), and the agent's own watchdog waits ``LIMIT_SLACK_SEC`` longer before it cancels a job that
Slurm did not end. The clock starts when the job runs, not while it waits in the queue.

What Slurm knows and the trial cannot becomes the status: ``TIMEOUT``/``DEADLINE`` -> timeout,
``OUT_OF_MEMORY`` -> oom, ``NODE_FAIL``/``BOOT_FAIL`` -> node_fail, ``PREEMPTED`` -> preempted, ``CANCELLED`` by
someone other than this agent -> cancelled; the last three say nothing of the config, so the study runs it again
(``autoresearch.records.ABANDONED``). ``COMPLETED`` and ``FAILED`` leave the verdict to the trial's summary and exit
code, as for a local trial.

Adoption: a restarted agent finds the job of a trial its dead predecessor ran by the id it recorded, or, when it
died between ``sbatch`` and recording the id, by the job's name (``msar.<study>.<trial>``); a job still queued or
running is waited for, one that ended meanwhile is read and recorded. No trial is submitted twice.
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
import time
from pathlib import Path

from autoresearch.execute.base import Ended, TrialSpec
from autoresearch.execute.slots import Slot
from autoresearch.records import Status

POLL_SEC = 2.0  # between queries of one job's state: slurmctld is shared with every user of the cluster
LIMIT_SLACK_SEC = 120.0  # Slurm checks time limits about every 30 s and then waits KillWait before SIGKILL
COMMAND_TIMEOUT_SEC = 60.0
# Slurm's states of a job that has not ended (squeue --help, "JOB STATE CODES").
ACTIVE = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "RESV_DEL_HOLD",
}
# An ended job's state -> (the status it is, what Slurm did), for the states a trial cannot see itself.
VERDICTS = {
    "TIMEOUT": (Status.TIMEOUT, "Slurm ended job {id} at its time limit ({limit})"),
    "DEADLINE": (Status.TIMEOUT, "Slurm ended job {id} at its deadline"),
    "OUT_OF_MEMORY": (Status.OOM, "Slurm ended job {id}: out of memory (its memory limit)"),
    "NODE_FAIL": (Status.NODE_FAIL, "a node of Slurm job {id} failed ({nodes})"),
    "BOOT_FAIL": (Status.NODE_FAIL, "a node of Slurm job {id} failed to boot ({nodes})"),
    "PREEMPTED": (Status.PREEMPTED, "Slurm preempted job {id}"),
    "CANCELLED": (Status.CANCELLED, "Slurm job {id} was cancelled outside the agent (scancel)"),
}

_SCRIPT = """#!/bin/bash
# One trial, submitted by the agent (autoresearch.execute.slurm): {name}
# srun starts the trial's command (this script's arguments) once per node; each is that node's supervisor.
first="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
# node 0's address as Slurm knows it (NodeAddr; the node's name where none is set)
MSAR_SCHED_HOST="$(scontrol show node --oneliner "$first" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')"
export MSAR_SCHED_HOST="${{MSAR_SCHED_HOST:-$first}}"
export MSAR_SCHED_PORT="$((20000 + SLURM_JOB_ID % 20000))"
export MSAR_NNODES="$SLURM_JOB_NUM_NODES"
exec srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 \\
    bash -c 'export MSAR_NODE_RANK="$SLURM_NODEID"; exec "$@"' srun-task "$@"
"""


class SlurmError(RuntimeError):
    """A Slurm command failed: the command and what it said."""


def _run(argv: list[str], env: dict | None = None) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=COMMAND_TIMEOUT_SEC)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{shlex.join(argv[:3])} ...: {exc}") from exc
    if done.returncode != 0:
        raise SlurmError(f"{shlex.join(argv)} exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def _seconds(text: str) -> float:
    """Slurm's durations: [D-]HH:MM:SS, MM:SS or SS."""
    days, _, clock = text.rpartition("-")
    parts = [float(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return (int(days) if days else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def job_fields(job_id: str) -> dict[str, str] | None:
    """``scontrol show job``'s fields of a job, or None when slurmctld no longer knows it (``MinJobAge`` after
    its end); ``sacct`` then answers where accounting is kept."""
    try:
        out = _run(["scontrol", "show", "job", "--oneliner", job_id])
    except SlurmError as exc:
        if "Invalid job id" not in str(exc):
            raise
        return _from_accounting(job_id)
    # Key=Value pairs separated by spaces; Command= and a few others may hold spaces, which this never reads.
    return dict(re.findall(r"(?:^|\s)([A-Za-z/:_]+)=(\S*)", out))


def _from_accounting(job_id: str) -> dict[str, str] | None:
    try:
        out = _run(["sacct", "--noheader", "--parsable2", "--allocations", "--jobs", job_id, "--format=State,ExitCode"])
    except SlurmError:
        return None  # no accounting on this cluster
    line = out.strip().splitlines()[:1]
    if not line:
        return None
    state, exit_code = (line[0].split("|") + [""])[:2]
    return {"JobState": state.split()[0], "ExitCode": exit_code, "Reason": state}


def _exit_code(text: str) -> int | None:
    """``ExitCode=rc:signal`` -> rc, or -signal when a signal ended the job."""
    rc, _, sig = text.partition(":")
    if not rc.isdigit():
        return None
    return -int(sig) if sig.isdigit() and int(sig) else int(rc)


class SlurmJob:
    def __init__(self, job_id: str, name: str, submitted: float):
        self.job_id, self.name = job_id, name
        self.started: float | None = None  # set once Slurm runs it: the queue's wait is not the trial's time
        self.slack = LIMIT_SLACK_SEC
        self.record = {"executor": SlurmExecutor.name, "job_id": job_id, "name": name, "submitted": submitted}
        self._queried = 0.0
        self._cancelled = False

    def poll(self, timeout: float) -> Ended | None:
        wait = max(0.0, self._queried + POLL_SEC - time.monotonic())
        if wait > timeout:
            time.sleep(timeout)
            return None
        time.sleep(wait)
        self._queried = time.monotonic()
        fields = job_fields(self.job_id)
        if fields is None:  # forgotten by Slurm: the trial's summary (or its absence) decides
            return Ended(None)
        state = fields.get("JobState", "")
        if state in ACTIVE:
            if self.started is None and state != "PENDING":
                self.started = time.time() - _seconds(fields.get("RunTime", "0"))
            return None
        if self.started is None:
            self.started = time.time() - _seconds(fields.get("RunTime", "0"))
        code = _exit_code(fields.get("ExitCode", ""))
        if state not in VERDICTS or (state == "CANCELLED" and self._cancelled):
            return Ended(code)  # COMPLETED, FAILED: the trial's own summary and exit code decide
        status, text = VERDICTS[state]
        why = text.format(id=self.job_id, limit=fields.get("TimeLimit", "?"), nodes=fields.get("NodeList", "?"))
        return Ended(code, status, why)

    def cancel(self) -> None:
        self._cancelled = True
        try:
            _run(["scancel", self.job_id])
        except SlurmError:
            pass  # already ended


class SlurmExecutor:
    name = "slurm"

    def __init__(
        self,
        *,
        partition: str | None = None,
        account: str | None = None,
        gres: str | None = None,
        options: tuple[str, ...] = (),
    ):
        """``gres``: the name of the devices' generic resource (``npu`` on most Ascend clusters; None on CPU);
        ``options``: further ``sbatch`` options, passed as given."""
        self.partition, self.account, self.gres, self.options = partition, account, gres, tuple(options)

    def slots(self, workers: int, device: str, world_size: int) -> list[Slot]:
        if workers < 1:
            raise SystemExit(f"--workers must be at least 1 (got {workers})")
        return [Slot(i, "slurm") for i in range(workers)]  # Slurm gives each job its own allocation

    def sbatch_args(self, spec: TrialSpec) -> list[str]:
        res = spec.resources
        args = [
            "sbatch",
            "--parsable",
            f"--job-name={spec.name}",
            f"--nodes={res.nodes}",
            "--ntasks-per-node=1",
            "--no-requeue",  # a failed node ends the job (NODE_FAIL): the agent, not Slurm, decides what runs again
            f"--time={max(1, math.ceil(spec.limit / 60))}",
            f"--output={spec.trial_dir / 'stdout.log'}",
            f"--error={spec.trial_dir / 'stderr.log'}",
            f"--chdir={spec.cwd or Path.cwd()}",
        ]
        if res.cores_per_node:
            args.append(f"--cpus-per-task={res.cores_per_node}")
        if self.gres:
            args.append(f"--gres={self.gres}:{res.devices_per_node}")
        args += [f"--partition={self.partition}"] * bool(self.partition)
        args += [f"--account={self.account}"] * bool(self.account)
        return [*args, *self.options]

    def start(self, spec: TrialSpec, slot: Slot) -> SlurmJob:
        script = spec.trial_dir / "job.sh"
        script.write_text(_SCRIPT.format(name=spec.name))
        submitted = time.time()
        out = _run([*self.sbatch_args(spec), str(script), *spec.argv], env=spec.env)
        job_id = out.strip().split(";")[0]  # --parsable: "id" or "id;cluster"
        return SlurmJob(job_id, spec.name, submitted)

    def adopt(self, record: dict) -> SlurmJob | None:
        if record.get("executor") != self.name or not record.get("name"):
            return None
        job_id = record.get("job_id")
        if not job_id:  # the agent died between sbatch and recording the id: find the job by its name
            out = _run(["squeue", "--noheader", f"--name={record['name']}", "--format=%i"])
            ids = out.split()
            if not ids:
                return None
            job_id = ids[0]
        if job_fields(job_id) is None:
            return None
        return SlurmJob(job_id, record["name"], record.get("submitted") or time.time())
