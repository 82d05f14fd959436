"""Every mesh layout, run by real worker processes, reproduces the 1-process run with the same global batch and
seed: per-step losses, validation loss, and (after consolidating the sharded checkpoint) final parameters; each
layout with AdamW, Muon or both (``CASES``). Plus: FSDP divides the per-rank state and ZeRO-1 its optimizer's, a
run moves between layouts through a checkpoint, a layout that does not fit the cluster exits 2, and a rank killed mid-run is named in the
summary."""

from __future__ import annotations

import json

import numpy as np
import pytest

from core import ckpt as ck
from tests.integration.conftest import TrialRun, assert_same_run, final_params, kill_rank_mid_run, run_trial
from tests.schema import assert_summary_schema

pytestmark = pytest.mark.slow

STEPS = 10
ZERO1 = "parallel.dp_shard_strategy=optim"
BASE = ("model=tiny", "seed=5", f"trial.max_steps={STEPS}", "checkpoint.interval=5")
LAYOUTS = {
    "dp_shard=2": ("parallel.dp_shard=2",),
    "hsdp 2x2": ("parallel.dp_replicate=2", "parallel.dp_shard=2"),
    "tp=2": ("parallel.tp=2",),
    "tp=2 sp": ("parallel.tp=2", "parallel.sp=true"),
    "cp=2": ("parallel.cp=2",),
    "tp=2 dp_shard=2": ("parallel.tp=2", "parallel.dp_shard=2"),
    "cp=2 tp=2": ("parallel.cp=2", "parallel.tp=2"),
    # ZeRO-1 (core.parallel.zero1): weights whole, masters and optimizer states sharded over dp_shard x cp
    "zero1 dp_shard=2": ("parallel.dp_shard=2", ZERO1),
}
# tiny ties its head to the embedding; small and medium do not. The tp x dp_shard case runs an untied head (and so
# does its 1-process reference): split by vocabulary rows under TP, sharded by FSDP, gathered whole by Muon.
UNTIED = "model.tie_embeddings=false"
MODEL = {"tp=2 dp_shard=2": (UNTIED,), "zero1 dp_shard=3 padded": ("training.global_batch_size=6",)}
# With recompute and in PyNative (the same numbers as jit: the 1-process reference serves both), AdamW only.
VARIANTS = {
    "dp_shard=2 recompute pynative": ("parallel.dp_shard=2", "memory.recompute=full", "training.mode=pynative"),
    "tp=2 dp_shard=2 recompute": ("parallel.tp=2", "parallel.dp_shard=2", "memory.recompute=full"),
    "dp_shard=4": ("parallel.dp_shard=4",),
    # two micro-batches a rank: the gradients summed whole, reduce-scattered once; context parallel ranks shard too
    "zero1 cp=2 accumulating": ("parallel.cp=2", ZERO1, "training.micro_batch_size=2"),
    # three shards: tiny's norms, attention weights and embedding padded to a multiple of 3 (its MLP's 384 columns
    # divide): the cut after each gather, the zeros before each reduce-scatter, which FSDP's ops do with the same
    # two functions (core.parallel.fsdp; checked: cutting the wrong end fails this test)
    "zero1 dp_shard=3 padded": ("parallel.dp_shard=3", ZERO1),
}
_RUNS: dict = {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, warm):
    """Trials by (layout, optimizer), each run once for the whole module (later tests reuse them)."""
    root = tmp_path_factory.mktemp("mesh")

    def get(layout: str, optim: str, *extra: str) -> TrialRun:
        key = (layout, optim, extra)
        if key not in _RUNS:
            overrides = {**LAYOUTS, **VARIANTS}.get(layout, ())
            name = f"{layout}-{optim}-{len(_RUNS)}".replace(" ", "_").replace("=", "")
            _RUNS[key] = run_trial(root / name, *BASE, f"optim={optim}", *overrides, *extra, timeout=900, env=warm)
        return _RUNS[key]

    yield get
    _RUNS.clear()


# Each layout with the optimizer whose path it exercises, both on the axes that place parameters differently
# (dp_shard, tp): Muon orthogonalises whole matrices gathered from their shards, AdamW is element-wise and holds
# two states per shard. SP and CP alone place parameters as FSDP and tp do (AdamW suffices); the combined axes
# run Muon, the harder path (AdamW runs tp x dp_shard in VARIANTS). Running every pair would add ~4 CI minutes
# and no path.
CASES = [
    ("dp_shard=2", "adamw"),
    ("dp_shard=2", "muon"),
    ("hsdp 2x2", "muon"),
    ("tp=2", "adamw"),
    ("tp=2", "muon"),
    ("tp=2 sp", "adamw"),
    ("cp=2", "adamw"),
    ("tp=2 dp_shard=2", "muon"),
    ("cp=2 tp=2", "muon"),
    ("zero1 dp_shard=2", "adamw"),
    ("zero1 dp_shard=2", "muon"),
]


@pytest.mark.parametrize("layout, optim", CASES + [(variant, "adamw") for variant in VARIANTS])
def test_layout_reproduces_the_single_process_run(runs, layout, optim):
    model = MODEL.get(layout, ())
    ref, run = runs("single", optim, *model), runs(layout, optim, *model)
    assert ref.code == 0, ref.output
    assert run.code == 0, run.output + "".join(p.read_text()[-2000:] for p in (run.dir / "logs").glob("rank_*.log"))
    s = run.summary
    assert_summary_schema(s)
    degrees = dict(o.split("=") for o in {**LAYOUTS, **VARIANTS}[layout])
    for key, value in degrees.items():
        if key.startswith("parallel.") and value.isdigit():
            assert s["layout"][key.split(".")[1]] == int(value)
    assert s["layout"]["world_size"] == len(s["metrics"]["peak_memory_bytes_per_rank"])
    assert_same_run(run, ref, STEPS)
    if UNTIED in model:
        assert "model.lm_head.weight" in final_params(run, STEPS)


# Qwen's attention (q/k/v biases, Qwen2; QK-norm, Qwen3; heads wider than d_model / n_heads, Qwen3's small
# models) on the layouts that place them differently: biases split with their column-parallel weights (tp) and
# gathered by FSDP (dp_shard, cp); QK-norm's gains replicated over tp while each rank normalises its own heads, so
# their gradients are summed over tp, with or without SP.
QWEN = ("model.attn_bias=true", "model.qk_norm=true", "model.head_dim=48")


@pytest.mark.parametrize("layout", ["tp=2", "tp=2 sp", "dp_shard=2", "cp=2"])
def test_qwen_attention_reproduces_the_single_process_run(runs, layout):
    ref, run = runs("single", "adamw", *QWEN), runs(layout, "adamw", *QWEN)
    assert ref.code == 0, ref.output
    assert run.code == 0, run.output + "".join(p.read_text()[-2000:] for p in (run.dir / "logs").glob("rank_*.log"))
    assert_same_run(run, ref, STEPS)
    params = final_params(ref, STEPS)
    assert {"model.layers.0.attn.wk.bias.weight", "model.layers.2.attn.q_norm.weight"} <= set(params)
    assert np.abs(params["model.layers.0.attn.wk.bias.weight"]).max() > 0  # trained away from its zero init


def _state(run: TrialRun, rank: int | None = None) -> int:
    s = run.summary
    b = s["metrics"]["state_bytes"] if rank is None else s["ranks"][rank]["state_bytes"]
    return b["params"] + b["grads"] + b["optimizer"]


@pytest.mark.parametrize("optim, n", [("adamw", 2), ("muon", 2), ("adamw", 4)])
def test_fsdp_divides_parameters_gradients_and_optimizer_state(runs, optim, n):
    single, sharded = runs("single", optim), runs(f"dp_shard={n}", optim)
    assert sharded.code == 0, sharded.output
    n_tensors = 3 * 9 + 2  # tiny: 3 blocks of 9 weights, the embedding (tied head) and the final norm
    states = 2  # AdamW's m and v (Muon's one momentum buffer holds less)
    # Stated remainder: each tensor's padding to a multiple of n (< n floats) in the weight, its gradient and its
    # states, and the optimizer's step counter (8 bytes), which every rank keeps whole.
    remainder = n_tensors * (2 + states) * (n - 1) * 4 + 8
    for rank in range(n):
        assert _state(sharded, rank) <= _state(single) / n + remainder
    # and not trivially: the ranks together hold at least the whole model
    assert sum(_state(sharded, rank) for rank in range(n)) >= _state(single)


def test_zero1_divides_the_optimizer_state_and_keeps_weights_and_gradients_whole(runs):
    single, zero1 = runs("single", "adamw"), runs("zero1 dp_shard=2", "adamw")
    assert zero1.code == 0, zero1.output
    whole = single.summary["metrics"]["state_bytes"]
    remainder = (3 * 9 + 2) * (2 + 2) * 4 + 8  # padding to a multiple of 2 (masters, AdamW's states), the counter
    for rank in range(2):
        held = zero1.summary["ranks"][rank]["state_bytes"]
        assert held["grads"] == whole["grads"]
        # the weights whole, beside their masters: half of them, padded
        assert whole["params"] + whole["params"] / 2 <= held["params"] <= whole["params"] * 1.5 + remainder
        assert whole["optimizer"] / 2 <= held["optimizer"] <= whole["optimizer"] / 2 + remainder


def test_resume_on_any_layout_continues_exactly(runs, tmp_path, warm):
    ref = runs("single", "adamw")
    # a sharded checkpoint (tp=2) resumed on ZeRO-1, whose masters are FSDP's shards and whose whole weights must be
    # gathered from them, and the 1-process checkpoint resumed on context parallelism (resuming on its own layout
    # is the same path: the checkpoint is consolidated, then sharded for the target)
    for i, (source, target) in enumerate((("tp=2", LAYOUTS["zero1 dp_shard=2"]), ("single", ("parallel.cp=2",)))):
        saved = runs(source, "adamw")
        step5 = saved.dir / "checkpoints" / "step_00000005"
        assert (step5 / ("index.json" if source != "single" else ck.FILENAME)).exists()
        run = run_trial(
            tmp_path / f"resumed{i}", *BASE, "optim=adamw", *target, f"checkpoint.resume={step5}", timeout=900, env=warm
        )
        assert run.code == 0, run.output
        assert_same_run(run, ref, STEPS, first_step=6)


def test_degrees_that_do_not_fit_the_cluster_exit_2(tmp_path):
    """Workers started by msrun (or a supervisor) for 2 ranks, with degrees that multiply to 4."""
    from core.runtime.ranks import run_ranks

    trial_dir = tmp_path / "misfit"
    ranks = run_ranks(
        2,
        "-m",
        "core.train",
        "model=tiny",
        "parallel.dp_shard=4",
        "trial.max_steps=2",
        f"trial.dir={trial_dir}",
        log_dir=tmp_path / "logs",
        timeout=300,
    )
    assert [code for code, _ in ranks] == [2, 2], ranks
    report = json.loads((trial_dir / "ranks" / "rank_0.json").read_text())
    assert report["status"] == "invalid" and "multiply to 4" in report["reason"] and "has 2" in report["reason"]


def test_tp_that_does_not_divide_the_heads_exits_2_before_any_work(tmp_path):
    run = run_trial(tmp_path / "tp3", "model=tiny", "parallel.tp=3", "trial.max_steps=2")
    assert run.code == 2
    s = run.summary
    assert s["status"] == "invalid" and s["error"]["field"] == "parallel.tp"
    assert "n_heads=4" in s["reason"] and not (tmp_path / "tp3" / "logs").exists()  # no rank was started


def test_kill_9_of_a_tensor_parallel_rank_names_it(tmp_path):
    """Its peer waits in a tensor-parallel collective of every block (not only the gradient all-reduce of data
    parallelism, tests/integration/test_data_parallel.py): the supervisor still ends the trial and names the rank."""
    run = kill_rank_mid_run(tmp_path / "killed", 1, "parallel.tp=2")
    assert run.code == 1, run.output
    s = run.summary
    assert_summary_schema(s)
    assert s["status"] == "error" and s["error"]["rank"] == 1 and "SIGKILL" in s["reason"]
    assert s["steps"] >= 2 and len(s["ranks"]) == 2
