"""An MoE model (capacity-bounded, so that pairs are dropped) on data-parallel replicas, with expert parallelism
(with replicas, or with experts split by width over tensor-parallel ranks too), on a pipeline, and over a sequence
split by context and sequence parallelism reproduces the 1-process run: per-step losses (the load-balance gradient
included), validation loss, final parameters (expert shards consolidated), and the same pairs dropped."""

from __future__ import annotations

import pytest

from tests.integration.conftest import assert_same_run, run_trial

pytestmark = pytest.mark.slow

STEPS = 6
# moe-tiny's own 3 blocks (dense, MoE, MoE): the pipeline splits them 2 + 1, so each stage holds an MoE block
# and its load-balance loss. Compilation is most of these trials' time and grows with the blocks (the cp x tp
# layout, 10 steps: 106 s with 2 blocks, 173 s with 4).
BASE = (
    "model=moe-tiny",
    "model.moe_capacity_factor=1.0",
    "seed=5",
    f"trial.max_steps={STEPS}",
    "checkpoint.interval=3",
    "training.global_batch_size=8",
    "training.micro_batch_size=2",
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, warm):
    run = run_trial(tmp_path_factory.mktemp("moe") / "single", *BASE, timeout=900, env=warm)
    assert run.code == 0, run.output
    return run


EP = ("parallel.dp_shard=2", "parallel.ep=2")


@pytest.mark.parametrize(
    "layout",
    [
        ("parallel.dp_replicate=2",),
        ("parallel.pp=2", "parallel.pp_layers=[2,1]"),
        # expert parallelism over FSDP's ranks alone runs inside both next layouts (and DeepSeek's dp_shard=2
        # ep=2, test_deepseek_layouts): about 40 s of CI that no failure of its own would add
        (*EP, "parallel.dp_replicate=2"),
        (*EP, "parallel.tp=2"),
        ("parallel.cp=2", "parallel.tp=2", "parallel.sp=true"),
    ],
)
def test_moe_layout_reproduces_the_single_process_run(reference, tmp_path, layout, warm):
    run = run_trial(tmp_path / "run", *BASE, *layout, timeout=900, env=warm)
    assert run.code == 0, run.output + "".join(p.read_text()[-2000:] for p in (run.dir / "logs").glob("rank_*.log"))
    assert_same_run(run, reference, STEPS)
    dropped = reference.summary["metrics"]["moe_dropped_fraction"]
    assert 0 < dropped < 1
    if "parallel.dp_replicate=2" not in layout and "parallel.dp_shard=2" not in layout:
        # the same micro-batches pass the same MoE blocks (data-parallel ranks count other micro-batches' drops)
        assert run.summary["metrics"]["moe_dropped_fraction"] == pytest.approx(dropped)
