"""One agent session over a study: the propose → check → run → tell loop and its stop conditions.

The CLI is ``autoresearch.agent``; this module holds the loop so that each file stays readable. The main thread
proposes, checks and tells; worker threads (``--workers``, one by default) only wait for their trial's process.
A proposal is enqueued and immediately asked back, so that it is this agent that runs it and the study's sampler
still sees it as one of its own trials.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autoresearch import ledger
from autoresearch import storage as st
from autoresearch.explain import params_label
from autoresearch.learn import FeasibilityMemory
from autoresearch.proposers.base import ProposalContext, SearchExhausted, params_key
from autoresearch.proposers.samplers import make_sampler
from autoresearch.runner import DEFAULT_COMMAND, Interrupted, TrialResult, run_trial
from autoresearch.slots import Slot, make_slots
from autoresearch.space import load_space

GiB = 1024**3
RAN = ("ok", "error", "invalid") + st.FAILURE_KINDS  # statuses of trials that actually ran
# The sampler may repeat a config, or propose one the space's constraints reject, this often in a row (neither
# costs a run or budget: asking again keeps its own preference) before the agent enqueues an unseen valid random
# config instead. Rejections count because independent TPE models each param alone and cannot learn a joint rule
# such as "the parallel degrees multiply to at most world_size": on parallel.yaml (6 valid of 32 degree
# combinations) its first 40 proposals were all rejected (measured 2026-11-30).
REPEATS_BEFORE_RANDOM = 3


@dataclass
class AgentOptions:
    space: str
    proposer: str = "auto"
    study: str | None = None  # default: the space's name
    storage: str | None = None  # default: sqlite:///<trials_dir>/<study>/study.db
    trials: int | None = None  # default: the space's budget; the study then holds this many finished trials
    timeout: float | None = None  # seconds for this session; default: the space's budget hours
    max_cost: float | None = None  # LLM dollars over the study; default: the space's budget dollars
    max_device_hours: float | None = None  # device time (ranks x wall) over the study: autoresearch.ledger
    patience: int | None = None  # stop after this many trials that ran without improving the best
    seed: int | None = None
    model: str | None = None
    claude_fraction: float = 0.3
    trials_dir: str = "trials"
    command: list[str] | None = None  # trial command prefix; default: python -m core.train
    estimator: str | None = "autoresearch.runner:estimate_with_core"  # MODULE:FUNC(overrides) -> bytes | None
    learn: bool = True  # feasibility memory and memory gate
    resume: bool = False  # insist that the study exists
    max_errors: int = 5  # consecutive errored trials before the agent gives up
    workers: int = 1  # trials running at once, each in its own slot of cores or devices (autoresearch.slots)
    progress: bool = True


@dataclass
class Launch:
    """A trial that passed every check and will run."""

    trial: optuna.Trial
    params: dict
    trial_dir: Path


def load_callable(spec: str):
    """``package.module:function`` -> the function (for --estimator; a user's own code, never an LLM's)."""
    import importlib

    module, _, name = spec.partition(":")
    if not module or not name:
        raise SystemExit(f"--estimator wants MODULE:FUNCTION, got {spec!r}")
    return getattr(importlib.import_module(module), name)


def build_proposer(name: str, opts: AgentOptions):
    """The Proposer for a name (None: the study's sampler chooses every trial)."""
    from autoresearch.proposers.samplers import GridProposer

    if name == "grid":
        return GridProposer()
    if name in ("claude", "hybrid"):
        from autoresearch.proposers.claude import ClaudeProposer  # imports anthropic: only when asked for

        claude = ClaudeProposer(model=opts.model)
        if name == "claude":
            return claude
        from autoresearch.proposers.hybrid import HybridProposer

        return HybridProposer(claude, fraction=opts.claude_fraction)
    return None


class StudyLoop:
    def __init__(self, opts: AgentOptions, proposer_name: str):
        self.opts = opts
        self.proposer_name = proposer_name
        self.space = load_space(opts.space)
        self.study_name = opts.study or self.space.name
        self.study_dir = Path(opts.trials_dir) / self.study_name
        self.command = list(opts.command or DEFAULT_COMMAND)
        self.trials = opts.trials if opts.trials is not None else (self.space.budget_trials or 20)
        hours = self.space.budget_hours
        self.timeout = opts.timeout if opts.timeout is not None else (hours * 3600 if hours else None)
        self.max_cost = opts.max_cost if opts.max_cost is not None else self.space.budget_dollars
        self.proposer = build_proposer(proposer_name, opts)
        self.sampler_name = proposer_name if proposer_name in ("random", "grid") else "tpe"
        self.estimator = self._load_estimator(opts.estimator)
        self.memory = FeasibilityMemory(self.space)  # also holds the memory model, calibrated as trials end
        self._seen_usage = None
        self._estimates: dict[tuple, int | None] = {}
        self.workers = opts.workers
        self.errors_in_a_row = 0
        self.repeats_in_a_row = 0  # proposals that repeated a config or broke the space, since the last new one
        self.repeat_kind = ""      # what the last of them did, for the label of the random config that follows

    # --- set-up ---

    def measure_reference_rate(self, device: str) -> None:
        """MFU's denominator (core.reference_rate), measured now while no trial runs: once per machine, after
        which it is read from the cache. Trials measure it themselves if this fails, so a failure only warns."""
        if tuple(self.command) != DEFAULT_COMMAND:
            return  # another trial command (a test's fake trial): not the core's MFU
        done = subprocess.run([*DEFAULT_COMMAND[:2], "core.reference_rate", "--device", device],
                              capture_output=True, text=True)
        last = ((done.stdout if done.returncode == 0 else done.stderr).strip().splitlines() or ["?"])[-1]
        print(f"reference rate: {last}" if done.returncode == 0 else
              f"reference rate not measured (exit {done.returncode}: {last}); each trial will try", flush=True)

    def _load_estimator(self, spec: str | None):
        if not spec or not self.opts.learn:
            return None
        try:
            return load_callable(spec)
        except (ImportError, AttributeError) as exc:
            print(f"memory gate off: cannot load estimator {spec} ({exc})", flush=True)
            return None

    def open(self) -> optuna.Study:
        url = st.storage_url(self.opts.storage or st.default_storage(self.opts.trials_dir, self.study_name))
        if self.opts.resume and self.study_name not in optuna.get_all_study_names(storage=url):
            raise SystemExit(f"--resume: no study {self.study_name!r} in {url}")
        n_startup = max(3, min(10, self.trials // 4))  # short studies should not spend half their budget at random
        sampler = make_sampler(self.sampler_name, self.opts.seed, n_startup_trials=n_startup,
                               concurrent=self.workers > 1)
        study = st.open_study(self.space, self.study_name, url, sampler)
        for note in st.reap_stale(study):
            print(note, flush=True)
        for t in study.get_trials(deepcopy=False):  # what earlier sessions learned
            if t.state.is_finished() and t.user_attrs.get("status") in RAN:
                self._learn(t.number, t.params, t.user_attrs["status"], t.user_attrs.get("metrics") or {})
        return study

    # --- learning ---

    def _learn(self, number: int, params: dict, status: str, metrics: dict) -> None:
        if self.opts.learn:
            self.memory.record(params, status, metrics, trial=number)

    def predict_memory(self, params: dict) -> tuple[int | None, int | None]:
        """(analytic estimate, calibrated prediction) of the per-rank peak, or Nones without an estimator."""
        if self.estimator is None:
            return None, None
        key = params_key(params)
        if key not in self._estimates:  # the core's estimator composes a Hydra config: worth caching
            try:
                self._estimates[key] = self.estimator(self.space.overrides(params))
            except Exception:  # an estimator that cannot handle a config must not stop the study
                self._estimates[key] = None
        est = self._estimates[key]
        if est is None:
            return None, None
        return int(est), int(self.memory.memory_model.predict(float(est)))  # recalibrated as trials end

    def memory_limit_bytes(self, params: dict) -> float | None:
        limit = params.get("memory.limit_gb", self.space.fixed.get("memory.limit_gb"))
        return float(limit) * GiB if isinstance(limit, (int, float)) and limit > 0 else None

    def skip(self, study: optuna.Study, params: dict, recorded: dict | None = None) -> tuple[str, str, str] | None:
        """(status, reason, constraint kind) when ``params`` should not run, else None. ``recorded``: the
        study's finished trials by params key (``recorded_keys``), when the caller checks many proposals."""
        problems = self.space.check(params)
        if problems:
            return "rejected", "; ".join(problems), "space"
        if self.opts.learn:  # repeats of failures, OOM/NaN dominance, then the memory gate
            est, _ = self.predict_memory(params)
            found = self.memory.verdict(params, est, self.memory_limit_bytes(params))
            if found:
                kind, reason = found  # a repeat of an error or invalid trial is no failure kind to learn
                return ("duplicate" if kind is None else "pruned"), reason, \
                    kind if kind in st.FAILURE_KINDS else None
        # Repeats of any recorded trial, pruned ones included (the memory only knows trials that ran).
        recorded = self.recorded_keys(study) if recorded is None else recorded
        t = recorded.get(params_key(self.space.coerce(params)))
        if t is not None:
            kind = t.user_attrs.get("failure_kind")
            reason = f"duplicate of trial {t.number} ({t.user_attrs.get('status')})"
            return ("pruned" if kind else "duplicate"), reason, kind
        return None

    @staticmethod
    def recorded_keys(study: optuna.Study) -> dict:
        """The first finished trial of each config, by params key (abandoned trials run again: not counted)."""
        out: dict = {}
        for t in study.get_trials(deepcopy=False):
            if t.state.is_finished() and t.user_attrs.get("status") not in st.ABANDONED:
                out.setdefault(params_key(t.params), t)
        return out

    def skip_reason(self, study: optuna.Study, params: dict) -> str | None:
        """``ProposalContext.check``: why a proposal would be skipped, or None."""
        try:
            skipped = self.skip(study, params)
        except ValueError as exc:  # coerce() refuses a value of the wrong type
            return str(exc)
        return skipped[1] if skipped else None

    # --- the loop ---

    def run(self) -> int:
        """Fill every worker slot with a trial that should run, wait for one to end, tell it; until a stop
        condition holds. Proposals that are skipped cost no slot and are recorded at once."""
        from tqdm import tqdm

        from autoresearch.report import ledger_text, render, study_table

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = self.open()
        device = str(self.space.fixed.get("device", "CPU"))
        self.measure_reference_rate(device)
        slots = make_slots(self.workers, device, self.space.world_size)
        start = time.monotonic()
        bar = tqdm(total=self.trials, initial=min(st.finished_count(study), self.trials), unit="trial",
                   desc=self.study_name, dynamic_ncols=True,
                   disable=None if self.opts.progress else True)  # None: shown on a terminal, not in logs
        code, why = 0, ""
        stop = threading.Event()  # set on Ctrl-C / SIGTERM: worker threads end their trials
        running: dict[Future, tuple[Launch, Slot]] = {}
        free = list(reversed(slots))
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="trial")
        hard = ""  # a stop that no trial's end can undo: the search is exhausted, or too many errors
        try:
            while True:
                why = hard  # otherwise asked again: a running trial that errs does not count toward --trials
                while free and not why:
                    why = self.stop_reason(study, start, running=len(running))
                    if why:
                        break
                    try:
                        item = self.prepare(study)
                    except SearchExhausted as exc:
                        why = hard = str(exc)
                        break
                    if isinstance(item, str):  # skipped without running
                        self._report(bar, study, item)
                        continue
                    slot = free.pop()
                    running[pool.submit(self.execute, item, slot, stop)] = (item, slot)
                if not running:
                    break
                done, _ = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
                for future in done:
                    item, slot = running.pop(future)
                    free.append(slot)
                    self._report(bar, study, self.finish(study, item, future.result(), slot))
                if self.errors_in_a_row >= self.opts.max_errors and not hard:
                    hard, code = f"{self.errors_in_a_row} errors in a row: check the trial logs", 1
        except KeyboardInterrupt:
            why, code = "interrupted", 130
            stop.set()
            self._abandon_running(study, running)
        finally:
            pool.shutdown(wait=True)
            bar.close()
        rows = st.trial_rows(study)
        df = study_table(study, rows)
        self.study_dir.mkdir(parents=True, exist_ok=True)
        df.to_csv(self.study_dir / "trials.csv", index=False)
        print(f"\nstopped: {why}\n")
        print(render(df, "markdown"))
        print("\n" + ledger_text(rows))
        self.print_best(study)
        print(f"\ntrials.csv: {self.study_dir / 'trials.csv'}; review with: python -m autoresearch.report "
              f"{self.study_dir}")
        return code

    def _report(self, bar, study: optuna.Study, line: str) -> None:
        bar.n = min(st.finished_count(study), self.trials)
        best = st.best_trial(study)
        if best is not None:
            bar.set_postfix_str(f"best {self.space.objective_metric}={best.value:.5g} (#{best.number})")
        bar.refresh()
        bar.write(line)

    def _abandon_running(self, study: optuna.Study, running: dict) -> None:
        """After Ctrl-C: each worker ends its trial; the config was not at fault, so it runs again later."""
        for future, (item, _) in running.items():
            try:
                future.result()
            except Interrupted:
                pass
            st.abandon(study, study.get_trials(deepcopy=False)[item.trial.number], "interrupted",
                       "the agent was interrupted (Ctrl-C or SIGTERM) while this trial ran")

    def stop_reason(self, study: optuna.Study, start: float, running: int = 0) -> str:
        """Why no further trial should start ("" to go on); ``running`` trials will count once they end."""
        done = st.finished_count(study)
        if done + running >= self.trials:
            return f"the study holds {done} finished trials (--trials {self.trials})" + \
                (f", {running} still running" if running else "")
        if self.timeout is not None and time.monotonic() - start >= self.timeout:
            return f"--timeout {self.timeout:g}s reached"
        if self.max_cost is not None and hasattr(self.proposer, "last_usage"):  # an LLM proposer
            spent = st.llm_cost(study)
            if spent >= self.max_cost:
                return f"LLM spend ${spent:.4f} reached --max-cost ${self.max_cost:g}"
        if self.opts.max_device_hours is not None:
            used = ledger.study_totals(st.trial_rows(study))["device_sec"]
            if used >= self.opts.max_device_hours * 3600:
                return f"device time {used / 3600:.4g} h reached --max-device-hours {self.opts.max_device_hours:g}"
        if self.opts.patience:
            best = st.best_trial(study)
            since = [t for t in study.get_trials(deepcopy=False)
                     if t.state.is_finished() and t.user_attrs.get("status") in RAN
                     and (best is None or t.number > best.number)]
            if len(since) >= self.opts.patience:
                return f"{len(since)} trials ran without improving the best (--patience {self.opts.patience})"
        return ""

    def prepare(self, study: optuna.Study) -> Launch | str:
        """Propose and check one trial: a Launch to run, or the one-line account of a proposal skipped."""
        # Who chooses, in order: a queued config (a reaped trial's rerun); the proposer (on a hybrid, only on
        # Claude's turns); the repeat policy's unseen random config; the study's sampler. The trial's "proposer"
        # names who chose; a proposer that was asked and declined is named in "fallback_from", beside its usage.
        waiting = bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        usage = declined = None
        if not waiting and self.proposer is not None:
            ctx = ProposalContext(self.space, st.trial_rows(study), lambda p: self.skip_reason(study, p))
            proposal = self.proposer.propose(study, ctx)
            usage = self._new_usage(proposal)
            problems = self.space.check(proposal.params) if proposal is not None else []
            if problems:  # a proposer's output is data: it never runs unchecked
                print(f"{proposal.proposer} proposal ignored ({'; '.join(problems)}); another chooser takes "
                      "this trial", flush=True)
            if proposal is not None and not problems:
                study.enqueue_trial(self.space.coerce(proposal.params), user_attrs={
                    "proposer": proposal.proposer, "rationale": proposal.rationale})
                waiting = True
            elif usage is not None:  # Claude (the one LLM proposer) was asked, spent tokens, and declined
                declined = "claude"
        if not waiting and self.repeats_in_a_row >= REPEATS_BEFORE_RANDOM:
            self._enqueue_unseen(study)
        trial = study.ask(self.space.distributions())
        st.mark_running(trial, **({"llm_usage": usage} if usage else {}),
                        **({"fallback_from": declined} if declined else {}))
        if "proposer" not in trial.user_attrs:
            trial.set_user_attr("proposer", self.sampler_name)
        params = dict(trial.params)
        if not self.space.check(params):  # every candidate shows its memory figures, skipped or run
            est, predicted = self.predict_memory(params)
            if est is not None:
                trial.set_user_attr("estimated_memory_bytes", est)
                trial.set_user_attr("predicted_memory_bytes", predicted)
        skipped = self.skip(study, params)
        # A sampler that keeps repeating itself (TPE on a small discrete space does), or keeps breaking the space's
        # constraints, gets an unseen valid config.
        repeated = bool(skipped) and skipped[0] in ("duplicate", "rejected")
        self.repeats_in_a_row = self.repeats_in_a_row + 1 if repeated else 0
        if repeated:
            self.repeat_kind = "repeated a config" if skipped[0] == "duplicate" else "broke the space's constraints"
        if skipped:
            status, reason, kind = skipped
            st.tell_skipped(study, trial, status, reason, kind)
            return f"trial {trial.number:4d} {status:13s} {params_label(params)}: {reason}"
        trial_dir = self.study_dir / f"{trial.number:04d}"
        trial.set_user_attr("trial_dir", str(trial_dir))
        return Launch(trial, params, trial_dir)

    def execute(self, item: Launch, slot: Slot, stop: threading.Event) -> TrialResult:
        """Run one trial in its slot (a worker thread); raises ``Interrupted`` once ``stop`` is set."""
        trial = item.trial
        return run_trial(
            self.space.overrides(item.params), item.trial_dir, command=[*slot.prefix, *self.command],
            env={**os.environ, **slot.env} if slot.env else None, objective_metric=self.space.objective_metric,
            on_start=lambda pid: trial.set_user_attr("trial_pid", st.identity(pid)),
            on_poll=lambda: trial.set_user_attr("heartbeat_at", time.time()), stop=stop)

    def finish(self, study: optuna.Study, item: Launch, result: TrialResult, slot: Slot) -> str:
        """Tell the study how a trial ended and learn from it; returns a one-line account of it."""
        state = st.tell_result(study, item.trial, result)
        self._learn(item.trial.number, item.params, result.status, result.metrics)
        self.errors_in_a_row = self.errors_in_a_row + 1 if state == TrialState.FAIL else 0
        value = "" if result.objective is None else f"{self.space.objective_metric}={result.objective:.5g} "
        where = f" [{slot.label}]" if slot.label else ""
        return (f"trial {item.trial.number:4d} {result.status:13s} {params_label(item.params)}: "
                f"{value}({result.wall_time:.1f}s){where} {result.reason[:120]}")

    def _enqueue_unseen(self, study: optuna.Study) -> None:
        """Enqueue a random config that would run (not a duplicate, not dominated), or end the search."""
        import numpy as np

        rng = np.random.default_rng([self.opts.seed or 0, len(study.trials)])
        recorded = self.recorded_keys(study)  # once: a draw is then checked without reading the study again
        for _ in range(500):
            try:
                params = self.space.sample_random(rng)
            except ValueError:
                break
            if self.skip(study, params, recorded) is None:
                study.enqueue_trial(self.space.coerce(params), user_attrs={
                    "proposer": f"random ({self.sampler_name} {self.repeat_kind})"})
                return
        raise SearchExhausted("no config left that is new and not dominated by a known failure")

    def _new_usage(self, proposal) -> dict | None:
        """LLM usage of this round, counted once. Claude's proposers expose ``last_usage``, which is also set
        when its answers were rejected and TPE took the trial (tokens were still spent); on a hybrid's TPE turn
        it still points at an earlier round's usage, hence the identity check."""
        current = getattr(self.proposer, "last_usage", None)
        if current is None:
            return dict(proposal.usage) if proposal is not None and proposal.usage else None
        if current is self._seen_usage:
            return None
        self._seen_usage = current
        return dict(current)

    def print_best(self, study: optuna.Study) -> None:
        best = st.best_trial(study)
        if best is None:
            print("\nno feasible trial yet")
            return
        print(f"\nbest: trial {best.number}: {self.space.objective_metric}={best.value:.6g}")
        for k, v in best.params.items():
            print(f"  {k} = {v}")
        print("reproduce: " + shlex.join([*self.command, *self.space.overrides(best.params)]))

