"""The collectives a block runs each way under tensor and context parallelism, against the counts ``core.perf``
prices (Megatron-LM's).

Megatron (Shoeybi et al. 2019, section 3; Korthikanti et al. 2022, section 4.2.2) runs per transformer block two
all-reduces forward and two backward (with sequence parallelism two all-gathers and two reduce-scatters each way):
one per region entered (attention, MLP) and one per region left. ``core.perf.work`` prices a block so; these tests
hold the core to it by counting the collective mappings the layout puts in one block, each by what it runs
forward and backward (``core.parallel.comm.mappings``). The numbers are checked against one process by
tests/integration/test_mesh.py. Context parallelism (``core.parallel.context_parallel``; ``core.perf.work``: an
all-gather of the keys and values forward, a reduce-scatter of their gradients backward) gathers k and v as one
tensor and takes the keys' positions from the layout, not from a third collective.
"""

from __future__ import annotations

from collections import Counter

import pytest

from core.config import load_config
from core.model import GPT
from core.model.gpt import transformer_blocks
from core.parallel import comm
from core.parallel.context_parallel import apply_context_parallel, chunk_positions, key_positions
from core.parallel.tensor_parallel import apply_tensor_parallel

# (forward, backward) collectives of each mapping
RUNS = {
    comm.CopyTo: ((), ("all-reduce",)),
    comm.ReduceFrom: (("all-reduce",), ()),
    comm.GatherFrom: (("all-gather",), ("reduce-scatter",)),
    comm.ReduceScatterTo: (("reduce-scatter",), ("all-gather",)),
}


def _collectives(model_overrides: list[str], sp: bool = False, axis: str = "tp") -> list[tuple[Counter, Counter]]:
    """(forward, backward) collective counts of each block of the model under tp=2 or cp=2 (rank 0 of a group
    that is never initialised: the mappings' primitives are only built, not run)."""
    cfg = load_config(model_overrides)
    model = GPT(cfg.model, seed=0)
    group = comm.Group(f"{axis}_test", (0, 1), 0)
    if axis == "tp":
        apply_tensor_parallel(model, group, sp, {})
    else:
        apply_context_parallel(model, group, cfg.training.seq_len)
    counts = []
    for block in transformer_blocks(model):
        fwd, bwd = Counter(), Counter()
        mappings = [name for name, cell in block.cells_and_names() if type(cell) in RUNS]
        for name, cell in block.cells_and_names():
            forward, backward = RUNS.get(type(cell), ((), ()))
            if _bare_collective(cell) and not any(name.startswith(f"{m}.") for m in mappings):
                forward = (type(cell).__name__,)  # a collective outside a mapping: forward only (no gradient)
            fwd.update(forward)
            bwd.update(backward)
        counts.append((fwd, bwd))
    return counts


def _bare_collective(cell) -> bool:
    return type(cell).__module__ == "core.parallel.comm.collectives" and type(cell).__name__ != "Identity"


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


@pytest.mark.parametrize("model", ["tiny", "deepseek-tiny"])
def test_context_parallel_gathers_keys_and_values_once(model):
    """One all-gather forward (k and v side by side; MLA's widths differ) and one reduce-scatter backward per block."""
    for fwd, bwd in _collectives([f"model={model}"], axis="cp"):
        assert (fwd, bwd) == (Counter({"all-gather": 1}), Counter({"reduce-scatter": 1}))


def test_the_keys_positions_are_every_ranks_chunks_in_group_order():
    """S = 16 over cp = 2: four chunks of 4, rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 (load balance)."""
    assert chunk_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert chunk_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert key_positions(16, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
