"""Asynchronous checkpoints (``checkpoint.async_save``): the files written while the steps go on are the ones a
synchronous save writes, on one process and sharded over ranks; a rank killed while saves are in flight leaves
only complete checkpoints behind."""

from __future__ import annotations

import numpy as np
import pytest

from core import ckpt as ck
from tests.integration.conftest import kill_rank_mid_run, losses, run_trial

pytestmark = pytest.mark.slow

BASE = ("model=tiny", "seed=4", "trial.max_steps=6", "checkpoint.interval=2", "checkpoint.keep=3")


@pytest.mark.parametrize("layout", [(), ("parallel.dp_shard=2",)], ids=["1 process", "dp_shard=2"])
def test_async_save_writes_what_a_synchronous_save_writes(tmp_path, layout, warm):
    runs = {
        mode: run_trial(tmp_path / mode, *BASE, *layout, f"checkpoint.async_save={mode == 'async'}", env=warm)
        for mode in ("sync", "async")
    }
    for run in runs.values():
        assert run.code == 0, run.output[-3000:]
    assert losses(runs["async"]) == losses(runs["sync"])
    saved = {mode: ck.list_checkpoints(run.dir / "checkpoints") for mode, run in runs.items()}
    assert (
        [p.name for p in saved["async"]] == [p.name for p in saved["sync"]] == [f"step_0000000{s}" for s in (2, 4, 6)]
    )
    for a, s in zip(saved["async"], saved["sync"], strict=True):
        (ta, ma), (ts, ms_) = ck.load(a), ck.load(s)
        assert sorted(ta) == sorted(ts) and ma["step"] == ms_["step"]
        for key in ts:
            np.testing.assert_array_equal(ta[key], ts[key], err_msg=f"{a.name} {key}")


def test_a_rank_killed_while_saves_are_in_flight_leaves_only_whole_checkpoints(tmp_path):
    run = kill_rank_mid_run(
        tmp_path / "killed", 1, "parallel.dp_shard=2", "checkpoint.interval=1", "checkpoint.async_save=true"
    )
    assert run.code != 0
    found = ck.list_checkpoints(run.dir / "checkpoints")
    for path in found:  # every step directory in place is complete: its index names shards that pass their CRC
        tensors, meta = ck.load(path)
        assert tensors and meta["step"] == int(path.name.split("_")[1])
