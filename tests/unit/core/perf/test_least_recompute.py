"""core.perf.least_recompute against a linear scan of the whole config's peak: each rank's count the least that
fits with the other ranks recomputing everything, the result fitting, and no block recomputed that need not be."""

import dataclasses

import pytest

from core.memory.estimate import estimate_memory
from core.perf import estimate_step, fits_device, planned_config
from core.perf.least_recompute import least_recompute
from core.perf.step import memory_profile

from .conftest import CLUSTER

# Llama 3 8B in four stages of 8 blocks, 16 micro-batches of one 4096-token sequence under 1F1B, each stage keeping
# the activations of its micro-batches in flight (as the stacks the accelerator profiles price do)
PIPELINE = [
    "cluster.stage_recompute=false",
    "cluster.devices_per_node=4",
    "parallel.pp=4",
    "training.seq_len=4096",
    "training.global_batch_size=16",
    "training.micro_batch_size=1",
]


def _cfg(*overrides):
    return planned_config([*CLUSTER, "model=llama3-8b", "training.precision=bf16", *PIPELINE, *overrides])


def _gib(cfg) -> float:
    return estimate_memory(cfg, memory_profile(cfg)).total / 2**30


def _between(*overrides) -> str:
    """A device memory halfway between the peaks recomputing every block and none: some ranks must recompute."""
    return f"cluster.memory_gib={(_gib(_cfg(*overrides)) + _gib(_cfg(*overrides, 'memory.recompute=none'))) / 2}"


def _scan(*overrides) -> list[int]:
    """Each stage's least count that fits the device, found one count at a time with the whole config's peak (every
    other stage recomputing all its blocks); a rank's (virtual) stages share its count."""
    cfg = _cfg(*overrides)
    stages, pp = cfg.parallel.stages, cfg.parallel.pp
    blocks = cfg.model.n_layers // stages
    counts = []
    for s in range(stages):
        rank = s % pp
        least = next(
            k
            for k in range(blocks + 1)
            if fits_device(_with_counts(cfg, [k if t % pp == rank else blocks for t in range(stages)]))
        )
        counts.append(least)
    return counts


def _with_counts(cfg, counts: list[int]):
    return dataclasses.replace(cfg, memory=dataclasses.replace(cfg.memory, recompute_stage_layers=counts))


@pytest.mark.parametrize(
    "schedule",
    [
        ["memory.recompute=full"],
        ["memory.recompute=selective"],
        [
            "memory.recompute=full",
            "parallel.pp=2",
            "parallel.pp_schedule=interleaved",
            "parallel.pp_virtual=2",
            "cluster.devices_per_node=2",
        ],
    ],
    ids=["1f1b full", "1f1b selective", "interleaved full"],
)
def test_each_stage_recomputes_the_fewest_blocks_that_fit(schedule):
    memory = _between(*schedule)
    fitted = least_recompute(_cfg(*schedule, memory))
    counts = fitted.memory.recompute_stage_layers
    assert counts == _scan(*schedule, memory)
    assert fits_device(fitted)
    # early ranks hold more micro-batches in flight: they recompute more; a rank's stages share its count
    pp = fitted.parallel.pp
    ranks = counts[:pp]
    assert ranks == sorted(ranks, reverse=True) and ranks[0] > ranks[-1]
    assert counts == ranks * (len(counts) // pp)
    # each block spared is a forward not paid twice
    every = estimate_step(_cfg(*schedule, memory))
    assert estimate_step(fitted).breakdown["recompute"] < every.breakdown["recompute"]
    assert estimate_step(fitted).step_time_sec < every.step_time_sec


def test_a_config_it_cannot_improve_is_returned_as_it_is():
    full = ["memory.recompute=full"]
    assert least_recompute(_cfg()) == _cfg()  # recomputes nothing
    over = f"cluster.memory_gib={_gib(_cfg(*full)) * 0.9}"  # over memory even recomputing every block
    assert least_recompute(_cfg(*full, over)) == _cfg(*full, over)
    counted = ["memory.recompute_layers=2", _between(*full)]  # the user's own count stands
    assert least_recompute(_cfg(*full, *counted)) == _cfg(*full, *counted)
    roomy = least_recompute(_cfg(*full, f"cluster.memory_gib={_gib(_cfg()) * 1.01}"))  # fits without recompute
    assert roomy.memory.recompute_stage_layers == [0, 0, 0, 0]
    assert estimate_step(roomy).breakdown["recompute"] == 0
