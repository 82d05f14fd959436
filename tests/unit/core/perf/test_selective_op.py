"""torchtitan's per-op selective checkpointing (``memory.recompute=selective_op``), by hand: what a dense block
saves (attention's output, the reduce-scatters, every second matmul's output) and what backward runs again (the other
matmuls, the element-wise work); estimated, never trained, and refused where its count does not hold."""

from __future__ import annotations

import pytest

from core.config import ConfigError
from core.config.rules import check_runnable
from core.memory.estimate import terms
from core.perf import planned_config
from core.perf.device import device
from core.perf.work import block_passes
from tests.unit.core.perf.conftest import CLUSTER

# Llama 3 8B: D 4096, 32 query heads and 8 key-value heads of 128, F 14336, 32 blocks; bf16, one sequence of 1024
D, Q, KV, A, F, L, T = 4096, 4096, 2 * 8 * 128, 4096, 14336, 32, 1024
BASE = [*CLUSTER, "cluster.nodes=1", "model=llama3-8b", "training.precision=bf16", "training.seq_len=1024"]


def _cfg(*overrides):
    return planned_config([*BASE, "training.global_batch_size=8", "training.micro_batch_size=1", *overrides])


@pytest.mark.parametrize(
    ("layout", "floats"),
    [
        # block input, wq, wv, attention's output, the gate, w2's (whole) output
        (["parallel.dp_shard=8"], D + Q + KV / 2 + A + F + D),
        # tp 2 with SP: the input split, the column-parallel outputs split, w2's partial sums whole, two reduce-scatters
        (["parallel.dp_shard=4", "parallel.tp=2", "parallel.sp=true"], D / 2 + (Q + KV / 2 + A + F) / 2 + D + D),
    ],
)
def test_a_block_saves_the_outputs_the_policy_keeps(layout, floats):
    """7.75 D a token without tensor parallelism (against the 17 D the core's selective recompute keeps)."""
    none, op = _cfg(*layout), _cfg(*layout, "memory.recompute=selective_op")
    assert terms(op).recomputed == pytest.approx(L * 2 * T * floats)
    assert terms(op).activations == terms(none).activations  # the textbook count before recompute is unchanged
    assert terms(op).recomputed < terms(_cfg(*layout, "memory.recompute=selective")).recomputed


def test_backward_runs_every_second_matmul_again():
    """wq wk wv wo gate up down in forward order: wk, wo and the up projection run again, beside selective's
    element-wise work: their FLOPs at the made-up device's 200 TFLOP/s, each bounded by its 1024 tokens (the
    profile's half-rate dimension applied)."""
    sel, op = (
        _cfg("parallel.dp_shard=8", "memory.recompute=selective"),
        _cfg("parallel.dp_shard=8", "memory.recompute=selective_op"),
    )
    dev = device(op.cluster, op.training.precision)
    again = block_passes(op, dev, 0, "selective_op")[1].recompute - block_passes(sel, dev, 0, "selective")[1].recompute
    flops = 2 * T * (KV / 2 * D + D * A + F * D)
    assert again == pytest.approx(flops / (200e12 * T / (T + dev.half_dim)))


def test_it_is_estimated_not_trained_and_only_for_dense_gqa_blocks():
    with pytest.raises(ConfigError, match="estimated") as info:
        check_runnable(_cfg("parallel.dp_shard=8", "memory.recompute=selective_op"))
    assert info.value.field == "memory.recompute"
    with pytest.raises(ConfigError, match="dense GQA") as info:
        planned_config([*CLUSTER, "cluster.nodes=1", "model=qwen3-30b-a3b", "memory.recompute=selective_op"])
    assert info.value.field == "memory.recompute"
