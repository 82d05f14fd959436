"""One agent session over a study: the propose → check → run → tell loop and its stop conditions.

The CLI is ``autoresearch.agent``. The parts, one concept each: ``chooser`` (who picks the config: proposer,
sampler, repeat policy, LLM usage), ``gate`` (whether it runs: space, feasibility memory, memory gate, duplicates),
``runner`` (one trial process), ``storage`` (how outcomes are told), ``confirm`` (re-running the front-runners).
This module schedules them: the main thread chooses, checks and tells; worker threads (``--workers``, one by
default) only wait for their trial's process. A proposal is enqueued and immediately asked back, so that it is
this agent that runs it and the study's sampler still sees it as one of its own trials.
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
from typing import Callable

import optuna
from optuna.trial import TrialState

from autoresearch import confirm, ledger
from autoresearch import storage as st
from autoresearch.chooser import Chooser, build_proposer, sampler_for
from autoresearch.explain import params_label
from autoresearch.gate import Gate
from autoresearch.outcomes import RAN, TrialResult
from autoresearch.proposers.base import SearchExhausted
from autoresearch.proposers.samplers import make_sampler
from autoresearch.runner import DEFAULT_COMMAND, Interrupted, run_trial
from autoresearch.slots import Slot, make_slots
from autoresearch.space import load_space

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
    warm: bool = True  # fork trial processes from a warm server (core.warm; the default command only)
    estimator: str | None = "autoresearch.runner:estimate_with_core"  # MODULE:FUNC(overrides) -> bytes | None
    learn: bool = True  # feasibility memory and memory gate
    resume: bool = False  # insist that the study exists
    max_errors: int = 5  # consecutive errored trials before the agent gives up
    workers: int = 1  # trials running at once, each in its own slot of cores or devices (autoresearch.slots)
    progress: bool = True
    confirm: int = 3  # front-runners re-run after the search (autoresearch.confirm); 0: none
    repeats: int = 3  # confirmation runs per front-runner


@dataclass
class Launch:
    """A trial that passed every check and will run."""

    trial: optuna.Trial
    params: dict
    trial_dir: Path
    extra: tuple[str, ...] = ()  # overrides after the params' (a confirmation run's seed)


@dataclass
class Phase:
    """What a progress bar counts: the search's finished trials, or the confirmation's runs."""

    name: str
    total: int
    done: Callable[[], int]


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
        self.sampler_name = sampler_for(proposer_name)
        self.gate = Gate(self.space, opts.estimator, learn=opts.learn)
        self.chooser = Chooser(self.space, self.gate, build_proposer(proposer_name, opts.model, opts.claude_fraction,
                                                                     opts.seed), self.sampler_name, opts.seed)
        self.workers = opts.workers
        self.errors_in_a_row = 0

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
                self.gate.learn(t.number, t.params, t.user_attrs["status"], t.user_attrs.get("metrics") or {})
        return study

    # --- the loop ---

    def run(self) -> int:
        """The search, then the confirmation of its front-runners (``autoresearch.confirm``), then the table."""
        from autoresearch.report import ledger_text, render, study_table

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = self.open()
        device = str(self.space.fixed.get("device", "CPU"))
        self.measure_reference_rate(device)
        slots = make_slots(self.workers, device, self.space.world_size)
        start = time.monotonic()
        why, code = self._drive(study, slots, self.prepare, lambda running: self.stop_reason(study, start, running),
                                Phase(self.study_name, self.trials, lambda: st.finished_count(study)))
        k, repeats = self.opts.confirm, self.opts.repeats
        if code == 0 and k > 0 and repeats > 0 and st.best_trial(study) is not None:
            total = min(k, len(confirm.front_runners(study, k))) * repeats
            print(f"\nsearch stopped: {why}\nconfirming the {k} best configs, {repeats} runs each "
                  f"(--confirm {k} --repeats {repeats})", flush=True)
            why, code = self._drive(
                study, slots, self.prepare_confirmation, lambda running: self.budget_reason(study, start),
                Phase("confirm", total, lambda: confirm.done_runs(study, k, repeats)))
        rows = st.trial_rows(study)
        df = study_table(study, rows)
        self.study_dir.mkdir(parents=True, exist_ok=True)
        df.to_csv(self.study_dir / "trials.csv", index=False)
        print(f"\nstopped: {why}\n")
        print(render(df, "markdown"))
        print("\n" + ledger_text(rows))
        print(f"\ntrials.csv: {self.study_dir / 'trials.csv'}; review with: python -m autoresearch.report "
              f"{self.study_dir}")
        self.print_outcome(study)
        return code

    def _drive(self, study: optuna.Study, slots: list[Slot], prepare, stop_reason, phase: "Phase") -> tuple[str, int]:
        """Fill every worker slot with a trial that should run, wait for one to end, tell it; until
        ``stop_reason(running)`` names a reason or ``prepare`` has nothing left (None). Proposals that are
        skipped (``prepare`` returns their line) cost no slot and are recorded at once. Returns (why, exit code)."""
        from tqdm import tqdm

        bar = tqdm(total=phase.total, initial=min(phase.done(), phase.total), unit="trial", desc=phase.name,
                   dynamic_ncols=True, disable=None if self.opts.progress else True)  # None: only on a terminal
        code, why = 0, ""
        stop = threading.Event()  # set on Ctrl-C / SIGTERM: worker threads end their trials
        running: dict[Future, tuple[Launch, Slot]] = {}
        free = list(reversed(slots))
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="trial")
        hard = ""  # a stop that no trial's end can undo: nothing left to run, or too many errors
        try:
            while True:
                why = hard  # otherwise asked again: a running trial that errs does not count toward --trials
                while free and not why:
                    why = stop_reason(len(running))
                    if why:
                        break
                    try:
                        item = prepare(study)
                    except SearchExhausted as exc:
                        item = exc
                    if item is None or isinstance(item, SearchExhausted):
                        why = hard = str(item or f"{phase.name}: every run done")
                        break
                    if isinstance(item, str):  # skipped without running
                        self._report(bar, study, item, phase)
                        continue
                    slot = free.pop()
                    running[pool.submit(self.execute, item, slot, stop)] = (item, slot)
                if not running:
                    break
                done, _ = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
                for future in done:
                    item, slot = running.pop(future)
                    free.append(slot)
                    self._report(bar, study, self.finish(study, item, future.result(), slot), phase)
                if self.errors_in_a_row >= self.opts.max_errors and not hard:
                    hard, code = f"{self.errors_in_a_row} errors in a row: check the trial logs", 1
        except KeyboardInterrupt:
            why, code = "interrupted", 130
            stop.set()
            self._abandon_running(study, running)
        finally:
            pool.shutdown(wait=True)
            bar.close()
        return why, code

    def _report(self, bar, study: optuna.Study, line: str, phase: "Phase") -> None:
        bar.n = min(phase.done(), phase.total)
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
        """Why no further search trial should start ("" to go on); ``running`` trials will count once they end."""
        done = st.finished_count(study)
        if done + running >= self.trials:
            return f"the study holds {done} finished trials (--trials {self.trials})" + \
                (f", {running} still running" if running else "")
        why = self.budget_reason(study, start)
        if not why and self.opts.patience:
            best = st.best_trial(study)
            since = [t for t in study.get_trials(deepcopy=False)
                     if t.state.is_finished() and t.user_attrs.get("status") in RAN and not st.is_confirmation(t)
                     and (best is None or t.number > best.number)]
            if len(since) >= self.opts.patience:
                return f"{len(since)} trials ran without improving the best (--patience {self.opts.patience})"
        return why

    def budget_reason(self, study: optuna.Study, start: float) -> str:
        """The budgets that bound every trial of the session, search and confirmation alike ("" to go on)."""
        if self.timeout is not None and time.monotonic() - start >= self.timeout:
            return f"--timeout {self.timeout:g}s reached"
        if self.max_cost is not None and self.chooser.uses_llm:
            spent = st.llm_cost(study)
            if spent >= self.max_cost:
                return f"LLM spend ${spent:.4f} reached --max-cost ${self.max_cost:g}"
        if self.opts.max_device_hours is not None:
            used = ledger.study_totals(st.trial_rows(study))["device_sec"]
            if used >= self.opts.max_device_hours * 3600:
                return f"device time {used / 3600:.4g} h reached --max-device-hours {self.opts.max_device_hours:g}"
        return ""

    def prepare(self, study: optuna.Study) -> Launch | str:
        """Choose and check one trial: a Launch to run, or the one-line account of a proposal skipped."""
        trial = self.chooser.ask(study)
        params = dict(trial.params)
        if not self.space.check(params):  # every candidate shows its memory figures, skipped or run
            est, predicted = self.gate.predict_memory(params)
            if est is not None:
                trial.set_user_attr("estimated_memory_bytes", est)
                trial.set_user_attr("predicted_memory_bytes", predicted)
        skipped = self.gate.skip(study, params)
        self.chooser.note(skipped)
        if skipped:
            status, reason, kind = skipped
            st.tell_skipped(study, trial, status, reason, kind)
            return f"trial {trial.number:4d} {status:13s} {params_label(params)}: {reason}"
        trial_dir = self.study_dir / f"{trial.number:04d}"
        trial.set_user_attr("trial_dir", str(trial_dir))
        return Launch(trial, params, trial_dir)

    def prepare_confirmation(self, study: optuna.Study) -> Launch | None:
        """The next confirmation run of a front-runner's config, or None when each has its repeats."""
        nxt = confirm.next_run(study, self.opts.confirm, self.opts.repeats)
        if nxt is None:
            return None
        origin, repeat = nxt
        confirm.enqueue(study, origin, repeat)
        trial = study.ask(self.space.distributions())
        st.mark_running(trial)
        trial_dir = self.study_dir / f"{trial.number:04d}"
        trial.set_user_attr("trial_dir", str(trial_dir))
        extra = confirm.seed_override(study, self.space.fixed, origin.params, repeat)
        return Launch(trial, dict(trial.params), trial_dir, tuple(extra))

    def execute(self, item: Launch, slot: Slot, stop: threading.Event) -> TrialResult:
        """Run one trial in its slot (a worker thread); raises ``Interrupted`` once ``stop`` is set."""
        trial = item.trial
        return run_trial(
            [*self.space.overrides(item.params), *item.extra], item.trial_dir, command=[*slot.prefix, *self.command],
            env={**os.environ, **slot.env} if slot.env else None, objective_metric=self.space.objective_metric,
            on_start=lambda pid: trial.set_user_attr("trial_pid", st.identity(pid)),
            on_poll=lambda: trial.set_user_attr("heartbeat_at", time.time()), stop=stop)

    def finish(self, study: optuna.Study, item: Launch, result: TrialResult, slot: Slot) -> str:
        """Tell the study how a trial ended and learn from it; returns a one-line account of it."""
        state = st.tell_result(study, item.trial, result)
        self.gate.learn(item.trial.number, item.params, result.status, result.metrics)
        self.errors_in_a_row = self.errors_in_a_row + 1 if state == TrialState.FAIL else 0
        value = "" if result.objective is None else f"{self.space.objective_metric}={result.objective:.5g} "
        where = f" [{slot.label}]" if slot.label else ""
        attrs = item.trial.user_attrs
        if st.is_confirmation(item.trial):
            where += f" confirming trial {attrs['confirmation_of']} (run {attrs['repeat'] + 1})"
        return (f"trial {item.trial.number:4d} {result.status:13s} {params_label(item.params)}: "
                f"{value}({result.wall_time:.1f}s){where} {result.reason[:120]}")

    def print_outcome(self, study: optuna.Study) -> None:
        """The search's best run, the confirmation table, and last the verdict: a winner only with evidence."""
        from autoresearch.report import to_markdown

        best = st.best_trial(study)
        if best is None:
            print("\nno feasible trial yet")
            return
        metric = self.space.objective_metric
        print(f"\nsearch's best run: trial {best.number}: {metric}={best.value:.6g}")
        v = confirm.verdict(study, self.opts.confirm, self.opts.repeats) if self.opts.confirm > 0 else None
        pick = best.params
        if v is not None:
            import pandas as pd

            print(f"\nconfirmation ({self.opts.repeats} runs per config; mean ± std of those runs, the search's "
                  "own run left out):")
            print(to_markdown(pd.DataFrame(confirm.table(v, metric))))
            pick = v.winner.params if v.winner is not None else pick
        for k, value in pick.items():
            print(f"  {k} = {value}")
        print("reproduce: " + shlex.join([*self.command, *self.space.overrides(pick)]))
        print(v.line if v is not None else f"best (unconfirmed, --confirm 0): trial {best.number}, {metric}="
              f"{best.value:.6g}")
