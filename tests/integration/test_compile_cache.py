"""Graphs loaded from the compile cache (core.runtime.compile_cache) compute what freshly compiled graphs compute, on 1 rank
and on 2 (FSDP gathers in the gradient graph, Muon's sharded Newton-Schulz in the update graph)."""

import pytest

from tests.integration.conftest import assert_same_run, losses

pytestmark = pytest.mark.slow

TINY = ("model=tiny", "trial.max_steps=3", "checkpoint.at_end=true")


def test_a_loaded_graph_trains_other_weights_as_a_compiled_one(trial):
    compiled = trial(*TINY, "seed=0")
    loaded = trial(*TINY, "seed=1")  # the seed only changes the weights: the same graphs, from the cache
    fresh = trial(*TINY, "seed=1", "execution.compile_cache=false")
    assert [r.code for r in (compiled, loaded, fresh)] == [0, 0, 0], loaded.output[-3000:]
    assert [r.summary["compile_cache"] for r in (compiled, loaded, fresh)] == ["compiled", "loaded", None]
    assert losses(loaded) != losses(compiled)
    assert losses(loaded) == losses(fresh)  # bit for bit: the same graphs on the same weights
    assert_same_run(loaded, fresh, steps=3)
    assert loaded.summary["metrics"]["grad_norm_last"] == fresh.summary["metrics"]["grad_norm_last"]


def test_a_loaded_graph_on_two_ranks_trains_as_a_compiled_one(trial):
    layout = (*TINY, "optim=muon", "parallel.dp_shard=2")
    compiled, loaded = trial(*layout), trial(*layout)
    assert [r.code for r in (compiled, loaded)] == [0, 0], loaded.output[-3000:]
    assert [r.summary["compile_cache"] for r in (compiled, loaded)] == ["compiled", "loaded"]
    assert_same_run(loaded, compiled, steps=3)
