"""ZeRO-1 (``parallel.dp_shard_strategy=optim``, Megatron's distributed optimizer) against FSDP, by hand: what a rank
holds (whole weights and gradients, sharded masters and states) and what crosses the network (one reduce-scatter of
the gradients and one all-gather of the weights a step, instead of a gather per use and a scatter per micro-batch);
trained by core.parallel.zero1 (tests/integration/test_mesh.py checks it against the 1-process run)."""

from __future__ import annotations

import math

import pytest

from core.config import ConfigError, load_config
from core.config.rules import check_runnable
from core.memory.estimate import terms
from core.model.flops import param_shapes
from core.parallel.placement import is_expert, tp_split_dim
from core.perf import estimate_step, planned_config
from core.perf.__main__ import text
from tests.unit.core.perf.conftest import CLUSTER

# the made-up accelerator of conftest; every group below stays in one node of 8 at 100 GB/s
ONE_NODE = [*CLUSTER, "cluster.nodes=1", "training.seq_len=1024", "training.global_batch_size=8"]
BW = 100e9
ZERO1 = "parallel.dp_shard_strategy=optim"


def _cfg(*overrides, model="llama3-8b", precision="bf16"):
    return planned_config([*ONE_NODE, f"model={model}", f"training.precision={precision}", *overrides])


def _numel(model: str, *, experts: bool = False, tp: int = 1) -> float:
    """Elements of the model's dense weights (or its experts) a rank holds of tensor parallelism ``tp``: the weights
    it splits (``TP_SPLIT_DIMS``) divided, the rest (norms, the router) whole."""
    shapes = param_shapes(load_config([f"model={model}"]).model)
    return sum(
        math.prod(s) / (tp if tp_split_dim(name) is not None else 1)
        for name, s in shapes.items()
        if is_expert(name) == experts
    )


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_rank_holds_whole_weights_and_gradients_and_an_eighth_of_the_optimizer(precision):
    """llama3-8b on dp_shard 8 (every weight divides by 8: no padding). FSDP holds an eighth of everything; ZeRO-1
    the fp32 gradients whole, the AdamW states and fp32 masters an eighth, the weights whole (bf16: beside the
    masters as compute copies; fp32: the weights are the masters)."""
    N = _numel("llama3-8b")
    fsdp = terms(_cfg("parallel.dp_shard=8", precision=precision))
    zero1 = terms(_cfg("parallel.dp_shard=8", ZERO1, precision=precision))
    assert (fsdp.params, fsdp.grads, fsdp.optimizer) == pytest.approx((4 * N / 8, 4 * N / 8, 8 * N / 8))
    params = 4 * N / 8 + 2 * N if precision == "bf16" else 4 * N
    assert (zero1.params, zero1.grads, zero1.optimizer) == pytest.approx((params, 4 * N, 8 * N / 8))
    assert zero1.gathered == zero1.sharded_ops == 0 < fsdp.gathered
    assert estimate_step(_cfg("parallel.dp_shard=8", ZERO1)).peak_memory_bytes_per_rank > fsdp.states


def test_a_step_reduce_scatters_the_gradients_and_gathers_the_weights_once():
    """Exposed (no overlap), HSDP 2 x 4: FSDP pays a gather per forward and backward and a scatter per micro-batch
    (4 of them); ZeRO-1 pays, once a step, fp32 gradients reduce-scattered over the 4 dp_shard ranks, their shards
    all-reduced over the 2 replicas, the bf16 weights all-gathered over the 4 — ring volumes (n-1)/n of the bytes."""
    N = _numel("llama3-8b")
    exposed = ["cluster.overlap_dp=false", "cluster.overlap_fsdp=false", "parallel.dp_replicate=2"]
    exposed += ["training.global_batch_size=32", "training.micro_batch_size=1"]  # 4 micro-batches a rank
    fsdp = estimate_step(_cfg(*exposed, "parallel.dp_shard=4"))
    zero1 = estimate_step(_cfg(*exposed, "parallel.dp_shard=4", ZERO1))
    all_reduce = 2 * (1 / 2) * (N / 4 * 4) / BW
    assert fsdp.breakdown["comm_dp"] == pytest.approx(all_reduce)
    assert fsdp.breakdown["comm_fsdp"] == pytest.approx(4 * 3 / 4 * (2 * N * 2 + N * 4) / BW)
    assert zero1.breakdown.get("comm_fsdp", 0.0) == 0.0
    assert zero1.breakdown["comm_dp"] == pytest.approx(all_reduce + 3 / 4 * (N * 4 + N * 2) / BW)
    assert zero1.breakdown["compute"] == pytest.approx(fsdp.breakdown["compute"])


def test_overlap_hides_the_reduction_under_backward_and_the_gather_under_forward():
    base = ["parallel.dp_shard=8", ZERO1, "cluster.overlap_fsdp=false"]
    exposed = estimate_step(_cfg(*base, "cluster.overlap_dp=false"))
    hidden = estimate_step(_cfg(*base, "cluster.overlap_dp=true"))
    assert 0 <= hidden.breakdown["comm_dp"] < exposed.breakdown["comm_dp"]
    assert exposed.step_time_sec - hidden.step_time_sec == pytest.approx(
        exposed.breakdown["comm_dp"] - hidden.breakdown["comm_dp"]
    )


def test_folded_experts_shard_their_optimizer_over_the_ranks_holding_them():
    """Qwen3-30B-A3B, tp 2 + SP x dp_shard 4, ep 4 with ETP 1: two ranks hold each expert (EDP 2). Under ZeRO-1 the
    dense weights' gradients (tp share) reduce-scatter over the 4 dp_shard ranks, the experts' (128 / 4 whole
    ones) over their 2, and both gather back once a step. (The step-time model counts the tp share of every dense
    weight as 1/tp of it; the memory model keeps the router and norms whole: under 0.1% apart.)"""
    fold = ["parallel.tp=2", "parallel.sp=true", "parallel.dp_shard=4", "parallel.ep=4", "parallel.etp=1"]
    cfg = _cfg(*fold, ZERO1, "cluster.overlap_dp=false", model="qwen3-30b-a3b")
    assert cfg.parallel.expert_dp == 2
    dense, experts = _numel("qwen3-30b-a3b") / 2, _numel("qwen3-30b-a3b", experts=True) / 4
    want = 3 / 4 * dense * (4 + 2) / BW + 1 / 2 * experts * (4 + 2) / BW
    assert estimate_step(cfg).breakdown["comm_dp"] == pytest.approx(want)
    zero1, fsdp = terms(cfg), terms(_cfg(*fold, model="qwen3-30b-a3b"))
    assert zero1.optimizer == fsdp.optimizer
    assert zero1.grads == pytest.approx(4 * (_numel("qwen3-30b-a3b", tp=2) + experts))


def test_named_in_the_estimate_and_trained():
    cfg = _cfg("parallel.dp_shard=8", ZERO1)
    check_runnable(load_config(["model=tiny", "parallel.dp_shard=2", ZERO1]))  # the core trains it
    assert "ZeRO-1" in text(cfg, estimate_step(cfg)).splitlines()[0]
    assert "ZeRO-1" not in text(_cfg("parallel.dp_shard=8"), estimate_step(_cfg("parallel.dp_shard=8")))
    fold = ["parallel.tp=2", "parallel.sp=true", "parallel.dp_shard=4", "parallel.ep=8", "parallel.etp=1"]
    folded = _cfg(*fold, model="qwen3-30b-a3b")
    assert "experts folded: estimated, not trained" in text(folded, estimate_step(folded)).splitlines()[0]
    for overrides, field in (
        (["parallel.dp_shard=1", "parallel.dp_replicate=8", ZERO1], "parallel.dp_shard_strategy"),
        (["parallel.dp_shard=8", "parallel.dp_shard_strategy=zero2"], "parallel.dp_shard_strategy"),
    ):
        with pytest.raises(ConfigError) as info:
            _cfg(*overrides)
        assert info.value.field == field


def test_an_update_without_masters_moves_the_16_bit_weight_and_gradient():
    """cluster.master_weights=false (MindFormers' 16-bit weights): AdamW reads and writes the bf16 weight and reads
    its bf16 gradient beside the fp32 states (2 + 2 + 2 + 8 + 8 bytes an element) where a run with masters moves the
    fp32 master, an fp32 gradient, the states and the bf16 copy written back (4 + 4 + 4 + 8 + 8 + 2): the optimizer's
    time in that ratio, at the same memory bandwidth (an eighth of the model on each of 8 FSDP ranks)."""
    layout = ("parallel.dp_shard=8", "cluster.reduce_precision=bf16")
    masters = estimate_step(_cfg(*layout)).breakdown["optimizer"]
    without = estimate_step(_cfg(*layout, "cluster.master_weights=false")).breakdown["optimizer"]
    assert without / masters == pytest.approx(22 / 30)
    assert without == pytest.approx(22 * _numel("llama3-8b") / 8 / 2000e9)


def test_on_cpu_the_cores_masters_are_counted_beside_its_weights():
    """core.parallel.zero1 keeps fp32 masters apart from the fp32 weights (Megatron's fp32 weights are their own
    masters): on CPU, where the core runs, a rank holds each weight whole and its master's shard (padded), the
    gradients whole and AdamW's two states sharded; FSDP holds one shard of each."""
    cfg = load_config(["model=tiny", "parallel.dp_shard=2", ZERO1])
    sizes = [math.prod(s) for s in param_shapes(cfg.model).values()]
    whole, shard = sum(sizes), sum(-(-n // 2) for n in sizes)
    zero1, fsdp = terms(cfg), terms(load_config(["model=tiny", "parallel.dp_shard=2"]))
    assert (zero1.params, zero1.grads, zero1.optimizer) == (4 * (whole + shard), 4 * whole, 8 * shard)
    assert (fsdp.params, fsdp.grads, fsdp.optimizer) == (4 * shard, 4 * shard, 8 * shard)
