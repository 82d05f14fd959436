"""The autoresearch agent: propose a trial, check it, run it, learn from how it ended; repeat.

    python -m autoresearch.agent --space parallel.yaml [--proposer auto|gp|claude|hybrid|tpe|random|grid]
                                 [--trials N] [--workers K] [--timeout SEC] [--max-cost USD]
                                 [--max-device-hours H] [--patience K] [--confirm K] [--repeats R]
                                 [--study NAME] [--storage URL]

Each round: a proposer (the GP model, Claude, the grid) suggests params, which are validated and enqueued into the
Optuna study; otherwise the study's sampler (TPE, random) picks them. Before anything runs, the proposal is checked
against the space, earlier trials (duplicates), the feasibility memory (configs dominated by a known OOM or NaN)
and the memory gate (predicted peak above ``memory.limit_gb``): a skipped proposal is recorded as PRUNED with
its reason and costs no run. Otherwise the trial runs as a subprocess and its outcome is told to the study (see
``autoresearch.storage`` for how outcomes map onto Optuna states and constraints). Killing the agent loses
nothing: the same command resumes the study.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys

from autoresearch.chooser import HYBRID_SAMPLER
from autoresearch.loop import AgentOptions, StudyLoop
from autoresearch.runner import DEFAULT_COMMAND
from autoresearch.space import SpaceError
from autoresearch.space_core import check_trial_command
from core.trial import fork_server as warm

PROPOSERS = ("auto", "claude", "gp", "tpe", "hybrid", "random", "grid")
GP_WHY = ("gp: a Gaussian process ranks the configs predicted to run; it beat Optuna's TPE and random search on "
          "every table of the search suite")


def resolve_proposer(requested: str, env: dict | None = None) -> tuple[str, str]:
    """Which proposer runs, and why (the first line the agent prints)."""
    env = os.environ if env is None else env
    has_key = bool(env.get("ANTHROPIC_API_KEY"))
    if requested == "auto":  # the search suite's winner (benchmarks/search_suite.py), alone or beside Claude
        if has_key:
            return "hybrid", f"ANTHROPIC_API_KEY is set: Claude proposes a fraction of trials, {HYBRID_SAMPLER} the rest"
        return "gp", f"ANTHROPIC_API_KEY not set; Claude disabled. {GP_WHY}"
    if requested in ("claude", "hybrid") and not has_key:
        raise SystemExit(f"--proposer {requested} needs ANTHROPIC_API_KEY in the environment "
                         "(or use --proposer tpe)")
    return requested, "requested with --proposer"


def parse_args(argv: list[str] | None = None) -> AgentOptions:
    ap = argparse.ArgumentParser(
        prog="python -m autoresearch.agent", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0] + "\n\nA restart with the same --study resumes it: finished trials "
        "are kept,\ntrials left RUNNING by a killed agent are reaped (FAIL) and their configs run again.")
    ap.add_argument("--space", required=True, help="search space YAML: a path, or a name in search_spaces/")
    ap.add_argument("--proposer", choices=PROPOSERS, default="auto",
                    help="auto (default): hybrid (Claude + gp) when ANTHROPIC_API_KEY is set, else gp")
    ap.add_argument("--trials", type=int, help="stop when the study holds N finished trials (COMPLETE or "
                    "PRUNED; errors and reaped trials don't count); default: the space's budget")
    ap.add_argument("--timeout", type=float, help="stop starting trials after SEC seconds of this session; "
                    "default: the space's budget hours")
    ap.add_argument("--max-cost", type=float, help="stop when the study's LLM spend reaches USD; "
                    "default: the space's budget dollars")
    ap.add_argument("--confirm", type=int, default=AgentOptions.confirm, metavar="K",
                    help="after the search, re-run the K best distinct configs (default %(default)s; 0: no "
                    "confirmation) and name a winner only if its lead exceeds 2 sigma of the noise")
    ap.add_argument("--repeats", type=int, default=AgentOptions.repeats, metavar="R",
                    help="confirmation runs per config, interleaved, in fresh processes (default %(default)s)")
    ap.add_argument("--max-device-hours", type=float, help="stop when the study's trials have used H device-hours "
                    "(ranks x wall time, summed over the study: autoresearch.ledger)")
    ap.add_argument("--patience", type=int, help="stop after K trials that ran without improving the best")
    ap.add_argument("--study", help="study name (default: the space's name)")
    ap.add_argument("--storage", help="SQLAlchemy URL (default: sqlite:///<trials-dir>/<study>/study.db); "
                    "PostgreSQL lets agents on several machines share a study")
    ap.add_argument("--resume", action="store_true", help="resuming is automatic; this only insists that the "
                    "study already exists")
    ap.add_argument("--seed", type=int, help="sampler seed")
    ap.add_argument("--model", help="Claude model for claude/hybrid (default: the proposer's own)")
    ap.add_argument("--claude-fraction", type=float, default=0.3, help="share of hybrid trials Claude proposes")
    ap.add_argument("--trials-dir", default="trials", help="where trial dirs and the default study.db go")
    ap.add_argument("--command", help="trial command prefix, split like a shell line but run without one "
                    "(default: '<python> -m core.train'; tests pass a fake)")
    ap.add_argument("--estimator", default=AgentOptions.estimator,
                    help="MODULE:FUNC(overrides) -> per-rank bytes for the memory gate; 'none' disables it")
    ap.add_argument("--no-learn", action="store_true", help="run every proposal: no feasibility memory, "
                    "no memory gate (duplicates and space violations are still skipped)")
    ap.add_argument("--max-errors", type=int, default=5, help="give up after this many errors in a row")
    ap.add_argument("--workers", type=int, default=1, help="trials at once, each on its own share of the "
                    "cores (taskset) or devices; default 1 (several agents may also share one --storage)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--cold", action="store_true", help="start every trial's processes afresh instead of forking "
                    "them from a warm server that has imported MindSpore once (core.warm: 1-2 s less per trial on 2 cores)")
    a = ap.parse_args(argv)
    if a.workers < 1:
        ap.error(f"--workers must be at least 1 (got {a.workers})")
    if a.confirm < 0 or a.repeats < 1:
        ap.error(f"--confirm must be >= 0 and --repeats >= 1 (got {a.confirm}, {a.repeats}); --confirm 0 skips "
                 "the confirmation")
    if a.max_device_hours is not None and a.max_device_hours < 0:
        ap.error(f"--max-device-hours must be 0 or more (got {a.max_device_hours:g})")
    return AgentOptions(
        space=a.space, proposer=a.proposer, study=a.study, storage=a.storage, trials=a.trials, timeout=a.timeout,
        max_cost=a.max_cost, max_device_hours=a.max_device_hours, patience=a.patience, seed=a.seed, model=a.model,
        claude_fraction=a.claude_fraction,
        trials_dir=a.trials_dir, command=shlex.split(a.command) if a.command else None,
        estimator=None if (a.estimator or "").lower() == "none" else a.estimator, learn=not a.no_learn,
        resume=a.resume, max_errors=a.max_errors, workers=a.workers, progress=not a.no_progress,
        confirm=a.confirm, repeats=a.repeats, warm=not a.cold)


@contextlib.contextmanager
def warm_starts(wanted: bool):
    """The study's trials forked from a warm server (``core.warm``) while the block runs, when ``wanted``; if the
    server cannot start, the agent says why and its trials start cold."""
    with contextlib.ExitStack() as stack:
        if wanted:
            try:
                stack.enter_context(warm.serving())
            except (OSError, RuntimeError) as exc:
                print(f"warm starts unavailable ({exc}); every trial imports MindSpore itself", flush=True)
        yield


def _terminate(signum, frame):
    # SIGTERM behaves like Ctrl-C: the running trial is ended and recorded, the study stays consistent.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    name, why = resolve_proposer(opts.proposer)
    print(f"proposer: {name} ({why})", flush=True)  # the first line, before anything can log
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        loop = StudyLoop(opts, name)
        check_trial_command(loop.space, loop.command)
        with warm_starts(opts.warm and tuple(loop.command) == DEFAULT_COMMAND):
            return loop.run()
    except SpaceError as exc:  # a malformed space file: say where and why, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
