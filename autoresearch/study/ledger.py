"""The cost ledger: what each trial, and the whole study, spent in device time and in LLM tokens and dollars.

A trial's device-seconds are its ranks × the runner's wall time around its process (``TrialResult.wall_time``,
user attribute ``wall_time_sec``): the devices were held that long, whatever the trial did with them. They split
into three parts, each also ranks × its seconds, so that the parts add up to ``device_sec``:

- start-up: the trial's start-up phases before its first step (``startup_phases_sec``: launch + imports + cluster
  + build; a phase that was never marked is inside the next one, ``core.trial.recorder.TrialRecorder``);
- compile: the first step minus one steady step (``metrics.step_time_ms_median``), since the first step carries
  graph compilation; clamped at 0 (in PyNative a first step can come out a little quicker than the median);
- steps: the rest of the runner's wall time: the steady steps, evaluation, writing the summary, the process's exit
  and the interpreter's start before the trial's own clock.

A part the trial cannot tell is None, never guessed: the fake trial writes no phases without ``fake.sleep``, a
crash leaves no summary, a trial that ended before its second step has no steady step to subtract. ``device_sec``
is still ranks × the wall time then, and the study's totals count such device time as "unsplit".
Ranks are the summary's ``layout.world_size``; without a summary, the ranks the space gives each trial (the
study's ``world_size`` attribute, ``default_ranks`` here). A proposal skipped without running costs 0
device-seconds, but the LLM tokens spent proposing it count.
"""

from __future__ import annotations

from pathlib import Path

from autoresearch.core_adapter import SUMMARY, load_summary
from autoresearch.records import SKIPPED, WASTED, Attr, TrialRow, number_or_none
from core.trial.contract import STARTUP_PHASES as _PHASES

STARTUP_PHASES = _PHASES[:-1]  # the phases before the first step: launch, imports, cluster, build

PARTS = ("startup_sec", "compile_sec", "steps_sec")
KEYS = ("ranks", "wall_sec", "device_sec", *PARTS, "llm_calls", "llm_tokens", "llm_usd")


def llm_part(usage: dict | None) -> dict:
    """Calls, tokens (input + output) and dollars of a trial's ``llm_usage``; 0 without one (no LLM was asked),
    None where the usage does not say (tokens not reported, a model without a known price)."""
    if not usage:
        return {"llm_calls": 0, "llm_tokens": 0, "llm_usd": 0.0}
    tokens = [usage.get(k) for k in ("input_tokens", "output_tokens") if usage.get(k) is not None]
    return {
        "llm_calls": usage.get("calls"),
        "llm_tokens": int(sum(tokens)) if tokens else None,
        "llm_usd": number_or_none(usage.get("cost_usd")),
    }


def time_split(summary: dict | None, wall_sec: float) -> dict:
    """Wall seconds of start-up, compile and steps (see the module docstring); None for what is not known."""
    phases = (summary or {}).get("startup_phases_sec") or {}
    known = [number_or_none(phases.get(p)) for p in STARTUP_PHASES if p in phases]
    startup = sum(known) if known and None not in known else None
    first = number_or_none(phases.get("first_step"))
    median_ms = number_or_none(((summary or {}).get("metrics") or {}).get("step_time_ms_median"))
    compile_ = None
    if startup is not None and first is not None and median_ms is not None:
        compile_ = max(0.0, first - median_ms / 1000.0)
    steps = None if compile_ is None else max(0.0, wall_sec - startup - compile_)
    if steps is not None and startup + compile_ > wall_sec:  # the trial's clock ran past the runner's: no split
        startup = compile_ = steps = None
    return {"startup_sec": startup, "compile_sec": compile_, "steps_sec": steps}


def trial_ledger(
    summary: dict | None, wall_sec: float | None, llm_usage: dict | None = None, default_ranks: int | None = None
) -> dict:
    """The ledger of a trial that ran: ``summary`` is its trial_summary.json (None when it left none),
    ``wall_sec`` the runner's wall time (None when unknown: the summary's own wall time is used then)."""
    layout = (summary or {}).get("layout") or {}
    ranks = layout.get("world_size") if isinstance(layout.get("world_size"), int) else default_ranks
    wall = number_or_none(wall_sec)
    if wall is None:
        wall = number_or_none((summary or {}).get("wall_time_sec"))
    out = {
        "ranks": ranks,
        "wall_sec": None if wall is None else round(wall, 3),
        "device_sec": None,
        **dict.fromkeys(PARTS),
        **llm_part(llm_usage),
    }
    if ranks is None or wall is None:
        return out
    out["device_sec"] = round(ranks * wall, 3)
    for key, seconds in time_split(summary, wall).items():
        out[key] = None if seconds is None else round(ranks * seconds, 3)
    return out


def skipped_ledger(llm_usage: dict | None = None) -> dict:
    """A proposal that never ran: no device time, only the tokens spent proposing it."""
    return {"ranks": 0, "wall_sec": 0.0, "device_sec": 0.0, **dict.fromkeys(PARTS, 0.0), **llm_part(llm_usage)}


def of_trial(attrs: dict, finished: bool, default_ranks: int | None = None) -> dict | None:
    """A finished trial's ledger: the one recorded when it was told, else (a trial told before ledgers existed,
    or abandoned by its agent) computed from its user attributes and its trial directory. None while running."""
    if not finished:
        return None
    if isinstance(attrs.get(Attr.LEDGER), dict):
        return attrs[Attr.LEDGER]
    usage = attrs.get(Attr.LLM_USAGE)
    if attrs.get(Attr.STATUS) in SKIPPED:
        return skipped_ledger(usage)
    trial_dir = attrs.get(Attr.TRIAL_DIR)
    summary = load_summary(Path(trial_dir) / SUMMARY) if trial_dir else None
    return trial_ledger(summary, attrs.get(Attr.WALL_TIME), usage, default_ranks)


def study_totals(rows: list[TrialRow], calibration_sec: float = 0.0) -> dict:
    """The study's ledger from its rows (``autoresearch.study.storage.trial_rows``; a row's ledger is None while
    it runs) and the device-seconds it spent measuring the machine for its step-time model (``calibration_sec``:
    the study attribute ``Attr.CALIBRATION_SEC``, the micro-benchmarks' seconds x the processes they ran on).

    device_sec sums what is known, calibration included; ``unsplit_sec`` is the device time whose parts are not
    known; ``unknown_trials`` counts trials that ran without a known device time (an abandoned trial without a
    summary).
    """
    done = [(r.ledger, r.status) for r in rows if r.ledger is not None]
    ran = [led for led, s in done if s not in SKIPPED]
    out = {
        "trials": len(done),
        "ran": len(ran),
        "skipped": len(done) - len(ran),
        "unknown_trials": sum(led.get("device_sec") is None for led in ran),
    }
    out["calibration_sec"] = float(calibration_sec or 0.0)
    out["device_sec"] = out["calibration_sec"] + sum(
        led["device_sec"] for led in ran if led.get("device_sec") is not None
    )
    for part in PARTS:
        out[part] = sum(led[part] for led in ran if led.get(part) is not None)
    out["unsplit_sec"] = sum(
        led["device_sec"] - sum(led.get(p) or 0.0 for p in PARTS)
        for led in ran
        if led.get("device_sec") is not None and any(led.get(p) is None for p in PARTS)
    )
    wasted = [(led, s) for led, s in done if s in WASTED]
    out["wasted_runs"] = {str(w): sum(s == w for _, s in wasted) for w in WASTED}
    out["wasted_sec"] = sum(led["device_sec"] for led, _ in wasted if led.get("device_sec") is not None)
    for key in ("llm_calls", "llm_tokens", "llm_usd"):
        out[key] = sum(led[key] for led, _ in done if led.get(key) is not None)
    out["llm_unpriced_trials"] = sum(
        led.get("llm_calls") not in (0, None) and led.get("llm_usd") is None for led, _ in done
    )
    return out


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.3g} device-h" if seconds >= 360 else f"{seconds:.1f} device-s"


def waste_text(t: dict, share=_duration) -> str:
    """The runs the study paid for a failure: ``paid failures: 2 runs (1 oom, 1 nan, 0 timeout), 12.0 device-s``."""
    runs = t["wasted_runs"]
    kinds = ", ".join(f"{n} {kind}" for kind, n in runs.items())
    return f"paid failures: {sum(runs.values())} runs ({kinds}), {share(t['wasted_sec'])}"


def format_totals(t: dict) -> str:
    """The study's ledger in a few lines: device time and where it went, then the LLM spend."""
    dev = t["device_sec"]

    def share(seconds: float) -> str:
        return f"{_duration(seconds)} ({100 * seconds / dev:.0f}%)" if dev else _duration(seconds)

    lines = [
        f"ledger: {t['trials']} trials, {t['ran']} ran, {t['skipped']} skipped without running (0 device-s)",
        f"  device time {dev / 3600:.4g} h = {dev:.1f} device-s (ranks x wall time)"
        + (f"; {t['unknown_trials']} trial(s) ran for an unknown time" if t["unknown_trials"] else ""),
        f"  start-up {share(t['startup_sec'])}, compile {share(t['compile_sec'])}, "
        f"steps {share(t['steps_sec'])}, unsplit {share(t['unsplit_sec'])}"
        + (f", measuring the machine {share(t['calibration_sec'])}" if t.get("calibration_sec") else ""),
        f"  {waste_text(t, share)}",
        f"  LLM: {t['llm_calls']} calls, {t['llm_tokens']} tokens, ${t['llm_usd']:.4f}"
        + (f" (+ {t['llm_unpriced_trials']} trial(s) at an unknown price)" if t["llm_unpriced_trials"] else ""),
    ]
    return "\n".join(lines)


def of_study(study, rows: list[TrialRow]) -> dict:
    """``study_totals`` of an Optuna study: its rows and the device time it spent measuring the machine."""
    return study_totals(rows, study.user_attrs.get(Attr.CALIBRATION_SEC) or 0.0)
