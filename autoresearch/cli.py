"""The agent's command line: ``python -m autoresearch.agent --space parallel.yaml [options]``.

Each round: a proposer (the GP model, Claude, the grid) suggests params, which are validated and enqueued into the
Optuna study; otherwise the study's sampler (TPE, random) picks them. Before anything runs, the proposal is checked
against the space, earlier trials (duplicates), the feasibility memory (configs dominated by a known OOM or NaN)
and the memory gate (predicted peak above ``memory.limit_gb``): a skipped proposal is recorded as PRUNED with its
reason and costs no run. Otherwise the trial runs as a subprocess and its outcome is told to the study
(``autoresearch.study.storage``). Killing the agent loses nothing: the same command resumes the study.

The options are ``autoresearch.run.options.AgentOptions``: its fields' docstrings are this command's help, so a
flag and its default are written once.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shlex
import signal
import sys
import typing

from autoresearch.core_adapter import DEFAULT_COMMAND
from autoresearch.report.console import Console, print_outcome
from autoresearch.run.options import AgentOptions
from autoresearch.run.session import Session
from autoresearch.search import HYBRID_SAMPLER
from autoresearch.space import SpaceError, check_trial_command
from autoresearch.study import StorageUnavailable
from core.config.docs import field_docs
from core.trial import fork_server

GP_WHY = (
    "gp: a Gaussian process ranks the configs predicted to run; it beat Optuna's TPE and random search on "
    "every table of the search suite"
)
DESCRIPTION = (
    "The autoresearch agent: propose a trial, check it, run it, learn from how it ended; repeat.\n\n"
    "A restart with the same --study resumes it: finished trials are kept,\ntrials left RUNNING by a "
    "killed agent are reaped (FAIL) and their configs run again."
)


def resolve_proposer(requested: str, env: dict | None = None) -> tuple[str, str]:
    """Which proposer runs, and why (the first line the agent prints)."""
    env = os.environ if env is None else env
    has_key = bool(env.get("ANTHROPIC_API_KEY"))
    if requested == "auto":  # the search suite's winner (benchmarks/search_suite.py), alone or beside Claude
        if has_key:
            return (
                "hybrid",
                f"ANTHROPIC_API_KEY is set: Claude proposes a fraction of trials, {HYBRID_SAMPLER} the rest",
            )
        return "gp", f"ANTHROPIC_API_KEY not set; Claude disabled. {GP_WHY}"
    if requested in ("claude", "hybrid") and not has_key:
        raise SystemExit(f"--proposer {requested} needs ANTHROPIC_API_KEY in the environment (or use --proposer tpe)")
    return requested, "requested with --proposer"


def build_parser() -> argparse.ArgumentParser:
    """argparse from ``AgentOptions``: a flag per field (``--max-cost`` for ``max_cost``; a boolean that is on by
    default becomes the ``flag`` its metadata names, e.g. ``--cold``), its help the field's docstring."""
    ap = argparse.ArgumentParser(
        prog="python -m autoresearch.agent",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    docs, hints = field_docs(AgentOptions), typing.get_type_hints(AgentOptions)
    for f in dataclasses.fields(AgentOptions):
        meta, help_text = f.metadata, docs[f.name].replace("%", "%%")
        if hints[f.name] is bool:
            flag = meta.get("flag", f"--{f.name.replace('_', '-')}")
            ap.add_argument(flag, dest=f.name, action="store_false" if f.default else "store_true", help=help_text)
            continue
        if hints[f.name] == bool | None:  # three ways: --x, --no-x, or neither (the field's own default, None)
            flag = meta.get("flag", f"--{f.name.replace('_', '-')}")
            ap.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
            continue
        kind = [t for t in typing.get_args(hints[f.name]) if t is not type(None)] or [hints[f.name]]
        kwargs = {"type": str if meta.get("shell") or kind[0] is str else kind[0]}
        if f.default is dataclasses.MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = f.default
            help_text += " (default: %(default)s)" if f.default is not None else ""
        for key in ("choices", "metavar"):
            if key in meta:
                kwargs[key] = meta[key]
        ap.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, help=help_text, **kwargs)
    return ap


def parse_args(argv: list[str] | None = None) -> AgentOptions:
    ap = build_parser()
    values = vars(ap.parse_args(argv))
    for f in dataclasses.fields(AgentOptions):
        if f.metadata.get("shell") and values[f.name] is not None:
            values[f.name] = shlex.split(values[f.name])
    if (values["estimator"] or "").lower() == "none":
        values["estimator"] = None
    opts = AgentOptions(**values)
    problem = opts.check()
    if problem:
        ap.error(problem)
    return opts


@contextlib.contextmanager
def warm_starts(wanted: bool):
    """The study's trials forked from a warm server (``core.trial.fork_server``) while the block runs, when
    ``wanted``; if the server cannot start, the agent says why and its trials start cold."""
    with contextlib.ExitStack() as stack:
        if wanted:
            try:
                stack.enter_context(fork_server.serving())
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
    agent_log = logging.getLogger("autoresearch")
    try:
        console = Console("objective", progress=opts.progress)
        agent_log.addHandler(console)
        agent_log.setLevel(logging.INFO)
        session = Session(opts, name, listener=console)
        console.metric = session.space.objective_metric
        check_trial_command(session.space, session.command)
        with warm_starts(opts.warm and opts.executor == "local" and tuple(session.command) == DEFAULT_COMMAND):
            outcome = session.run()
        print_outcome(session, outcome)
        return outcome.code
    except (SpaceError, StorageUnavailable) as exc:  # a malformed space file, a storage that cannot open: say
        print(f"error: {exc}", file=sys.stderr)  # where and why, no traceback
        return 2
    finally:
        agent_log.handlers = [h for h in agent_log.handlers if not isinstance(h, Console)]
        signal.signal(signal.SIGTERM, previous)
