"""The fewest blocks each pipeline stage recomputes for every rank to fit its device: what Megatron-LM's
``--recompute-num-layers`` and MindFormers' per-stage ``select_recompute: [10, 8, 6, 4, 2, 0, 0, 0]`` are chosen
for by hand. Early stages hold more micro-batches in flight, so they need more; a block not recomputed is a
forward not paid twice.

Pipeline rank r's peak depends only on the counts of its own (virtual) stages (``core.memory.estimate.terms``), so
each rank is fitted alone; its stages share one count k_r. Recomputing one more block never holds more, except
that full recompute of a single block keeps its input beside the rebuilt activations (more than keeping that block
whole): 0 is tried first, then the least k_r in 1..n by bisection, n a stage's blocks. A rank with no recompute
mode on any of its stages keeps 0.
"""

from __future__ import annotations

import dataclasses

from core.config import TrainConfig
from core.memory.estimate import apply_profile, terms
from core.memory.plan import recompute_plan
from core.parallel.pipeline.schedules import stage_layers
from core.perf.device import memory_bytes
from core.perf.step import fits_device, memory_profile


def least_recompute(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with ``memory.recompute_stage_layers`` the fewest first blocks of each stage that fit every rank in
    the device's memory. ``cfg`` itself when it counts its blocks already (``recompute_layers`` or
    ``recompute_stage_layers``), recomputes nothing, runs on a device of no stated size, or does not fit even
    recomputing every block (the prediction then says it is over memory)."""
    mem, par, n = cfg.memory, cfg.parallel, cfg.model.n_layers
    capacity, plan = memory_bytes(cfg.cluster), recompute_plan(cfg)
    if capacity is None or mem.recompute_layers is not None or mem.recompute_stage_layers is not None:
        return cfg
    if all(mode == "none" for mode in plan.modes):
        return cfg
    sizes = [len(blocks) for blocks in stage_layers(n, par.stages, par.stage_split(n))]
    counts = [size if mode != "none" else 0 for size, mode in zip(sizes, plan.modes, strict=True)]
    profile = memory_profile(cfg)

    def with_rank(rank: int, k: int) -> list[int]:
        return [min(k, sizes[s]) if s % par.pp == rank and counts[s] else c for s, c in enumerate(counts)]

    def fits(rank: int, k: int) -> bool:
        trial = _with_counts(cfg, with_rank(rank, k))
        return apply_profile(terms(trial, rank), profile).total <= capacity

    # the whole config first (every rank at once): most points of a plan fit recomputing nothing, or not at all
    if not fits_device(cfg):
        return cfg
    if fits_device(none := _with_counts(cfg, [0] * len(counts))):
        return none
    for rank in range(par.pp):
        most = max((counts[s] for s in range(rank, par.stages, par.pp)), default=0)
        if not most or fits(rank, 0):
            counts = with_rank(rank, 0)
            continue
        low, high = 1, most  # fits at high: the whole config does
        while low < high:
            mid = (low + high) // 2
            low, high = (low, mid) if fits(rank, mid) else (mid + 1, high)
        counts = with_rank(rank, high)
    return _with_counts(cfg, counts)


def _with_counts(cfg: TrainConfig, counts: list[int]) -> TrainConfig:
    return dataclasses.replace(cfg, memory=dataclasses.replace(cfg.memory, recompute_stage_layers=counts))
