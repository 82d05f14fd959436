"""The plan: every point of a search space ranked by the core's step-time model (``core.perf``) before any trial
runs, and every point that loses said why: invalid for the core, over the device's memory, or dominated (another
point is at least as fast with no more memory per rank).

Points come from ``SearchSpace.grid`` (floats at ``points_per_float`` values) and are predicted on the cluster the
space's fixed settings name (``cluster=h100-sxm cluster.nodes=32 ...``): a space for real clusters ranks in
seconds to minutes, without MindSpore. A space that sizes no cluster (neither ``cluster.nodes`` nor
``cluster.devices_per_node``: the spaces for this machine) is planned as the agent runs it, each point on one host
of as many devices as it has ranks (``core_adapter.planned(one_host=True)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from autoresearch.core_adapter import planned
from autoresearch.space import SearchSpace
from autoresearch.space.core_check import key_problem, value_problem
from core.config import ConfigError, override, parse_overrides
from core.perf import estimate_step
from core.perf.least_recompute import least_recompute


class Verdict(str, Enum):
    """What the plan says of a point (the order of the table: ranked first)."""

    RANKED = "ranked"  # on the front: no other point is as fast with no more memory
    DOMINATED = "dominated"
    MEMORY = "memory"  # over the device's memory
    INVALID = "invalid"  # refused by the core's rules


@dataclass
class PlanRow:
    """One point of the space and what the model says of it."""

    params: dict
    tokens_per_sec_per_device: float | None = None
    tokens_per_sec: float | None = None
    mfu: float | None = None
    step_time_sec: float | None = None
    memory_gib: float | None = None
    bubble: float | None = None  # the pipeline's idle share of the step
    recompute_stage_layers: list[int] | None = None  # least_recompute: the blocks each stage recomputes
    verdict: Verdict = Verdict.RANKED
    reason: str = ""
    field: str = ""  # invalid: the config key the core's rule names


def plan(
    space: SearchSpace,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    points_per_float: int = 4,
    least_recompute: bool = False,
) -> list[PlanRow]:
    """Every grid point of ``space`` with ``overrides`` (``key=value`` text) on top, best first: the ranked ones
    by predicted tokens/s per device, then the dominated, then those over memory, then the invalid. An override
    of a searched key pins it (``cluster.nodes=32`` plans for 32 nodes only); raises ConfigError naming a key
    the core does not have or a value of the wrong type. ``least_recompute``: a point that recomputes does so on
    the fewest blocks of each stage that fit (``core.perf.least_recompute``), its counts in the row."""
    extra = parse_overrides(overrides)
    for key, value in extra.items():
        if problem := key_problem(key) or value_problem(key, value):
            raise ConfigError(key, problem)
    pinned = {k: v for k, v in extra.items() if k in space.params}
    points = space.grid(points_per_float)
    if pinned:
        unique = {tuple(p.items()): p for p in ({**p, **pinned} for p in points)}
        points = [p for p in unique.values() if space.satisfies(p)]
    rows = [_predict(space, point, extra, least_recompute) for point in points]
    _mark_recomputing_nothing(rows)
    _mark_dominated([r for r in rows if r.verdict is Verdict.RANKED])
    order = {v: i for i, v in enumerate(Verdict)}
    # ties broken by memory, then by the point's text: the order never depends on the order of the space file
    return sorted(
        rows,
        key=lambda r: (
            order[r.verdict],
            -(r.tokens_per_sec_per_device or 0.0),
            r.memory_gib or 0.0,
            _key(r),
        ),
    )


def _predict(space: SearchSpace, point: dict, extra: dict, fit_recompute: bool) -> PlanRow:
    row = PlanRow(params=point)
    settings = {**space.fixed, **point, **extra}
    try:
        cfg = planned(settings, one_host=True)
        if fit_recompute:
            cfg = least_recompute(cfg)
            row.recompute_stage_layers = cfg.memory.recompute_stage_layers
        est = estimate_step(cfg)
    except ConfigError as exc:
        row.verdict, row.reason, row.field = Verdict.INVALID, str(exc), exc.field
        return row
    idle = est.breakdown.get("comm_pp", 0.0)
    row.tokens_per_sec_per_device, row.tokens_per_sec = est.tokens_per_sec_per_device, est.tokens_per_sec
    row.mfu, row.step_time_sec = est.mfu, est.step_time_sec
    row.memory_gib, row.bubble = est.peak_memory_bytes_per_rank / 2**30, idle / est.step_time_sec
    if not est.fits:
        row.verdict = Verdict.MEMORY
        row.reason = f"{row.memory_gib:.1f} GiB per rank over the device's {est.memory_bytes_per_device / 2**30:.0f}"
    return row


def _mark_recomputing_nothing(rows: list[PlanRow]) -> None:
    """least_recompute: a point left recomputing no block of any stage is its twin with ``memory.recompute=none``
    (the same config), which stays ranked where the space has it."""
    plain = {_key(r): r for r in rows if r.params.get("memory.recompute") == "none" and r.verdict is Verdict.RANKED}
    for row in rows:
        counts = row.recompute_stage_layers
        if row.verdict is Verdict.RANKED and counts is not None and not any(counts):
            twin = PlanRow(params={**row.params, "memory.recompute": "none"})
            if _key(twin) in plain:
                row.verdict, row.reason = Verdict.DOMINATED, "recomputes no block: the point with memory.recompute=none"


def _mark_dominated(rows: list[PlanRow]) -> None:
    """A point is dominated when another is at least as fast with no more memory (of two predicted alike, the
    one whose text sorts first stays ranked)."""
    by_speed = sorted(rows, key=lambda r: (-r.tokens_per_sec_per_device, r.memory_gib, _key(r)))
    best_memory, leader = float("inf"), None
    for row in by_speed:
        if row.memory_gib >= best_memory and leader is not None:
            row.verdict = Verdict.DOMINATED
            row.reason = (
                f"as fast or slower than {_describe(leader.params)} ({leader.tokens_per_sec_per_device:,.0f} "
                f"tokens/s per device) with no less memory ({leader.memory_gib:.1f} GiB)"
            )
        else:
            best_memory, leader = row.memory_gib, row


def _key(row: PlanRow) -> str:
    return _describe(dict(sorted(row.params.items())))


def _describe(params: dict) -> str:
    return " ".join(override(k, v) for k, v in params.items())
