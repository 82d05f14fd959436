"""Where a study's trials run. An executor starts a trial with the resources it asks for, polls it, cancels it, and
adopts it again after the agent restarts; the session only waits for it (``wait``) and tells the study.

base.py    Resources, TrialSpec, Ended, the Executor and Job protocols, wait(): one job to its TrialResult
local.py   LocalExecutor: a process group on this machine in its slot (cores or devices), forked warm
slurm.py   SlurmExecutor: one Slurm job per trial (sbatch; srun starts core.train on every node), states mapped
slots.py   Slot, make_slots: each concurrent local trial's share of the cores (taskset) or devices
"""

from autoresearch.execute.base import Ended, Executor, Interrupted, Job, Resources, TrialSpec, wait
from autoresearch.execute.local import LocalExecutor
from autoresearch.execute.slurm import SlurmError, SlurmExecutor

EXECUTORS = {LocalExecutor.name: LocalExecutor, SlurmExecutor.name: SlurmExecutor}

__all__ = [
    "EXECUTORS",
    "Ended",
    "Executor",
    "Interrupted",
    "Job",
    "LocalExecutor",
    "Resources",
    "SlurmError",
    "SlurmExecutor",
    "TrialSpec",
    "wait",
]
