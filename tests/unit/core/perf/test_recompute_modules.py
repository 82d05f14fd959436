"""Megatron-LM's ``--recompute-modules`` (``memory.recompute_modules``) in the step time, by hand: backward re-runs
the norms (layernorm) and the routed experts' SwiGLU (moe_act), memory-bound work at the made-up device's 2 TB/s;
core_attn re-runs nothing under flash attention, which recomputes its scores anyway."""

from __future__ import annotations

import pytest

from core.perf import planned_config
from core.perf.device import device
from core.perf.work import block_passes
from tests.unit.core.perf.conftest import CLUSTER

# Mixtral 8x7B's block: D 4096, 8 experts of F_e 14336, top 2; bf16, one sequence of 1024 tokens on one rank
D, F, TOP_K, T = 4096, 14336, 2, 1024


def _selective(*overrides: str, model: str = "mixtral-8x7b") -> float:
    """Backward's recompute seconds of block 0 under selective recompute, on 8 FSDP ranks of the made-up node."""
    cfg = planned_config(
        [
            *CLUSTER,
            "cluster.nodes=1",
            f"model={model}",
            "training.precision=bf16",
            "training.seq_len=1024",
            "training.global_batch_size=8",
            "training.micro_batch_size=1",
            "parallel.dp_shard=8",
            "memory.recompute=selective",
            *overrides,
        ]
    )
    return block_passes(cfg, device(cfg.cluster, "bf16"), 0, "selective")[1].recompute


def _recompute(*modules: str) -> float:
    return _selective("cluster.saved_activations=megatron", f"memory.recompute_modules=[{','.join(modules)}]")


def test_each_module_re_runs_its_own_element_wise_work():
    bandwidth = 2000e9
    norms = 2 * T * (2 * 2 * D)  # two norms, each reading and writing D bf16 values a token
    act = 2 * T * TOP_K * 3 * F  # the routed experts' SwiGLU: reads gate and up, writes their product
    assert _recompute("layernorm") == pytest.approx(norms / bandwidth)
    assert _recompute("moe_act") == pytest.approx(act / bandwidth)
    assert _recompute("layernorm", "moe_act") == pytest.approx((norms + act) / bandwidth)
    assert _recompute("core_attn") == 0.0


def test_mindformers_selective_re_runs_the_dense_swiglu():
    """MindFormers' select_recompute (``cluster.saved_activations=mindformers``): silu and the product of the dense
    MLP re-run in backward, reading gate and up and writing the product (Llama 3 8B's F 14336, bf16), nothing else."""
    recompute = _selective("cluster.saved_activations=mindformers", model="llama3-8b")
    assert recompute == pytest.approx(2 * T * 3 * 14336 / 2000e9)
