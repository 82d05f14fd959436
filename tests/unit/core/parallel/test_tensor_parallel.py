"""core.parallel.tensor_parallel: which collectives a block runs each way, against Megatron-LM's count.

Megatron (Shoeybi et al. 2019, section 3; Korthikanti et al. 2022, section 4.2.2) runs per transformer block two
all-reduces forward and two backward (with sequence parallelism two all-gathers and two reduce-scatters each way):
one per region entered (attention, MLP) and one per region left. ``core.perf.work`` prices a block so; these tests
hold the core to it by counting the collective mappings the layout puts in one block, each by what it runs
forward and backward (``core.parallel.comm.mappings``). The numbers are checked against one process by
tests/integration/test_mesh.py.
"""

from __future__ import annotations

from collections import Counter

import pytest

from core.config import load_config
from core.model import GPT
from core.model.gpt import transformer_blocks
from core.parallel import comm
from core.parallel.tensor_parallel import apply_tensor_parallel

# (forward, backward) collectives of each mapping
RUNS = {
    comm.CopyTo: ((), ("all-reduce",)),
    comm.ReduceFrom: (("all-reduce",), ()),
    comm.GatherFrom: (("all-gather",), ("reduce-scatter",)),
    comm.ReduceScatterTo: (("reduce-scatter",), ("all-gather",)),
}


def _collectives(model_overrides: list[str], sp: bool) -> list[tuple[Counter, Counter]]:
    """(forward, backward) collective counts of each block of the model under tp=2 (rank 0 of a group that is
    never initialised: the mappings' primitives are only built, not run)."""
    cfg = load_config(model_overrides)
    model = GPT(cfg.model, seed=0)
    apply_tensor_parallel(model, comm.Group("tp_test", (0, 1), 0), sp, {})
    counts = []
    for block in transformer_blocks(model):
        fwd, bwd = Counter(), Counter()
        for _, cell in block.cells_and_names():
            forward, backward = RUNS.get(type(cell), ((), ()))
            fwd.update(forward)
            bwd.update(backward)
        counts.append((fwd, bwd))
    return counts


@pytest.mark.parametrize("sp", [False, True])
def test_a_dense_block_enters_and_leaves_each_region_once(sp):
    """GQA attention's q/k/v and the MLP's gate/up share their region's entry: their input gradients are summed on
    the rank and reduced once (one gathered input saved under SP), not once per projection."""
    per_way = Counter({"all-gather": 2, "reduce-scatter": 2}) if sp else Counter({"all-reduce": 2})
    for fwd, bwd in _collectives(["model=tiny"], sp):
        assert (fwd, bwd) == (per_way, per_way)


@pytest.mark.parametrize("sp", [False, True])
def test_mla_and_moe_blocks_enter_by_their_own_inputs(sp):
    """MLA's up-projections read latents of their own and the shared RoPE key enters apart: three entries, one
    exit for attention; an MoE block's shared expert is an MLP (one entry, one exit), its routed experts split by
    expert parallelism, not here; deepseek-tiny's first block is dense."""
    enter, leave = ("reduce-scatter", "all-gather") if sp else ("all-reduce", None)
    blocks = _collectives(["model=deepseek-tiny"], sp)
    cfg = load_config(["model=deepseek-tiny"]).model
    assert cfg.moe_dense_layers == 1 and cfg.moe_shared_experts >= 1 and cfg.mla and cfg.q_lora_rank
    for fwd, bwd in blocks:
        entries = 3 + 1  # wq_b, wkv_b, share_key; the MLP's (dense or shared)
        exits = 2  # wo, w_down
        want_bwd = Counter({enter: entries} | ({leave: exits} if leave else {}))
        assert bwd == want_bwd
        want_fwd = Counter({"all-gather": entries, "reduce-scatter": exits} if sp else {"all-reduce": exits})
        assert fwd == want_fwd
