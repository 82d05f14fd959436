"""What one agent session is asked to do: ``AgentOptions``, each field documented where it is declared. The agent's
command line (``autoresearch.cli``) is generated from these fields and their docstrings, so a default lives here
only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoresearch.search.proposers.model_based import MIN_GAIN

PROPOSERS = ("auto", "claude", "gp", "tpe", "hybrid", "random", "grid")
PLANNED = ("auto", "gp", "hybrid", "claude")  # the proposers --plan serves: the gp's prior, Claude's prompt
DEFAULT_ESTIMATOR = "autoresearch.core_adapter:estimate_with_core"


@dataclass(kw_only=True)
class AgentOptions:
    space: str
    """Search space YAML: a path, or a name in search_spaces/."""
    proposer: str = field(default="auto", metadata={"choices": PROPOSERS})
    """Who proposes trials. auto: hybrid (Claude + gp) when ANTHROPIC_API_KEY is set, else gp."""
    plan: bool | None = field(default=None, metadata={"flag": "--plan"})
    """Plan before paying: rank the space by the core's step-time model (python -m autoresearch.plan) and search
    from it: the first trial is the plan's best runnable point, the gp models the runs' errors against the plan,
    and every run refits the model's efficiency factors (autoresearch.search.prior); Claude is shown the plan's
    best predictions. Needs a tokens_per_sec or step_time_ms_median objective of core.train's trials and a proposer
    that uses it (auto, gp, hybrid, claude). By default the agent plans where the model answers without measuring
    first (an accelerator's profile, or a CPU this machine has calibrated) and says so; --plan insists (a CPU
    cluster is calibrated first: python -m core.perf calibrate, minutes, once per machine), --no-plan never."""
    trials: int | None = field(default=None, metadata={"metavar": "N"})
    """Stop when the study holds N finished trials (COMPLETE or PRUNED; errors and reaped trials don't count);
    default: the space's budget, else 20."""
    timeout: float | None = field(default=None, metadata={"metavar": "SEC"})
    """Stop starting trials after SEC seconds of this session; default: the space's budget hours."""
    max_cost: float | None = field(default=None, metadata={"metavar": "USD"})
    """Stop when the study's LLM spend reaches USD; default: the space's budget dollars."""
    confirm: int = field(default=3, metadata={"metavar": "K"})
    """After the search, re-run the K best distinct configs (0: no confirmation) and name a winner only if its lead
    exceeds 2 sigma of the noise."""
    repeats: int = field(default=3, metadata={"metavar": "R"})
    """Confirmation runs per config, interleaved, in fresh processes."""
    max_device_hours: float | None = field(default=None, metadata={"metavar": "H"})
    """Stop when the study's trials have used H device-hours (ranks x wall time, summed over the study:
    autoresearch.study.ledger)."""
    patience: int | None = field(default=None, metadata={"metavar": "K"})
    """Stop after K trials that ran without improving the best."""
    min_gain: float = field(default=MIN_GAIN, metadata={"metavar": "SHARE"})
    """With the plan: stop the search when no config left is expected to improve on the best by this share of its
    objective (the gp's expected improvement over the refitted step-time model); 0: run to the other limits."""
    study: str | None = None
    """Study name; default: the space's name."""
    storage: str | None = field(default=None, metadata={"metavar": "URL"})
    """SQLAlchemy URL of the study; default: sqlite:///<trials-dir>/<study>/study.db. PostgreSQL lets agents on
    several machines share a study."""
    resume: bool = False
    """Resuming is automatic; this only insists that the study already exists."""
    seed: int | None = None
    """Sampler and proposer seed."""
    model: str | None = None
    """Claude model for claude/hybrid; default: the proposer's own."""
    claude_fraction: float = 0.3
    """Share of hybrid trials Claude proposes."""
    trials_dir: str = "trials"
    """Where trial directories and the default study.db go."""
    command: list[str] | None = field(default=None, metadata={"shell": True})
    """Trial command prefix, split like a shell line but run without one; default: '<python> -m core.train'
    (tests pass a fake)."""
    estimator: str | None = DEFAULT_ESTIMATOR
    """MODULE:FUNC(overrides) -> per-rank bytes for the memory gate; 'none' disables it."""
    learn: bool = field(default=True, metadata={"flag": "--no-learn"})
    """Feasibility memory and memory gate; --no-learn runs every proposal (duplicates and space violations are
    still skipped)."""
    max_errors: int = 5
    """Give up after this many errored trials in a row."""
    workers: int = 1
    """Trials at once, each on its own share of the cores (taskset) or devices; several agents may also share one
    --storage."""
    progress: bool = field(default=True, metadata={"flag": "--no-progress"})
    """A progress bar (on a terminal); --no-progress: none."""
    executor: str = field(default="local", metadata={"choices": ("local", "slurm")})
    """Where trials run. local: processes on this machine, --workers of them side by side (autoresearch.execute.local);
    slurm: each trial one Slurm job submitted with sbatch, --workers jobs in flight, sized by the space's resources
    (nodes, devices_per_node) (autoresearch.execute.slurm)."""
    slurm_partition: str | None = field(default=None, metadata={"metavar": "NAME"})
    """--executor slurm: the partition to submit to; default: the space's slurm.partition, else Slurm's default."""
    slurm_account: str | None = field(default=None, metadata={"metavar": "NAME"})
    """--executor slurm: the account to charge; default: the space's slurm.account, else yours."""
    sbatch: list[str] | None = field(default=None, metadata={"shell": True, "metavar": "OPTIONS"})
    """--executor slurm: further sbatch options, split like a shell line (e.g. '--qos=high --exclusive'); added
    after the space's slurm.options."""
    warm: bool = field(default=True, metadata={"flag": "--cold"})
    """Fork every trial's processes from a warm server that imported MindSpore once (core.trial.fork_server: each
    trial skips the imports; benchmarks/RESULTS.md, "Fused optimizer kernels and warm starts"); --cold starts each
    afresh."""

    def check(self) -> str | None:
        """What is wrong with these options, in the words of the flag to change; None when nothing is."""
        if self.workers < 1:
            return f"--workers must be at least 1 (got {self.workers})"
        if self.confirm < 0 or self.repeats < 1:
            return (
                f"--confirm must be >= 0 and --repeats >= 1 (got {self.confirm}, {self.repeats}); --confirm 0 "
                "skips the confirmation"
            )
        if self.plan and self.proposer not in PLANNED:  # (by default the plan serves only those)
            return (
                f"--plan informs the gp and Claude; --proposer {self.proposer} uses neither (use {'/'.join(PLANNED)})"
            )
        if not 0 <= self.min_gain < 1:
            return f"--min-gain must be a share in [0, 1) (got {self.min_gain:g}); 0 runs to the other limits"
        if self.max_device_hours is not None and self.max_device_hours < 0:
            return f"--max-device-hours must be 0 or more (got {self.max_device_hours:g})"
        return None
