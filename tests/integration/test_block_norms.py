"""Run health (``training.health_interval``): each block's gradient and parameter norms in ``metrics.jsonl`` —
the parameters' against the checkpoint of the same step (NumPy float64), the gradients' against the global norm
the clipping computes (another code path), and every layout's against the 1-process run's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.integration.conftest import final_params, run_trial

pytestmark = pytest.mark.slow

STEPS = 3
BASE = ("model=tiny", "seed=6", f"trial.max_steps={STEPS}", "training.health_interval=1", "checkpoint.at_end=true")


def health(run) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run.dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "grad_norm_blocks" in r}


def grad_norms(run) -> dict[int, float]:
    rows = [json.loads(line) for line in (run.dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["grad_norm"] for r in rows if "grad_norm" in r}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    run = run_trial(tmp_path_factory.mktemp("one") / "t", *BASE)
    assert run.code == 0, run.output[-3000:]
    return run


def test_block_norms_match_the_checkpoint_and_the_global_norm(single):
    rows = health(single)
    assert sorted(rows) == list(range(1, STEPS + 1))
    blocks = ["embed", "layers.0", "layers.1", "layers.2", "norm"]  # tiny: 3 blocks, a tied head
    assert list(rows[STEPS]["param_norm_blocks"]) == blocks == list(rows[STEPS]["grad_norm_blocks"])
    params = final_params(single, STEPS)
    for block in blocks:
        want = np.sqrt(
            sum(np.sum(v.astype(np.float64) ** 2) for k, v in params.items() if k.startswith(f"model.{block}."))
        )
        assert rows[STEPS]["param_norm_blocks"][block] == pytest.approx(want, rel=1e-5), block
    for step, norm in grad_norms(single).items():
        per_block = rows[step]["grad_norm_blocks"].values()
        assert np.sqrt(sum(v**2 for v in per_block)) == pytest.approx(norm, rel=1e-5)


@pytest.mark.parametrize(
    "layout", [("parallel.tp=2",), ("parallel.dp_shard=2",), ("parallel.pp=2", "parallel.pp_layers=[1,2]")], ids=str
)
def test_every_layout_reports_the_1_process_norms(single, tmp_path, layout):
    run = run_trial(tmp_path / "t", *BASE, *layout)
    assert run.code == 0, run.output[-3000:]
    got, want = health(run), health(single)
    for step in want:
        for kind in ("grad_norm_blocks", "param_norm_blocks"):
            assert got[step][kind] == pytest.approx(want[step][kind], rel=1e-5), (step, kind)
