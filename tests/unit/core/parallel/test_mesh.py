"""ParallelDims (coordinates, groups), Placement (how a parameter is cut) and sharded checkpoints, simulated for
every rank of a layout in one process (NumPy only)."""

import itertools

import numpy as np
import pytest

from core import ckpt as ck
from core.ckpt import sharded as sck
from core.ckpt.__main__ import main as consolidate_main
from core.parallel.dims import MESH, ParallelDims
from core.parallel.placement import Placement, layout_placement, replicated

LAYOUTS = [
    dict(dp_shard=2),
    dict(dp_replicate=2, dp_shard=2),
    dict(tp=2),
    dict(cp=2),
    dict(tp=2, dp_shard=2),
    dict(cp=2, tp=2),
    dict(pp=2, dp_replicate=2, dp_shard=2, cp=2, tp=2),
]


@pytest.mark.parametrize("degrees", LAYOUTS)
def test_coordinates_and_groups_tile_the_world(degrees):
    world = ParallelDims(**degrees).world_size
    dims = [ParallelDims(**degrees, rank=r) for r in range(world)]
    assert {tuple(d.coords().values()) for d in dims} == set(
        itertools.product(*(range(d) for d in (dims[0].degree(a) for a in MESH)))
    )
    for d in dims:
        assert d.rank_of(d.coords()) == d.rank
        for names in (("tp",), ("cp",), ("dp_shard",), ("batch",), ("fsdp",), ("loss",), ("shard",)):
            ranks = d.group_ranks(*names)
            assert len(ranks) == d.size(*names) and ranks[d.index(*names)] == d.rank
            for other in ranks:  # the same group seen from every member, in the same order
                assert dims[other].group_ranks(*names) == ranks
    # tp is innermost: tensor-parallel peers are neighbouring ranks
    if dims[0].tp > 1:
        assert dims[0].group_ranks("tp") == tuple(range(dims[0].tp))
    # views: fsdp = dp_shard x cp, batch = dp_replicate x dp_shard, loss = batch x cp
    d = dims[-1]
    assert d.size("fsdp") == d.dp_shard * d.cp and d.size("batch") == d.dp_replicate * d.dp_shard
    assert d.size("loss") == d.size("batch") * d.cp


def test_batch_rank_is_not_the_global_rank():
    # tp=2 x dp_shard=2: ranks 0,1 read batch rows 0; ranks 2,3 rows 1
    assert [ParallelDims(tp=2, dp_shard=2, rank=r).index("batch") for r in range(4)] == [0, 0, 1, 1]


@pytest.mark.parametrize(
    "shape, tp_dim, tp, fsdp, ep",
    [
        ((12, 7), 0, 2, 1, 1),
        ((12, 7), 1, 1, 3, 1),
        ((12, 8), 1, 2, 3, 1),
        ((5,), None, 2, 4, 1),
        ((), None, 1, 1, 1),
        ((6, 4), 0, 3, 2, 1),
        ((4, 6, 5), 1, 2, 1, 2),
        ((4, 5, 6), 2, 3, 1, 4),
        ((6, 3, 2), None, 1, 1, 3),
    ],
)
def test_placements_cut_and_reassemble_any_array(shape, tp_dim, tp, fsdp, ep):
    full = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    tp = tp if tp_dim is not None else 1
    pieces, stored = {}, 0
    for e in range(ep):
        for t in range(tp):
            for f in range(fsdp):
                p = Placement(shape, tp_dim, tp, t, fsdp, f, ep, e)
                piece = p.shard(full)
                assert piece.shape == p.stored_shape
                pieces[p.key] = piece
                stored += piece.size
    p = Placement(shape, tp_dim, tp, 0, fsdp, 0, ep, 0)
    assert sorted(pieces) == sorted(p.piece_keys())
    assert np.array_equal(p.assemble(pieces), full)
    # per rank: 1/(ep*tp*fsdp) of the array plus the padding (< fsdp elements per TP block)
    ranks = ep * tp * fsdp
    assert full.size <= stored < full.size + ranks * fsdp or full.size == 0
    assert Placement.from_json(p.to_json()) == p


def test_expert_blocks_are_whole_experts_split_by_width():
    full = np.arange(4 * 6 * 2).reshape(4, 6, 2)  # (X, F, D)
    p = layout_placement("layers.1.mlp.experts.w_up", full.shape, tp=2, fsdp=4, ep=2, tp_index=1, ep_index=1)
    assert (p.fsdp_size, p.local_shape) == (1, (2, 3, 2))  # never FSDP-sharded
    assert np.array_equal(p.shard(full), full[2:4, 3:6])
    assert Placement.from_json(
        {"full_shape": [4], "tp_dim": None, "tp_size": 1, "tp_index": 0, "fsdp_size": 2, "fsdp_index": 1}
    ) == Placement((4,), fsdp_size=2, fsdp_index=1)  # before ep


def _simulate_checkpoint(root, degrees, full: dict, step=3):
    """Every rank of a layout writes its shards, as the trainer does; rank 0 publishes."""
    world = ParallelDims(**degrees).world_size
    writers = []
    for r in range(world):
        d = ParallelDims(**degrees, rank=r)
        if d.coords()["dp_replicate"]:
            continue
        placements = {}
        for key, arr in full.items():
            if arr.ndim == 2:  # split like a column-parallel weight, then FSDP
                p = Placement(arr.shape, 0, d.tp, d.coords()["tp"])
            else:
                p = replicated(arr.shape)
            placements[key] = p.with_fsdp(d.size("fsdp"), d.index("fsdp")) if arr.ndim else p
        sck.write_shard(root, step, r, {k: placements[k].shard(v) for k, v in full.items()}, placements)
        writers.append(r)
    return sck.publish(root, step, writers, {"seed": 1, "layout": str(degrees)}, keep=2)


@pytest.mark.parametrize("degrees", LAYOUTS[:6])
def test_sharded_checkpoint_consolidates_to_the_full_arrays(tmp_path, degrees):
    rng = np.random.default_rng(1)
    full = {
        "model.w": rng.standard_normal((8, 6)).astype(np.float32),
        "model.g": rng.standard_normal(7).astype(np.float32),
        "optim.step": np.array(3, dtype=np.int64),
    }
    path = _simulate_checkpoint(tmp_path / "ck", degrees, full)
    assert ck.latest_checkpoint(tmp_path / "ck") == path and not list((tmp_path / "ck").glob(".tmp-*"))
    tensors, meta = ck.load(path)
    assert meta["step"] == 3 and meta["seed"] == 1 and ck.read_meta(path) == meta
    assert sorted(tensors) == sorted(full) and all(np.array_equal(tensors[k], full[k]) for k in full)
    # the command line writes the 1-process layout, which loads as an ordinary checkpoint
    assert consolidate_main(["consolidate", str(path), str(tmp_path / "full")]) == 0
    again, _ = ck.load(tmp_path / "full" / "step_00000003")
    assert all(np.array_equal(again[k], full[k]) for k in full)


def test_a_missing_or_damaged_shard_is_an_error(tmp_path):
    full = {"model.w": np.arange(48, dtype=np.float32).reshape(8, 6)}
    path = _simulate_checkpoint(tmp_path, dict(tp=2, dp_shard=2), full)
    (path / sck.shard_file(3)).unlink()
    with pytest.raises(ck.CheckpointError, match="unreadable shard"):
        ck.load(path)
    path = _simulate_checkpoint(tmp_path, dict(dp_shard=2), full, step=4)
    data = bytearray((path / sck.shard_file(1)).read_bytes())
    data[-4:] = b"\x00\x00\x80\x7f"
    (path / sck.shard_file(1)).write_bytes(bytes(data))
    with pytest.raises(ck.CheckpointError, match="CRC"):
        ck.load(path)


def test_an_unpublished_step_is_invisible(tmp_path):
    p = replicated((4,))
    sck.write_shard(tmp_path, 5, 0, {"model.w": np.zeros(4, np.float32)}, {"model.w": p})
    assert ck.latest_checkpoint(tmp_path) is None  # staged, never published: a crash mid-save loses nothing
    with pytest.raises(ck.CheckpointError, match="ranks \\[1\\]"):
        sck.publish(tmp_path, 5, [0, 1], {})
