"""One real trial per exit code of DESIGN §3.3, through the CLI as the agent runs it."""

import re
import time

import pytest

from core.config import load_config
from core.model import flops_per_token
from tests.schema import assert_summary_schema

pytestmark = pytest.mark.slow


def test_ok_trial_writes_everything(trial):
    run = trial("model=tiny", "trial.max_steps=5", "training.eval_interval=2")
    assert run.code == 0, run.output
    s = run.summary
    assert_summary_schema(s)
    assert (s["status"], s["steps"], s["max_steps"], s["tokens"]) == ("ok", 5, 5, 5 * 8 * 64)
    m = s["metrics"]
    assert m["tokens_per_sec"] > 0 and m["step_time_ms_median"] > 0 and 0 < m["mfu"] < 1
    assert m["peak_memory_bytes"] > 100 * 2**20  # measured VmHWM, MindSpore alone is hundreds of MiB
    assert m["val_loss"] is not None and m["final_loss"] == run.metrics()[-1]
    assert run.metrics("step") == [1, 2, 2, 3, 4, 4, 5, 5]  # five steps, validation at 2, 4 and the end
    assert len(run.metrics("val_loss")) == 3
    assert (run.dir / "config.yaml").exists() and (run.dir / "train.log").exists()
    assert s["config"]["model"]["name"] == "tiny" and s["layout"]["world_size"] == 1
    phases = s["startup_phases_sec"]  # process start to the first finished step, every phase, in order
    assert list(phases) == ["launch", "imports", "cluster", "build", "first_step"], phases
    assert sum(phases.values()) == pytest.approx(s["startup_sec"], abs=0.01)
    assert m["reference_flops_per_sec"] > 1e9  # MFU's fixed denominator, this machine's (core.reference_rate)
    per_token = flops_per_token(load_config(["model=tiny"]).model, 64)
    assert m["mfu"] == pytest.approx(m["tokens_per_sec"] * per_token / m["reference_flops_per_sec"])


def test_training_reduces_the_loss(trial):
    run = trial("model=tiny", "trial.max_steps=30", "optim.lr=1e-2")
    losses = run.metrics()
    # Byte-level text: untrained ~ln(256)=5.5; a few dozen steps learn the byte distribution (< 3.5).
    assert losses[0] > 5.0 and min(losses[-5:]) < 3.5, losses


def test_huge_lr_is_nan_and_stops_there(trial):
    run = trial("model=tiny", "optim.lr=1e8", "optim.warmup_steps=0", "trial.max_steps=20")
    assert run.code == 12, run.output
    s = run.summary
    assert_summary_schema(s)
    assert s["status"] == "nan" and s["steps"] < 20 and "optim.lr" in s["reason"]


def test_invalid_config_names_the_field(trial):
    run = trial("model=tiny", "model.not_a_key=1", "trial.max_steps=2")
    assert run.code == 2
    s = run.summary
    assert s["status"] == "invalid" and "model.not_a_key" in s["reason"] and s["steps"] == 0


def test_cross_field_violation_is_invalid(trial):
    run = trial("model=tiny", "training.micro_batch_size=3")
    assert run.code == 2 and "training.global_batch_size" in run.summary["reason"]


def test_tiny_memory_limit_is_oom_with_a_summary(trial):
    run = trial("model=small", "memory.limit_gb=0.3", "trial.max_steps=5")
    assert run.code == 10, run.output
    s = run.summary
    assert_summary_schema(s)
    assert s["status"] == "oom" and "memory.limit_gb" in s["reason"]
    assert s["metrics"]["peak_memory_bytes"] > 0.3 * 2**30


def test_roomy_memory_limit_does_not_fire(trial):
    run = trial("model=tiny", "memory.limit_gb=8", "trial.max_steps=3")
    assert run.code == 0, run.output


def _graphs_compiled(trial) -> None:
    """Compile model=tiny's graphs into this test's cache first: a wall budget then times steps, not how long the
    compiler takes on a machine that other tests load too (it took a 12 s budget whole once)."""
    run = trial("model=tiny", "trial.max_steps=2")
    assert run.code == 0 and run.summary["compile_cache"] == "compiled", run.output


def test_wall_budget_before_step_budget_is_timeout(trial):
    _graphs_compiled(trial)
    t0 = time.time()
    run = trial("model=tiny", "trial.max_steps=1000000", "trial.max_wall_time_sec=15", "trial.grace_sec=10")
    assert run.code == 13, run.output
    s = run.summary
    assert s["status"] == "timeout" and 0 < s["steps"] < 1000000 and s["compile_cache"] == "loaded"
    assert s["wall_time_sec"] <= 15 + 10 and time.time() - t0 <= 15 + 10 + 5


def test_wall_only_budget_used_in_full_is_ok(trial):
    _graphs_compiled(trial)
    run = trial("model=tiny", "trial.max_steps=null", "trial.max_wall_time_sec=15")
    assert run.code == 0, run.output
    assert run.summary["status"] == "ok" and run.summary["steps"] > 0


def test_same_seed_same_losses_and_accumulation_matches(trial):
    a = trial("model=tiny", "trial.max_steps=4")
    b = trial("model=tiny", "trial.max_steps=4")
    c = trial("model=tiny", "trial.max_steps=4", "training.micro_batch_size=2")  # 4 micro-batches per step
    assert a.metrics() == b.metrics()
    assert c.metrics() == pytest.approx(a.metrics(), rel=1e-5)


def test_resume_continues_exactly(trial):
    straight = trial("model=tiny", "optim=muon", "trial.max_steps=10", "checkpoint.interval=5")
    assert straight.code == 0, straight.output
    ckpt = straight.dir / "checkpoints" / "step_00000005"
    assert ckpt.exists()
    resumed = trial("model=tiny", "optim=muon", "trial.max_steps=10", f"checkpoint.resume={ckpt}")
    assert resumed.code == 0, resumed.output
    assert resumed.metrics() == straight.metrics()[5:]
    assert resumed.summary["steps"] == 10


def test_attention_logits_past_the_limit_stop_the_trial_as_nan(trial):
    """training.max_attention_logit: the tiny model's logits start near 0.3 (each step's is in metrics.jsonl), so a
    limit of 0.05 stops the first step, and the summary says which check stopped it."""
    run = trial("model=tiny", "training.max_attention_logit=0.05", "trial.max_steps=5")
    assert run.code == 12, run.output
    s = run.summary
    assert_summary_schema(s)
    assert s["status"] == "nan" and s["steps"] == 0 and "training.max_attention_logit=0.05" in s["reason"]
    assert re.search(r"reached [0-9.]+ in layers\.[0-2] at step 1", s["reason"]), s["reason"]
