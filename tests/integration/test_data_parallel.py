"""Data parallelism over real worker processes, against the single-process run with the same global batch."""

import pytest

from tests.integration.conftest import kill_rank_mid_run
from tests.schema import assert_summary_schema

pytestmark = pytest.mark.slow


def test_dp2_matches_single_process(trial):
    single = trial("model=tiny", "trial.max_steps=4", "training.global_batch_size=8", "training.micro_batch_size=2")
    dp = trial(
        "model=tiny",
        "trial.max_steps=4",
        "training.global_batch_size=8",
        "training.micro_batch_size=2",
        "parallel.dp_replicate=2",
    )
    assert single.code == 0, single.output
    assert dp.code == 0, dp.output + (dp.dir / "logs" / "rank_1.log").read_text()
    s = dp.summary
    assert_summary_schema(s)
    assert s["layout"]["world_size"] == 2 and s["layout"]["dp_replicate"] == 2
    assert len(s["metrics"]["peak_memory_bytes_per_rank"]) == 2 and all(s["metrics"]["peak_memory_bytes_per_rank"])
    assert dp.metrics() == pytest.approx(single.metrics(), rel=1e-5)
    assert s["metrics"]["val_loss"] == pytest.approx(single.summary["metrics"]["val_loss"], rel=1e-5)


def test_nan_on_every_rank_is_nan(trial):
    run = trial(
        "model=tiny",
        "optim.lr=1e8",
        "optim.warmup_steps=0",
        "trial.max_steps=20",
        "parallel.dp_replicate=2",
        "training.micro_batch_size=4",
    )
    assert run.code == 12, run.output
    assert run.summary["status"] == "nan" and run.summary["steps"] < 20


def test_kill_9_of_a_worker_is_an_error_naming_the_rank(tmp_path):
    run = kill_rank_mid_run(tmp_path / "killed", 1, "parallel.dp_replicate=2", "training.micro_batch_size=4")
    assert run.code == 1, run.output
    s = run.summary
    assert_summary_schema(s)
    assert s["status"] == "error" and s["error"]["rank"] == 1 and "SIGKILL" in s["reason"]
    assert s["steps"] >= 2  # what finished is not lost
