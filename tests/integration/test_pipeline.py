"""Pipeline layouts, run by real worker processes, reproduce the 1-process run with the same global batch and
seed (per-step losses, validation loss, final parameters after consolidating the sharded checkpoint): every
schedule, uneven stage splits (one with stages of no blocks at the ends), pipelines composed with data, tensor
and fully sharded data parallelism and ZeRO-1, and recompute counted per stage."""

from __future__ import annotations

import pytest

from tests.integration.conftest import assert_layout_reproduces, final_params, trial_cache

pytestmark = pytest.mark.slow

STEPS = 10
# tiny with 4 layers (2 per stage, or 1 per virtual stage with 2 per rank); 4 micro-batches of 2 per step
BASE = (
    "model=tiny",
    "model.n_layers=4",
    "seed=5",
    f"trial.max_steps={STEPS}",
    "checkpoint.interval=5",
    "training.global_batch_size=8",
    "training.micro_batch_size=2",
)
PP = ("parallel.pp=2",)
# A pipeline composed with a data-parallel axis runs with FSDP (dp_shard, whose reduce-scatter is the harder
# path); with replicas (dp_replicate: one all-reduce of each stage's gradients) it ran here too, and was dropped
# from CI for time (the same collective as every dp_replicate test).
LAYOUTS = {
    "gpipe": (*PP, "parallel.pp_schedule=gpipe"),
    "1f1b muon": (*PP, "parallel.pp_schedule=1f1b", "optim=muon"),
    "interleaved": (*PP, "parallel.pp_schedule=interleaved", "parallel.pp_virtual=2"),
    # the embedding alone on the first virtual stage, the norm and head alone on the last (Megatron's split
    # accounting of the embedding and the loss as layers)
    "interleaved 0+2+2+0": (
        *PP,
        "parallel.pp_schedule=interleaved",
        "parallel.pp_virtual=2",
        "parallel.pp_layers=[0,2,2,0]",
    ),
    "uneven 1+3 untied": (*PP, "parallel.pp_layers=[1,3]", "model.tie_embeddings=false"),
    "pp=2 tp=2 sp": (*PP, "parallel.tp=2", "parallel.sp=true"),
    # full recompute of stage 0's first block only (a count per stage): FSDP gathers plainly inside it and through
    # its ShardedOps in the next
    "pp=2 dp_shard=2 recompute 1 block of stage 0": (
        *PP,
        "parallel.dp_shard=2",
        "memory.recompute_stages=[full,none]",
        "memory.recompute_stage_layers=[1,0]",
    ),
    # ZeRO-1 (core.parallel.zero1) on each stage: the tied table's two copies summed shard by shard, Muon's
    # matrices gathered whole from the masters
    "pp=2 zero1 dp_shard=2 muon": (*PP, "parallel.dp_shard=2", "parallel.dp_shard_strategy=optim", "optim=muon"),
}
REFERENCE = {
    "1f1b muon": ("optim=muon",),
    "uneven 1+3 untied": ("model.tie_embeddings=false",),
    "pp=2 zero1 dp_shard=2 muon": ("optim=muon",),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, warm):
    return trial_cache(tmp_path_factory.mktemp("pipeline"), BASE, env=warm)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pipeline_reproduces_the_single_process_run(runs, layout):
    run = runs(*LAYOUTS[layout])
    assert_layout_reproduces(run, runs(*REFERENCE.get(layout, ())), STEPS, pp=2)
    if "untied" in layout:
        assert "model.lm_head.weight" in final_params(run, STEPS)


def test_each_stage_holds_only_its_layers(runs):
    """The state of each rank is its stage's: the uneven split puts 1 block (and the embedding) on rank 0 and
    3 blocks (and the head) on rank 1."""
    run = runs(*LAYOUTS["uneven 1+3 untied"])
    assert run.code == 0, run.output
    ranks = run.summary["ranks"]
    block = 2 * 128 + 128 * 32 * (4 + 2 + 2 + 4) + 3 * 128 * 512  # tiny: norms, wq wk wv wo (E=32), MLP
    table = 256 * 128
    assert ranks[0]["state_bytes"]["params"] == 4 * (table + block)
    assert ranks[1]["state_bytes"]["params"] == 4 * (3 * block + 128 + table)  # final norm, lm_head
