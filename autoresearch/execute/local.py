"""The local executor (``--executor local``, the default): each trial a process group on this machine, in a slot
of its own (``autoresearch.execute.slots``: its share of the cores or its devices), forked from the agent's warm server
when one runs (``core.trial.fork_server``). A trial of several ranks is started by its own supervisor
(``core.trial.supervisor``), so the executor sees one process whatever the layout.

A trial of a dead agent is not adopted: its process was the agent's child, so its exit code is lost with it, and
the reaper (``autoresearch.study.reaper``) ends the orphan and queues its config again.
"""

from __future__ import annotations

import os
import subprocess
import time

from autoresearch.execute.base import Ended, TrialSpec
from autoresearch.execute.slots import Slot, make_slots
from autoresearch.study.reaper import identity
from core.trial import fork_server
from core.trial.processes import kill_group


class LocalJob:
    def __init__(self, proc, started: float):
        self.proc, self.started, self.slack = proc, started, 0.0
        self.record = {"executor": LocalExecutor.name, **identity(proc.pid)}

    def poll(self, timeout: float) -> Ended | None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return Ended(self.proc.returncode)

    def cancel(self) -> None:
        if self.proc.poll() is None:
            kill_group(self.proc.pid, self.proc)


class LocalExecutor:
    name = "local"

    def slots(self, workers: int, device: str, world_size: int) -> list[Slot]:
        return make_slots(workers, device, world_size)

    @staticmethod
    def check(nodes: int) -> None:
        """This machine is one node: a SystemExit saying what to use for more."""
        if nodes > 1:
            raise SystemExit(
                f"a trial asks for {nodes} nodes (resources.nodes); --executor local runs trials on this machine "
                "only: use --executor slurm, or resources.nodes: 1"
            )

    def start(self, spec: TrialSpec, slot: Slot) -> LocalJob:
        self.check(spec.resources.nodes)
        env = spec.env
        if slot.env:
            env = {**(env or os.environ), **slot.env}
        started = time.time()
        with open(spec.trial_dir / "stdout.log", "wb") as out, open(spec.trial_dir / "stderr.log", "wb") as err:
            # A new session = a new process group: cancel() ends the trial and every worker it started.
            proc = fork_server.popen(
                [*slot.prefix, *spec.argv],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
                cwd=spec.cwd,
            )
        return LocalJob(proc, started)

    def adopt(self, record: dict) -> None:
        return None
