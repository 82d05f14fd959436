"""One agent session over a study: the search (propose → check → run → tell), then the confirmation of its
front-runners, with the session's stop conditions. It prints nothing: what happens is told to a ``Listener``
(``autoresearch.report.console`` shows it), and ``run()`` returns the ``Outcome``.

The parts, one concept each: ``search.chooser`` (who picks the config), ``search.gate`` (whether it runs),
``run.runner`` (one trial process), ``run.scheduler`` (trials side by side in their slots), ``study.storage`` (how
outcomes are told), ``study.confirm`` (re-running the front-runners). A proposal is enqueued and immediately asked
back, so that it is this agent that runs it and the study's sampler still sees it as one of its own trials.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from autoresearch.core_adapter import DEFAULT_COMMAND, cluster_device, watchdog_seconds
from autoresearch.execute import Executor, Job, LocalExecutor, Resources, SlurmExecutor, TrialSpec, wait
from autoresearch.execute.slots import Slot
from autoresearch.records import (
    ABANDONED,
    BASELINE_PROPOSER,
    RAN,
    Attr,
    Status,
    TrialResult,
    changes,
    config_key,
    foreknowledge,
)
from autoresearch.run import scheduler
from autoresearch.run.options import PLANNED, AgentOptions
from autoresearch.run.scheduler import SKIPPED, Exhausted
from autoresearch.search import Chooser, Gate, SearchExhausted, build_proposer, make_sampler, sampler_for
from autoresearch.search.prior import StepPrior
from autoresearch.space import SpaceError, load_space
from autoresearch.study import confirm, ledger
from autoresearch.study import storage as st
from autoresearch.study.reaper import abandon, mark_running, reap_stale
from core.perf import micro
from core.perf.device import calibration, measured_numbers, micro_calibration


@dataclass
class Launch:
    """A trial that passed every check and will run."""

    trial: optuna.Trial
    params: dict
    trial_dir: Path
    extra: tuple[str, ...] = ()  # overrides after the params' (a confirmation run's seed)
    job: Job | None = None  # adopted: the job a dead agent started, still running or ended since


@dataclass
class Phase:
    """What a progress bar counts: the search's finished trials, or the confirmation's runs."""

    name: str
    total: int
    done: Callable[[], int]


@dataclass(kw_only=True)
class TrialEvent:
    """A trial that ended, or a proposal recorded without running (``wall_time`` None)."""

    number: int
    status: Status
    params: dict
    reason: str
    objective: float | None = None
    wall_time: float | None = None
    slot: str = ""
    confirmation_of: int | None = None
    repeat: int | None = None
    predicted: float | None = None  # the step-time model's objective before the run (--plan)
    knew: str = ""  # what the agent knew before the run (records.foreknowledge)
    changes: dict | None = None  # the params that differ from the baseline's (None: the study has no baseline)
    gain: float | None = None  # the objective against the baseline's (records.gain: above 1 is better)
    memory_ratio: float | None = None  # peak memory over the baseline's


class Listener(Protocol):
    def note(self, text: str) -> None:
        """A line worth showing: the reference rate, a reaped trial, the end of the search."""

    def phase_started(self, phase: Phase) -> None: ...

    def trial_ended(self, phase: Phase, event: TrialEvent, best: FrozenTrial | None) -> None: ...

    def phase_ended(self, phase: Phase) -> None: ...


class Silent:
    """A listener that shows nothing."""

    def note(self, text: str) -> None:
        pass

    def phase_started(self, phase: Phase) -> None:
        pass

    def trial_ended(self, phase: Phase, event: TrialEvent, best: FrozenTrial | None) -> None:
        pass

    def phase_ended(self, phase: Phase) -> None:
        pass


@dataclass
class Outcome:
    """How a session ended: why, its exit code, and the study it leaves (read by ``autoresearch.report``)."""

    why: str
    code: int
    study: optuna.Study
    rows: list = field(default_factory=list)


class Session:
    def __init__(
        self,
        opts: AgentOptions,
        proposer_name: str,
        *,
        listener: Listener | None = None,
        stop_when: Callable[[optuna.Study], str] | None = None,
    ):
        """``stop_when(study)``: a further reason to end the search ("" to go on), asked before the session's own
        (the benchmarks' replays stop when the best config has run)."""
        self.opts, self.listener, self.stop_when = opts, listener or Silent(), stop_when
        self.space = load_space(opts.space)
        self.study_name = opts.study or self.space.name
        self.study_dir = Path(opts.trials_dir) / self.study_name
        self.command = list(opts.command or DEFAULT_COMMAND)
        budget = self.space.budget
        self.trials = opts.trials if opts.trials is not None else (budget.trials or 20)
        self.timeout = opts.timeout if opts.timeout is not None else (budget.hours * 3600 if budget.hours else None)
        self.max_cost = opts.max_cost if opts.max_cost is not None else budget.dollars
        self.sampler_name = sampler_for(proposer_name)
        self.gate = Gate(self.space, opts.estimator, learn=opts.learn)
        self.proposer_name = proposer_name
        self.prior, self.plan_note = self._prior(proposer_name)
        proposer = build_proposer(
            proposer_name, opts.model, opts.claude_fraction, opts.seed, prior=self.prior, min_gain=opts.min_gain
        )
        self.chooser = Chooser(self.space, self.gate, proposer=proposer, sampler_name=self.sampler_name, seed=opts.seed)
        self.errors_in_a_row = 0
        self.storage: optuna.storages.BaseStorage | None = None
        self.executor = make_executor(opts, self.space)
        self.resources = Resources(
            nodes=self.space.resources.nodes,
            devices_per_node=self.space.devices_per_node,
            cores_per_node=self.space.resources.cores_per_node,
        )
        self.adopted: list[Launch] = []  # jobs of a dead agent this session waits for before anything new
        self.baseline = self.space.baseline_point  # run first; every result is stated against it

    # --- set-up ---

    def _prior(self, proposer_name: str) -> tuple[StepPrior | None, str]:
        """The step-time model as the search's prior, and what to tell the user about it. ``--plan``: always (a
        SpaceError for a space it cannot serve). By default, for a throughput objective of core.train's trials and
        a proposer that reads the plan; on a CPU this machine has not measured, its micro-benchmarks run first
        (``prepare_plan``: under a minute, once per machine) and the baseline and the first runs calibrate the model
        as the study goes (the prior's refitted factors). The note says when it plans, and when it does not, why."""
        plan = self.opts.plan
        if plan:
            return StepPrior(self.space), ""
        if plan is False or proposer_name not in PLANNED:
            return None, ""
        try:
            prior = StepPrior(self.space)
        except SpaceError:  # an objective or a command the model does not predict: nothing to plan
            return None, ""
        if self._unmeasured_cpu(prior):
            return prior, (
                "step-time model: this machine is not measured yet; its micro-benchmarks run first (under a minute, "
                "once per machine), then the baseline and the first runs calibrate the model as the study goes"
            )
        try:
            prior.validate()
        except SpaceError as exc:
            return None, f"step-time model: the search does not plan ({exc})"
        return prior, "step-time model: the search plans before it pays (the default here; --no-plan: without)"

    def _cpu(self, prior: StepPrior) -> bool:
        return cluster_device({**self.space.fixed, **prior.grid[0]}) == "CPU"

    def _unmeasured_cpu(self, prior: StepPrior) -> bool:
        return self._cpu(prior) and not measured_numbers()

    def measure_reference_rate(self, device: str) -> None:
        """MFU's denominator (``core.runtime.reference_rate``), measured now while no trial runs: once per
        machine, after which it is read from the cache. Trials measure it themselves if this fails."""
        if tuple(self.command) != DEFAULT_COMMAND:
            return  # another trial command (a test's fake trial): not the core's MFU
        done = subprocess.run(
            [*DEFAULT_COMMAND[:2], "core.reference_rate", "--device", device], capture_output=True, text=True
        )
        last = ((done.stdout if done.returncode == 0 else done.stderr).strip().splitlines() or ["?"])[-1]
        self.listener.note(
            f"reference rate: {last}"
            if done.returncode == 0
            else f"reference rate not measured (exit {done.returncode}: {last}); each trial will try"
        )

    def prepare_plan(self, study: optuna.Study) -> None:
        """The step-time model must answer for this space. A CPU this machine has not measured is measured now by
        its micro-benchmarks (``core.perf.micro``: under a minute, then cached; their device time is this study's,
        in its ledger) before any trial competes for its cores. Raises SpaceError (``--plan``), quoting the core,
        when the model still predicts none of the space's points; by default the search then goes on without it."""
        if self._unmeasured_cpu(self.prior):
            self.listener.note("step-time model: measuring this machine (python -m core.perf calibrate --micro)")
            entry, fresh = micro.cached()
            if fresh:
                cost = entry["device_seconds"]
                study.set_user_attr(Attr.CALIBRATION_SEC, study.user_attrs.get(Attr.CALIBRATION_SEC, 0.0) + cost)
            self.listener.note(f"step-time model: measured in {entry['seconds']:.0f} s: {micro.summary(entry)}")
        if self._cpu(self.prior) and calibration() is None and (entry := micro_calibration()) is not None:
            self.prior.calibrate_in_study(entry["numbers"])  # the runs fit what the micro-benchmarks cannot see
        try:
            self.prior.validate()
        except SpaceError as exc:
            if self.opts.plan:
                raise
            self.listener.note(f"step-time model: the search does not plan ({exc})")
            self._without_plan()
            return
        if self.prior.unpriced:
            self.listener.note(
                f"step-time model: does not price {', '.join(sorted(self.prior.unpriced))}; the runs teach the search "
                "their effect, and a run off their defaults has no prediction"
            )

    def _without_plan(self) -> None:
        self.prior = None
        proposer = build_proposer(
            self.proposer_name, self.opts.model, self.opts.claude_fraction, self.opts.seed, prior=None
        )
        self.chooser = Chooser(
            self.space, self.gate, proposer=proposer, sampler_name=self.sampler_name, seed=self.opts.seed
        )

    def open(self) -> optuna.Study:
        url = self.opts.storage or st.default_storage(self.opts.trials_dir, self.study_name)
        self.storage = st.open_storage(url)  # StorageUnavailable: the agent says so and exits 2
        if self.opts.resume and self.study_name not in optuna.get_all_study_names(storage=self.storage):
            raise SystemExit(f"--resume: no study {self.study_name!r} in {self.storage.url}")
        n_startup = max(3, min(10, self.trials // 4))  # short studies should not spend half their budget at random
        sampler = make_sampler(
            self.sampler_name, self.opts.seed, n_startup_trials=n_startup, concurrent=self.opts.workers > 1
        )
        study = st.open_study(self.space, self.study_name, self.storage, sampler)
        for note in reap_stale(study, self.storage, adopt=lambda t: self._adopt(study, t)):
            self.listener.note(note)
        for t in study.get_trials(deepcopy=False):  # what earlier sessions learned
            if t.state.is_finished() and st.status_of(t) in RAN:
                self.gate.learn(t.number, t.params, st.status_of(t), t.user_attrs.get(Attr.METRICS) or {})
        return study

    def _adopt(self, study: optuna.Study, t: FrozenTrial) -> str | None:
        """Take over the job of a trial whose agent died, when the executor still knows it."""
        job = self.executor.adopt(t.user_attrs.get(Attr.TRIAL_PID) or {})
        if job is None:
            return None
        study_id = self.storage.get_study_id_from_name(study.study_name)
        trial = optuna.trial.Trial(study, self.storage.get_trial_id_from_study_id_trial_number(study_id, t.number))
        self.adopted.append(Launch(trial, dict(t.params), Path(t.user_attrs[Attr.TRIAL_DIR]), job=job))
        return f"trial {t.number}: its agent died; adopted its job {job.record}"

    def spec(self, item: Launch) -> TrialSpec:
        overrides = [*self.space.overrides(item.params), *item.extra]
        return TrialSpec(
            argv=(*self.command, *overrides, f"trial.dir={item.trial_dir}"),
            trial_dir=item.trial_dir,
            name=f"msar.{self.study_name}.{item.trial.number}",
            resources=self.resources,
            limit=watchdog_seconds(overrides),
        )

    # --- the session ---

    def run(self) -> Outcome:
        """The search, then the confirmation of its front-runners (``autoresearch.study.confirm``)."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = self.open()
        device = str(self.space.fixed.get("device", "CPU"))
        self.measure_reference_rate(device)
        for name, (default, used) in self.space.baseline_substituted.items():
            self.listener.note(
                f"baseline: {name}={used} (the core's default, {default}, is not among the space's values: the nearest"
                " is; `baseline:` in the space file chooses another)"
            )
        if self.plan_note:
            self.listener.note(self.plan_note)
        if self.prior is not None:
            self.prepare_plan(study)
        slots = self.executor.slots(self.opts.workers, device, self.space.world_size)
        start = time.monotonic()
        search = _Search(self, study, start)
        why, code = self._phase(search, slots, Phase(self.study_name, self.trials, lambda: st.finished_count(study)))
        k, repeats = self.opts.confirm, self.opts.repeats
        if code == 0 and k > 0 and repeats > 0 and st.best_trial(study) is not None:
            leaders = confirm.candidates(study, k)
            total = len(leaders) * repeats
            reference = (
                " and the baseline"
                if any(config_key(t.params) == config_key(self.baseline or {}) for t in leaders)
                else ""
            )
            self.listener.note(
                f"\nsearch stopped: {why}\nconfirming the {min(k, len(leaders))} best configs{reference}: up to "
                f"{repeats} runs each, fewer once the runs rule one out (--confirm {k} --repeats {repeats})"
            )
            why, code = self._phase(
                _Confirmation(self, study, start),
                slots,
                Phase("confirm", total, lambda: confirm.done_runs(study, k, repeats)),
            )
        return Outcome(why, code, study, st.trial_rows(study))

    def _phase(self, work: _Work, slots: list[Slot], phase: Phase) -> tuple[str, int]:
        work.phase = phase
        self.listener.phase_started(phase)
        try:
            return scheduler.drive(work, slots)
        finally:
            self.listener.phase_ended(phase)

    def budget_reason(self, study: optuna.Study, start: float) -> str:
        """The budgets that bound every trial of the session, search and confirmation alike ("" to go on)."""
        if self.timeout is not None and time.monotonic() - start >= self.timeout:
            return f"--timeout {self.timeout:g}s reached"
        if self.max_cost is not None and self.chooser.uses_llm:
            spent = st.llm_cost(study)
            if spent >= self.max_cost:
                return f"LLM spend ${spent:.4f} reached --max-cost ${self.max_cost:g}"
        if self.opts.max_device_hours is not None:
            used = ledger.of_study(study, st.trial_rows(study))["device_sec"]
            if used >= self.opts.max_device_hours * 3600:
                return f"device time {used / 3600:.4g} h reached --max-device-hours {self.opts.max_device_hours:g}"
        return ""

    def launch(self, trial: optuna.Trial, extra: tuple[str, ...] = ()) -> Launch:
        trial_dir = self.study_dir / f"{trial.number:04d}"
        trial.set_user_attr(Attr.TRIAL_DIR, str(trial_dir))
        return Launch(trial, dict(trial.params), trial_dir, extra)


class _Work:
    """What both phases share: how a trial runs, is told and reported, and how Ctrl-C abandons it."""

    phase: Phase

    def __init__(self, session: Session, study: optuna.Study, start: float):
        self.session, self.study, self.start = session, study, start

    def run(self, item: Launch, slot: Slot, stop: threading.Event) -> TrialResult:
        """Run one trial in its slot (a worker thread), or wait for the adopted job it already is; raises
        ``Interrupted`` once ``stop`` is set."""
        s, trial = self.session, item.trial
        spec = s.spec(item)
        job = item.job
        if job is None:
            spec.trial_dir.mkdir(parents=True, exist_ok=True)
            # The name first: an agent killed between the submission and the next line still finds the job.
            trial.set_user_attr(Attr.TRIAL_PID, {"executor": s.executor.name, "name": spec.name})
            job = s.executor.start(spec, slot)
            trial.set_user_attr(Attr.TRIAL_PID, job.record)
        return wait(
            job,
            spec,
            objective_metric=s.space.objective_metric,
            on_poll=lambda: trial.set_user_attr(Attr.HEARTBEAT, time.time()),
            stop=stop,
        )

    def done(self, item: Launch, result: TrialResult, slot: Slot) -> None:
        """Tell the study how a trial ended, learn from it, and report it; a trial its executor lost (a node
        failed, it was preempted or cancelled by a person) says nothing of its config and is abandoned."""
        s, trial = self.session, item.trial
        if result.status in ABANDONED:
            frozen = self.study.get_trials(deepcopy=False)[trial.number]
            then = abandon(self.study, s.storage, frozen, result.status, result.reason)
            self.report(
                TrialEvent(
                    number=trial.number,
                    status=result.status,
                    params=item.params,
                    reason=result.reason + then,
                    wall_time=result.wall_time,
                    slot=slot.label,
                )
            )
            return
        state = st.tell_result(self.study, trial, result)
        s.gate.learn(trial.number, item.params, result.status, result.metrics)
        s.errors_in_a_row = s.errors_in_a_row + 1 if state == TrialState.FAIL else 0
        attrs = trial.user_attrs
        row = next((r for r in st.trial_rows(self.study) if r.number == trial.number), None)
        self.report(
            TrialEvent(
                number=trial.number,
                status=result.status,
                params=item.params,
                reason=result.reason,
                objective=result.objective,
                wall_time=result.wall_time,
                slot=slot.label,
                confirmation_of=attrs.get(Attr.CONFIRMATION_OF),
                repeat=attrs.get(Attr.REPEAT),
                predicted=attrs.get(Attr.PREDICTED_OBJECTIVE),
                knew=foreknowledge(attrs),
                gain=row.gain if row else None,
                memory_ratio=row.memory_ratio if row else None,
            )
        )

    def report(self, event: TrialEvent) -> None:
        if self.session.baseline is not None and event.changes is None:
            base = self.session.baseline
            event.changes = changes(event.params, base)
        self.session.listener.trial_ended(self.phase, event, st.best_trial(self.study))

    def failure(self) -> str:
        errors = self.session.errors_in_a_row
        return f"{errors} errors in a row: check the trial logs" if errors >= self.session.opts.max_errors else ""

    def abandon(self, running: list[Launch]) -> None:
        """After Ctrl-C: the config was not at fault, so it runs again later."""
        for item in running:
            abandon(
                self.study,
                self.session.storage,
                self.study.get_trials(deepcopy=False)[item.trial.number],
                Status.INTERRUPTED,
                "the agent was interrupted (Ctrl-C or SIGTERM) while this trial ran",
            )


def make_executor(opts: AgentOptions, space) -> Executor:
    """The executor ``--executor`` names, with the site settings of the flags and the space."""
    if opts.executor == LocalExecutor.name:
        LocalExecutor.check(space.resources.nodes)  # before any trial, not at the first one's start
    if opts.executor == SlurmExecutor.name:
        site = space.slurm
        return SlurmExecutor(
            partition=opts.slurm_partition or site.partition,
            account=opts.slurm_account or site.account,
            gres=site.gres,
            options=(*site.options, *(opts.sbatch or ())),
        )
    return LocalExecutor()


class _Search(_Work):
    def __init__(self, session: Session, study: optuna.Study, start: float):
        super().__init__(session, study, start)
        self._baseline_asked = False

    def stop_reason(self, running: int = 0) -> str:
        """Why no further search trial should start ("" to go on); ``running`` trials will count once they end."""
        s, study = self.session, self.study
        if s.adopted:  # a dead agent's jobs are waited for whatever the budgets say: they are paid for already
            return ""
        if s.stop_when is not None and (why := s.stop_when(study)):
            return why
        done = st.finished_count(study)
        if done + running >= s.trials:
            return f"the study holds {done} finished trials (--trials {s.trials})" + (
                f", {running} still running" if running else ""
            )
        why = s.budget_reason(study, self.start)
        if not why and s.opts.patience:
            best = st.best_trial(study)
            since = [
                t
                for t in study.get_trials(deepcopy=False)
                if t.state.is_finished()
                and st.status_of(t) in RAN
                and not st.is_confirmation(t)
                and (best is None or t.number > best.number)
            ]
            if len(since) >= s.opts.patience:
                return f"{len(since)} trials ran without improving the best (--patience {s.opts.patience})"
        return why

    def next(self):
        """Choose and check one trial: a Launch to run, or SKIPPED after recording a proposal that won't; the jobs
        adopted from a dead agent come first."""
        s, study = self.session, self.study
        if s.adopted:
            return s.adopted.pop(0)
        self._enqueue_baseline()
        try:
            trial = s.chooser.ask(study)
        except SearchExhausted as exc:
            raise Exhausted(str(exc)) from exc
        params = dict(trial.params)
        if s.prior is not None and s.prior.priced(params):  # the plan's figure before the run, refitted so far
            s.prior.refit(st.trial_rows(study))
            trial.set_user_attr(Attr.PREDICTED_OBJECTIVE, s.prior.predict(params))
        if not s.space.check(params):  # every candidate shows its memory figures, skipped or run
            est, predicted = s.gate.predict_memory(params)
            if est is not None:
                trial.set_user_attr(Attr.ESTIMATED_MEMORY, est)
                trial.set_user_attr(Attr.PREDICTED_MEMORY, predicted)
        skipped = s.gate.skip(study, params)
        s.chooser.note(skipped)
        if skipped is None:
            return s.launch(trial)
        st.tell_skipped(study, trial, skipped)
        self.report(TrialEvent(number=trial.number, status=skipped.status, params=params, reason=skipped.reason))
        return SKIPPED

    def _enqueue_baseline(self) -> None:
        """The baseline first (``autoresearch.space.baseline``): enqueued once, unless the study already holds a
        finished or running trial of its config (a resumed study, another agent on the same storage)."""
        s, study = self.session, self.study
        if s.baseline is None or self._baseline_asked:
            return
        self._baseline_asked = True
        key = config_key(s.baseline)
        if key in st.recorded_keys(study) or any(
            config_key(t.params) == key for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        ):
            return
        study.enqueue_trial(
            dict(s.baseline),
            user_attrs={
                Attr.PROPOSER: BASELINE_PROPOSER,
                Attr.RATIONALE: "the baseline, run first: every result after it is stated against it",
            },
        )


class _Confirmation(_Work):
    def stop_reason(self, running: int = 0) -> str:
        return self.session.budget_reason(self.study, self.start)

    def next(self) -> Launch:
        """The next confirmation run of a front-runner's config."""
        s, study = self.session, self.study
        nxt = confirm.next_run(study, s.opts.confirm, s.opts.repeats)
        if nxt is None:
            raise Exhausted("confirm: every run done")
        origin, repeat = nxt
        confirm.enqueue(study, origin, repeat)
        trial = study.ask(s.space.distributions())
        mark_running(trial)
        extra = confirm.seed_override(study, s.space.fixed, origin.params, repeat)
        return s.launch(trial, tuple(extra))
