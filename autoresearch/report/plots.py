"""The report's PNG plots of a study (``python -m autoresearch.report STUDY_DIR --plot``, or ``--html``).

- objective_by_trial.png: each trial's objective, failures marked, the best so far;
- objective_vs_<param>.png: the objective against each param, failures and skips where they sit along it;
- best_vs_device_time.png: the best objective so far against the device-seconds spent, one line per proposer
  (each over its own trials' device time) and one for the whole study: which proposer gets there cheaper;
- memory_predicted_vs_measured.png: the core's estimate and the agent's calibrated prediction of each trial's
  per-rank peak against the measured peak;
- objective_predicted_vs_measured.png: the step-time model's objective of each run, made before it ran (the plan),
  against the measured one;
- objective_vs_memory.png: every run's objective against its peak memory per rank, the Pareto front (no other run
  better on both) drawn through them and the baseline marked;
- parallel_coordinates.png: every trial as a line across the params and the objective, coloured by objective
  (trials that ran ok) or by status (failures and skipped proposals, dashed).

The plots take the report's table (``report.table.study_table``) and the study's rows (``study.storage.trial_rows``,
which carry each trial's ledger) rather than reading the study themselves, so that one table feeds every output.
"""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pandas as pd

from autoresearch.records import Attr, Status, TrialRow
from autoresearch.report.table import param_names, study_table
from autoresearch.study.storage import trial_rows

MiB = 1024**2


def _pyplot():
    import matplotlib  # function-level: matplotlib loads only when a plot is drawn

    matplotlib.use("Agg")  # files only; no display here or in CI
    import matplotlib.pyplot as plt  # function-level: as above

    return plt


def write_plots(study: optuna.Study, out_dir: str | Path, rows: list[TrialRow] | None = None) -> list[Path]:
    """Every plot above into ``out_dir``; returns the paths written. ``rows``: ``trial_rows(study)``, when read."""
    rows = trial_rows(study) if rows is None else rows
    df, params = study_table(study, rows), param_names(study, rows)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        *objective_plots(study, df, params, out_dir),
        best_vs_device_time(study, rows, out_dir),
        objective_vs_prediction(study, rows, out_dir),
        memory_vs_peak(rows, out_dir),
        objective_vs_memory(study, rows, out_dir),
        parallel_coordinates(study, df, params, out_dir),
    ]


def _goal(study: optuna.Study) -> tuple[str, bool]:
    return (
        study.user_attrs.get(Attr.OBJECTIVE_METRIC, "objective"),
        study.direction == optuna.study.StudyDirection.MAXIMIZE,
    )


def _distributions(study: optuna.Study) -> dict:
    dists = {}
    for t in study.get_trials(deepcopy=False):
        dists.update(t.distributions)
    return dists


def _is_categorical(dist, column: pd.Series) -> bool:
    return isinstance(dist, optuna.distributions.CategoricalDistribution) or column.dtype == object


def _choices(dist, column: pd.Series) -> list[str]:
    return [str(c) for c in getattr(dist, "choices", sorted(column.dropna().unique(), key=str))]


def objective_plots(study: optuna.Study, df: pd.DataFrame, params: list[str], out_dir: Path) -> list[Path]:
    """objective_by_trial.png and objective_vs_<param>.png."""
    plt = _pyplot()
    df = df.sort_values("number")
    metric, maximize = _goal(study)
    ok = df[df["objective"].notna()]
    failed = df[df["objective"].isna()]
    written = []

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.scatter(ok["number"], ok["objective"], s=18, label="trial")
    if len(ok):
        best = ok["objective"].cummax() if maximize else ok["objective"].cummin()
        ax.step(ok["number"], best, where="post", color="C1", label="best so far")
        floor = ok["objective"].min() if maximize else ok["objective"].max()
        for _, row in failed.iterrows():  # failures sit on the worst value, labelled by what went wrong
            ax.annotate(str(row.status), (row.number, floor), color="C3", fontsize=7, rotation=90)
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title(
        f"{study.study_name}: {metric} per trial ({'max' if maximize else 'min'}imize; {len(failed)} without objective)"
    )
    ax.legend(loc="best")
    written.append(_save(fig, out_dir / "objective_by_trial.png"))

    dists = _distributions(study)
    floor = (ok["objective"].min() if maximize else ok["objective"].max()) if len(ok) else 0.0
    for name in params:
        fig, ax = plt.subplots(figsize=(6, 4))
        dist = dists.get(name)
        if _is_categorical(dist, df[name]):
            labels = _choices(dist, df[name])
            position = lambda v, labels=labels: labels.index(str(v)) if str(v) in labels else -1  # noqa: E731
            ax.set_xticks(range(len(labels)), labels)
            ax.set_xlim(-0.5, len(labels) - 0.5)
        else:
            position = float
            if getattr(dist, "log", False):
                ax.set_xscale("log")
        ax.scatter(ok[name].map(position), ok["objective"], s=18, label="trial")
        if len(failed):  # where failures and skips sit along this param: the region to stay out of
            ax.scatter(
                failed[name].dropna().map(position),
                [floor] * failed[name].notna().sum(),
                marker="x",
                color="C3",
                label="no objective (failed or skipped)",
            )
        ax.set_xlabel(name)
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} against {name}")
        ax.legend(loc="best", fontsize=8)
        written.append(_save(fig, out_dir / f"objective_vs_{name.replace('/', '_')}.png"))
    return written


def best_so_far_curves(
    rows: list[TrialRow], maximize: bool, start: float = 0.0
) -> dict[str, tuple[list[float], list[float]]]:
    """Per proposer (and ``all``): cumulative device-seconds after each of its finished search trials, and the best
    objective so far then (NaN before its first). A trial of unknown device time adds nothing; a confirmation run is
    not a search's best (a lucky repeat), nor its cost; ``all`` starts at ``start`` (the device-seconds the study
    spent measuring the machine before its first trial)."""
    curves: dict[str, tuple[list[float], list[float]]] = {}
    best: dict[str, float] = {}
    pick = max if maximize else min
    for r in rows:
        if r.ledger is None or r.confirmation_of is not None:  # still running, or a confirmation run
            continue
        spent = r.ledger.get("device_sec") or 0.0
        for name in ("all", str(r.proposer or "unknown")):
            xs, ys = curves.setdefault(name, ([], []))
            if r.objective is not None:
                best[name] = r.objective if name not in best else pick(best[name], r.objective)
            xs.append((xs[-1] if xs else (start if name == "all" else 0.0)) + spent)
            ys.append(best.get(name, math.nan))
    return curves


def best_vs_device_time(study: optuna.Study, rows: list[TrialRow], out_dir: Path) -> Path:
    plt = _pyplot()
    metric, maximize = _goal(study)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    start = float(study.user_attrs.get(Attr.CALIBRATION_SEC) or 0.0)
    curves = best_so_far_curves(rows, maximize, start)
    for name, (xs, ys) in curves.items():
        style = {"color": "black", "linewidth": 2.5, "alpha": 0.4} if name == "all" else {}
        ax.step([0.0, *xs], [math.nan, *ys], where="post", label=name, **style)
    if start:
        ax.axvspan(0.0, start, color="grey", alpha=0.15, label="measuring the machine")
    if not curves:
        ax.text(0.5, 0.5, "no finished trial", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("device-seconds spent (ranks x wall time; each proposer over its own search trials)")
    ax.set_ylabel(f"best {metric} so far")
    ax.set_title(f"{study.study_name}: best {metric} against device time, per proposer")
    if curves:
        ax.legend(loc="best", fontsize=8)
    return _save(fig, out_dir / "best_vs_device_time.png")


def memory_vs_peak(rows: list[TrialRow], out_dir: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 5))
    measured = [r for r in rows if r.peak_memory_bytes]
    counts = []
    for key, marker, label in (
        ("estimated_memory_bytes", "o", "core estimate"),
        ("predicted_memory_bytes", "^", "agent's calibrated prediction"),
    ):
        pairs = [(r.peak_memory_bytes / MiB, getattr(r, key) / MiB) for r in measured if getattr(r, key)]
        counts.append(f"{len(pairs)} {label.split()[-1]}")
        if pairs:
            ax.scatter(*zip(*pairs, strict=True), marker=marker, s=24, alpha=0.7, label=label)
    values = [
        v / MiB
        for r in measured
        for v in (r.peak_memory_bytes, r.estimated_memory_bytes, r.predicted_memory_bytes)
        if v
    ]
    if values:
        lo, hi = min(values), max(values)
        ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1, label="estimate = measured")
        ax.legend(loc="best", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no trial with a measured peak", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("measured peak per rank (MiB)")
    ax.set_ylabel("estimated / predicted (MiB)")
    ax.set_title(f"memory: {len(measured)} measured peaks; {', '.join(counts)}", fontsize=10)
    return _save(fig, out_dir / "memory_predicted_vs_measured.png")


def objective_vs_prediction(study: optuna.Study, rows: list[TrialRow], out_dir: Path) -> Path:
    plt = _pyplot()
    metric, _ = _goal(study)
    fig, ax = plt.subplots(figsize=(6, 5))
    pairs = [(r.objective, r.predicted_objective) for r in rows if r.objective and r.predicted_objective]
    if pairs:
        ax.scatter(*zip(*pairs, strict=True), s=24, alpha=0.7, label="run (predicted before it ran)")
        lo, hi = min(map(min, pairs)), max(map(max, pairs))
        ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1, label="predicted = measured")
        ax.legend(loc="best", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no run was predicted (no plan)", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(f"measured {metric}")
    ax.set_ylabel(f"predicted {metric} (step-time model, refitted to the runs before)")
    ax.set_title(f"time: {len(pairs)} runs predicted before they ran", fontsize=10)
    return _save(fig, out_dir / "objective_predicted_vs_measured.png")


def pareto_front(points: list[tuple[float, float]], maximize: bool) -> list[int]:
    """Indices of the (memory, objective) points no other point beats on both (less or equal memory and a better or
    equal objective, one of them strictly), by increasing memory."""
    sign = 1.0 if maximize else -1.0
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -sign * points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if sign * points[i][1] > best:
            front.append(i)
            best = sign * points[i][1]
    return front


def objective_vs_memory(study: optuna.Study, rows: list[TrialRow], out_dir: Path) -> Path:
    plt = _pyplot()
    metric, maximize = _goal(study)
    fig, ax = plt.subplots(figsize=(7, 5))
    ran = [r for r in rows if r.objective is not None and r.peak_memory_bytes and r.confirmation_of is None]
    points = [(r.peak_memory_bytes / MiB, r.objective) for r in ran]
    if points:
        ax.scatter(*zip(*points, strict=True), s=24, alpha=0.6, label="run")
        front = pareto_front(points, maximize)
        ax.step(
            [points[i][0] for i in front], [points[i][1] for i in front], where="post", color="C1", label="Pareto front"
        )
        for i in front:
            ax.annotate(f"#{ran[i].number}", points[i], xytext=(3, 3), textcoords="offset points", fontsize=7)
        base = [p for p, r in zip(points, ran, strict=True) if r.baseline]
        if base:
            ax.scatter(*zip(*base, strict=True), s=90, facecolors="none", edgecolors="black", label="baseline")
        ax.legend(loc="best", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no run with a measured peak", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("peak memory per rank (MiB)")
    ax.set_ylabel(metric)
    ax.set_title(f"{study.study_name}: {metric} against memory ({len(points)} runs)", fontsize=10)
    return _save(fig, out_dir / "objective_vs_memory.png")


def _axis_positions(study: optuna.Study, df: pd.DataFrame, params: list[str]) -> tuple[list[pd.Series], list]:
    """Each param as positions in [0, 1] (choices evenly spaced; numbers min-max, on a log scale for log
    distributions) and the tick labels of its axis."""
    dists = _distributions(study)
    positions, ticks = [], []
    for name in params:
        dist, col = dists.get(name), df[name]
        if _is_categorical(dist, col):
            labels = _choices(dist, col)
            step = 1.0 / max(1, len(labels) - 1)
            positions.append(
                col.map(
                    lambda v, labels=labels, step=step: labels.index(str(v)) * step if str(v) in labels else math.nan
                )
            )
            ticks.append([(i * step, label) for i, label in enumerate(labels)])
            continue
        values = pd.to_numeric(col, errors="coerce").astype(float)
        scaled = values.map(math.log10) if getattr(dist, "log", False) else values
        lo, hi = scaled.min(), scaled.max()
        span = (hi - lo) or 1.0
        positions.append((scaled - lo) / span)
        ticks.append([(0.0, f"{values.min():.3g}"), (1.0, f"{values.max():.3g}")] if values.notna().any() else [])
    return positions, ticks


def parallel_coordinates(study: optuna.Study, df: pd.DataFrame, params: list[str], out_dir: Path) -> Path:
    plt = _pyplot()
    from matplotlib import colormaps  # function-level: matplotlib loads only when a plot is drawn
    from matplotlib.colors import Normalize  # function-level: as above

    metric, maximize = _goal(study)
    positions, ticks = _axis_positions(study, df, params)
    objective = pd.to_numeric(df["objective"], errors="coerce").astype(float)
    norm = Normalize(objective.min(), objective.max()) if objective.notna().any() else Normalize(0.0, 1.0)
    cmap = colormaps["viridis"]
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * (len(params) + 1)), 4.8))
    xs = list(range(len(params) + 1))
    statuses = sorted({s for s in df["status"] if s != Status.OK})
    status_color = {s: f"C{3 + i % 7}" for i, s in enumerate(statuses)}
    for i in range(len(df)):
        ys = [p.iloc[i] for p in positions]
        value = objective.iloc[i]
        if not math.isnan(value):  # ran ok: coloured by its objective
            ax.plot(xs, [*ys, norm(value)], color=cmap(norm(value)), alpha=0.8, linewidth=1.4)
        else:  # failed or skipped: no objective, drawn to below the objective axis in its status's colour
            ax.plot(xs, [*ys, -0.1], color=status_color[df["status"].iloc[i]], linestyle="--", alpha=0.6)
    for x, axis_ticks in zip(
        xs, [*ticks, [(0.0, f"{norm.vmin:.4g}"), (1.0, f"{norm.vmax:.4g}"), (-0.1, "none")]], strict=True
    ):
        ax.axvline(x, color="black", linewidth=0.8)
        for y, label in axis_ticks:
            ax.annotate(label, (x, y), xytext=(3, 0), textcoords="offset points", fontsize=7, va="center")
    ax.set_xticks(xs, [*params, metric], fontsize=8)
    ax.set_yticks([])
    ax.set_ylim(-0.15, 1.05)
    ax.set_xlim(-0.1, len(params) + 0.4)
    for s in statuses:
        ax.plot([], [], color=status_color[s], linestyle="--", label=s)
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label=f"{metric} (ok trials)")
    if statuses:
        ax.legend(
            loc="upper left",
            bbox_to_anchor=(0.0, -0.12),
            ncol=min(6, len(statuses)),
            fontsize=8,
            title="no objective",
            title_fontsize=8,
        )
    ax.set_title(f"{study.study_name}: the space, {len(df)} trials ({'max' if maximize else 'min'}imize {metric})")
    return _save(fig, out_dir / "parallel_coordinates.png")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path
