"""core.ckpt.store: atomic safetensors checkpoints, bitwise round trips, pruning, crash leftovers."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core import ckpt as ck

REPO = Path(__file__).resolve().parents[4]


def _tensors(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "model.embed.weight": rng.standard_normal((16, 8)).astype(np.float32),
        "model.layers.0.attn.wq.weight": rng.standard_normal((8, 8)).astype(np.float32),
        "model.layers.0.norm.weight": rng.standard_normal(8).astype(np.float16),
        "optim.adamw.m.embed.weight": rng.standard_normal((16, 8)).astype(np.float32),
        "optim.adamw.step": np.array(12345678901, dtype=np.int64),  # 0-d
        "optim.muon.lr_scale": np.array(0.5, dtype=np.float32),  # 0-d float
        "data.token_ids": rng.integers(-(2**40), 2**40, size=(3, 5)),  # int64
        "model.empty": np.zeros((0, 4), dtype=np.float32),
    }


META = {
    "step": 7,
    "data_position": 7,
    "seed": 1234,
    "rng": {"bit_generator": "PCG64", "state": {"state": 2**100 + 3, "inc": 5}},
    "config": {
        "model": {"name": "tiny", "d_model": 128},
        "optim": {"lr": 3e-3, "betas": [0.9, 0.95]},
        "trial": {"max_steps": None},
    },
}


def _assert_same(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name  # bitwise


def test_round_trip_bitwise_and_meta(tmp_path):
    tensors = _tensors()
    tensors["model.special"] = np.array([np.nan, -0.0, np.inf, 1e-45], dtype=np.float32)
    path = ck.save_checkpoint(tmp_path, 7, tensors, META)
    assert path == tmp_path / "step_00000007"
    assert sorted(p.name for p in path.iterdir()) == ["model_optim.safetensors"]
    loaded, meta = ck.load(path)
    _assert_same(tensors, loaded)
    assert meta == META  # exact, including a >64-bit RNG integer
    assert ck.read_meta(path) == META
    _, meta_from_file = ck.load(path / ck.FILENAME)  # the file path works too
    assert meta_from_file == META


def test_meta_gets_step_and_numpy_values(tmp_path):
    meta = {"seed": np.int64(3), "loss": np.float32(2.5), "hist": np.array([1, 2])}
    _, loaded = ck.load(ck.save_checkpoint(tmp_path, 4, {"w": np.ones(2, np.float32)}, meta))
    assert loaded == {"seed": 3, "loss": 2.5, "hist": [1, 2], "step": 4}
    with pytest.raises(ValueError, match="disagrees"):
        ck.save_checkpoint(tmp_path, 5, {}, {"step": 6})
    with pytest.raises(TypeError, match="JSON-serialisable; object"):
        ck.save_checkpoint(tmp_path, 5, {}, {"x": object()})


def test_input_validation(tmp_path):
    with pytest.raises(TypeError, match="asnumpy"):
        ck.save_checkpoint(tmp_path, 1, {"w": [1.0, 2.0]}, {})
    with pytest.raises(ValueError, match="reserved"):
        ck.save_checkpoint(tmp_path, 1, {"msar.meta": np.ones(1)}, {})
    with pytest.raises(ValueError, match="keep"):
        ck.save_checkpoint(tmp_path, 1, {}, {}, keep=0)
    assert ck.list_checkpoints(tmp_path) == []  # nothing half-written was left
    assert list(tmp_path.iterdir()) == []


def test_non_contiguous_input(tmp_path):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    loaded, _ = ck.load(ck.save_checkpoint(tmp_path, 0, {"t": base.T, "s": base[:, ::2]}, {}))
    np.testing.assert_array_equal(loaded["t"], base.T)
    np.testing.assert_array_equal(loaded["s"], base[:, ::2])


def test_latest_and_keep(tmp_path):
    assert ck.latest_checkpoint(tmp_path / "none") is None
    assert ck.latest_checkpoint(tmp_path) is None
    for step in (10, 2, 30, 100_000_000):  # saved out of order; a 9-digit step too
        ck.save_checkpoint(tmp_path, step, {"w": np.full(2, step, np.float32)}, {})
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == [
        "step_00000002",
        "step_00000010",
        "step_00000030",
        "step_100000000",
    ]
    assert ck.latest_checkpoint(tmp_path).name == "step_100000000"
    ck.save_checkpoint(tmp_path, 100_000_001, {"w": np.zeros(2, np.float32)}, {}, keep=2)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_100000000", "step_100000001"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_100000000", "step_100000001"]


def test_saving_a_step_again_replaces_it(tmp_path):
    ck.save_checkpoint(tmp_path, 3, {"w": np.zeros(2, np.float32)}, {"v": 1})
    ck.save_checkpoint(tmp_path, 3, {"w": np.ones(2, np.float32)}, {"v": 2})
    tensors, meta = ck.load(ck.latest_checkpoint(tmp_path))
    np.testing.assert_array_equal(tensors["w"], np.ones(2, np.float32))
    assert meta["v"] == 2 and [p.name for p in tmp_path.iterdir()] == ["step_00000003"]


def test_crash_leftovers_are_ignored_and_cleaned(tmp_path):
    ck.save_checkpoint(tmp_path, 5, {"w": np.ones(3, np.float32)}, {})
    # A writer killed mid-save: its temporary directory (half a file) stays behind.
    code = (
        "import os, sys, numpy as np; from core import ckpt as ck; "
        "from safetensors import numpy as st; "
        "st.save_file = lambda *a, **k: os._exit(9); "  # die while writing
        "ck.save_checkpoint(sys.argv[1], 9, {'w': np.ones(3, np.float32)}, {})"
    )
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 9
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert len(leftovers) == 1 and "step_00000009" in leftovers[0].name
    (leftovers[0] / ck.FILENAME).write_bytes(b"\x10\x00\x00")  # as if partly written
    # A step directory without its file (not ours, or an incomplete copy) is not a checkpoint either.
    (tmp_path / "step_00000099").mkdir()
    assert ck.latest_checkpoint(tmp_path).name == "step_00000005"
    # The next save removes the dead writer's temporary (its pid no longer runs on this host).
    ck.save_checkpoint(tmp_path, 6, {"w": np.ones(3, np.float32)}, {})
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert ck.latest_checkpoint(tmp_path).name == "step_00000006"


def test_live_writers_temporaries_are_kept(tmp_path):
    foreign = tmp_path / ".tmp-step_00000001-some-other-host-1-abcdef12"
    mine_alive = tmp_path / f".tmp-step_00000001-{socket.gethostname()}-{os.getppid()}-abcdef12"
    foreign.mkdir()
    mine_alive.mkdir()
    ck.save_checkpoint(tmp_path, 2, {"w": np.ones(1, np.float32)}, {})
    assert foreign.is_dir() and mine_alive.is_dir()


def test_damage_is_detected(tmp_path):
    path = ck.save_checkpoint(tmp_path, 7, _tensors(), META)
    file = path / ck.FILENAME
    raw = bytearray(file.read_bytes())
    raw[-1] ^= 0xFF  # flip bits in the last tensor's data
    file.write_bytes(bytes(raw))
    with pytest.raises(ck.CheckpointError, match="CRC"):
        ck.load(path)
    ck.load(path, verify=False)  # still parseable when asked
    file.write_bytes(bytes(raw[: len(raw) // 2]))  # truncated
    with pytest.raises(ck.CheckpointError, match="truncated"):
        ck.load(path)
    with pytest.raises(FileNotFoundError, match="step_XXXXXXXX"):
        ck.load(tmp_path / "step_00000042")


def test_readable_by_safetensors(tmp_path):
    from safetensors import safe_open
    from safetensors.numpy import load_file

    tensors = _tensors()
    path = ck.save_checkpoint(tmp_path, 7, tensors, META)
    _assert_same(tensors, load_file(str(path / ck.FILENAME)))
    with safe_open(str(path / ck.FILENAME), framework="np") as f:
        assert json.loads(f.metadata()["msar.meta"]) == META


def test_readable_by_mindspore(tmp_path):
    ms = pytest.importorskip("mindspore")
    tensors = _tensors()
    path = ck.save_checkpoint(tmp_path, 7, tensors, META)
    params = ms.load_checkpoint(str(path / ck.FILENAME), format="safetensors")
    assert sorted(params) == sorted(tensors)
    _assert_same(tensors, {name: p.asnumpy() for name, p in params.items()})


def test_refuses_files_without_our_metadata(tmp_path):
    # MindSpore's own safetensors lack our metadata: load_checkpoint refuses them with a clear error.
    ms = pytest.importorskip("mindspore")
    file = tmp_path / "ms.safetensors"
    ms.save_checkpoint([{"name": "w", "data": ms.Tensor(np.ones(2, np.float32))}], str(file), format="safetensors")
    with pytest.raises(ck.CheckpointError, match="not written by core.ckpt"):
        ck.load(file)
