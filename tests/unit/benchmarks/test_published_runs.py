"""The published runs the step-time model is checked against (``benchmarks/data/published_runs.yaml``) against
their own schema, and the comparisons ``benchmarks/perf_model.py`` draws from them: which rows ran FP8, and which
pairs differ in one thing only."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
from perf_model import _pairs, _precision_pairs, load, overrides, precision, skip_reason  # noqa: E402

DATA = yaml.safe_load((ROOT / "benchmarks" / "data" / "published_runs.yaml").read_text())
FIELDS = {
    "id", "source", "table", "verification", "model", "device", "gpus", "gpus_per_node", "layout", "seq_len",
    "global_batch_sequences", "micro_batch_size", "precision", "activation_checkpointing", "flags", "measured",
    "derived_fields", "notes",
}  # fmt: skip
DEGREES = ("dp_replicate", "dp_shard", "tp", "pp", "cp")


@pytest.mark.parametrize("row", DATA["runs"], ids=lambda r: r["id"])
def test_every_row_is_whole_and_its_layout_fills_its_gpus(row):
    assert FIELDS <= set(row) <= FIELDS | {"config_source"}
    assert row["source"] in DATA["sources"] and row.get("config_source", row["source"]) in DATA["sources"]
    assert row["precision"] in ("fp32", "bf16", "fp16", "fp8", None)
    lay = row["layout"]
    assert math.prod(lay[k] for k in DEGREES) == row["gpus"]
    if lay.get("pp_layers"):  # an uneven split: every (virtual) stage, every layer
        assert len(lay["pp_layers"]) == lay["pp"] * (lay["pp_virtual"] or 1)
        assert sum(lay["pp_layers"]) == row["model"]["n_layers"] and min(lay["pp_layers"][1:-1]) >= 1
        assert min(lay["pp_layers"]) >= 0  # the first and last may hold the embedding, or the loss, alone
    if lay["ep"] > 1:
        assert row["model"]["n_experts"] % lay["ep"] == 0
    figures = ("tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu")
    assert any(row["measured"].get(k) is not None for k in figures)


def test_the_ids_are_unique():
    ids = [r["id"] for r in DATA["runs"]]
    assert len(ids) == len(set(ids))


def _row(**changes) -> dict:
    row = {
        "id": "a",
        "source": "megatron-bridge-perf",
        "table": "Release '26.04 NeMo Container', System DGX-H100",
        "gpus": 16,
        "seq_len": 4096,
        "device": "h100-sxm",
        "model": {"name": "m"},
        "layout": {"tp": 1, "pp": 2},
        "global_batch_sequences": 1024,
        "micro_batch_size": 1,
        "activation_checkpointing": None,
        "precision": "bf16",
        "flags": ["ddp"],
        "measured": {"tokens_per_sec_per_gpu": 100.0},
    }
    return copy.deepcopy({**row, **changes})


def test_fp8_is_read_from_the_precision_a_float8_flag_or_an_fp8_label():
    assert precision(_row()) == "bf16" and precision(_row(precision="fp16")) == "bf16"
    assert precision(_row(precision="fp8")) == "fp8"
    assert precision(_row(flags=["torch.compile", "float8_linear"])) == "fp8"
    assert precision(_row(flags=["precision_label=FP8-CS"])) == "fp8"


def test_a_zoo_row_is_read_as_its_megatron_arguments_say():
    """The MoE model zoo's A8 as its flags say it ran: the distributed optimizer is ZeRO-1 over all 8 data-parallel
    ranks (not 8 FSDP ranks, nor replicas), bf16 gradients reduced in fp32 (no cluster.reduce_precision=bf16),
    DeepEP's per-node dispatch; the same row without those flags is read as before."""
    row = next(r for r in DATA["runs"] if r["id"] == "mcore-zoo-qwen3-235b-bf16-tp4-ep8-pp8-vpp4-a8")
    got = overrides(row, None)
    assert {"parallel.dp_shard=8", "parallel.dp_replicate=1", "parallel.dp_shard_strategy=optim"} <= set(got)
    assert "cluster.ep_dedup=true" in got and "cluster.reduce_precision=bf16" not in got
    plain = overrides({**row, "flags": ["etp=1"]}, None)
    assert "parallel.dp_shard=8" in plain and "cluster.reduce_precision=bf16" in plain  # read as FSDP, as before
    assert not any(o.startswith(("parallel.dp_shard_strategy", "cluster.ep_dedup")) for o in plain)


def test_a_zoo_rows_selective_recompute_is_the_modules_it_printed():
    """A4 prints its recompute as "norm, act" (--recompute-modules layernorm moe_act); a Megatron row that says only
    selective takes Megatron's default, core_attn; torchtitan's selective is its own."""
    row = next(r for r in DATA["runs"] if r["id"] == "mcore-zoo-qwen3-235b-bf16-tp2-ep32-pp8-vpp4-a4")
    assert "memory.recompute_modules=[layernorm,moe_act]" in overrides(row, None)
    flags = [f for f in row["flags"] if f != "recompute_norm_act"]
    assert "memory.recompute_modules=[core_attn]" in overrides({**row, "flags": flags}, None)
    titan = next(r for r in DATA["runs"] if r["source"].startswith("torchtitan") and r["activation_checkpointing"])
    assert not any(o.startswith("memory.recompute_modules") for o in overrides(titan, None))


def test_a_mindformers_row_keeps_its_weights_in_the_dtype_its_config_sets():
    """MindFormers' param_init_type (recorded from each row's config): 16-bit weights are held without fp32 masters,
    their gradients reduced in 16 bits; fp32 weights keep the default count, as every other stack's rows do. Every
    MindFormers row records it, and is read with what MindFormers' selective recompute keeps."""
    by_id = {r["id"]: r for r in DATA["runs"]}
    sixteen = overrides(by_id["ms-llama2-70b-bf16-mp4-pp8-32npu-800ta2"], None)
    assert {"cluster.master_weights=false", "cluster.reduce_precision=bf16"} <= set(sixteen)
    load(sixteen)  # the rules accept the pair
    fp32 = overrides(by_id["ms-llama3-70b-finetune-mp8-pp8-900a2"], None)
    assert not any(o.startswith(("cluster.master_weights", "cluster.reduce_precision")) for o in fp32)
    # and each is read with MindFormers' select (comm) recompute
    assert "cluster.saved_activations=mindformers" in sixteen and "cluster.saved_activations=mindformers" in fp32
    for row in DATA["runs"]:
        if row["source"].startswith("mindformers"):
            assert sum(f.startswith("param_init_type=") for f in row["flags"]) == 1, row["id"]


def test_a_mindformers_row_recomputes_each_stage_as_its_config_counts():
    """MindFormers' per-stage select_recompute (recorded from each 70B row's config) is read as the core's count per
    stage, a valid config; the counts fall from the first stage, which holds the most micro-batches in flight."""
    counted = [r for r in DATA["runs"] if any(f.startswith("select_recompute=") for f in r["flags"])]
    assert len(counted) == 5
    for row in counted:
        cfg = load(overrides(row, None))
        counts = cfg.memory.recompute_stage_layers
        assert len(counts) == row["layout"]["pp"] and counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
        assert cfg.memory.recompute == "selective" and cfg.memory.recompute_layers is None
    by_id = {r["id"]: r for r in DATA["runs"]}
    assert "memory.recompute_stage_layers=[10,8,6,4,2,0,0,0]" in overrides(
        by_id["ms-llama3-70b-finetune-mp8-pp8-900a2"], None
    )


def test_a_torchtitan_row_takes_its_logits_through_its_releases_loss():
    """torchtitan ran its loss eagerly in 2024 (train.py at 9dec370 turned its compile off) and compiled it under
    training.compile in 2025 (components/loss.py); other stacks keep the core's fused count."""
    by_id = {r["id"]: r for r in DATA["runs"]}
    assert "cluster.loss=eager" in overrides(by_id["tt-llama3.1-8b-fsdp-8gpu-compile-bf16"], None)
    trainy = by_id["tt-trainy-llama3.1-8b-fsdp-32gpu-h200-compile-fp8"]
    assert "cluster.loss=compiled" in overrides(trainy, None)
    assert "cluster.loss=eager" in overrides({**trainy, "flags": []}, None)  # not compiled without torch.compile
    megatron = by_id["mcore-zoo-qwen3-235b-bf16-tp4-ep8-pp8-vpp4-a8"]
    assert not any(o.startswith("cluster.loss") for o in overrides(megatron, None))


def test_torchtitans_hopper_rows_of_2024_12_to_2025_06_run_flashattention_2():
    """SDPA dispatched FlashAttention-2 on Hopper while cuDNN attention was opt-in (PyTorch 2.5.1 to 2.8): those
    sources' rows price the attention core at FA2's published H100 rates; Megatron's (Transformer Engine's cuDNN
    attention) and torchtitan's 2024-08 rows keep the matmul rate."""
    by_id = {r["id"]: r for r in DATA["runs"]}
    kernel = {"cluster.attention_tflops_fwd=335", "cluster.attention_tflops_bwd=322"}
    for row_id in ("tt-llama3.1-8b-fsdp1-cp8-8gpu-seq262144", "tt-trainy-llama3.1-8b-fsdp-32gpu-h200-compile-fp8"):
        assert kernel <= set(overrides(by_id[row_id], None)), row_id
    for row_id in ("tt2024-llama3.1-405b-fsdp16-tp8-128gpu-bf16", "mcore-2024-gpt-7.1b-tp2-pp1-dp48-96gpu"):
        assert not any(o.startswith("cluster.attention") for o in overrides(by_id[row_id], None)), row_id


def test_the_zoos_all_to_all_overlap_is_read_as_hidden_all_to_alls():
    """A5 ran Megatron's all-to-all overlap with 1F1B ("+1f1b overlap"); A4, the same layout, did not."""
    by_id = {r["id"]: r for r in DATA["runs"]}
    assert "cluster.overlap_ep=1.0" in overrides(by_id["mcore-zoo-qwen3-235b-bf16-tp2-ep32-pp8-vpp4-a5"], None)
    a4 = overrides(by_id["mcore-zoo-qwen3-235b-bf16-tp2-ep32-pp8-vpp4-a4"], None)
    assert not any(o.startswith("cluster.overlap_ep") for o in a4)


def test_a_megatron_bridge_row_with_context_parallelism_is_read_as_its_recipe_ran():
    """Llama 3.1 405B on 1024 H100 (TP 8, PP 8 x VP 8, CP 2, DP 8), flagged from its release's recipe: the
    distributed optimizer is ZeRO-1 over the 8 data-parallel ranks (masters and states sharded over them and the 2
    context-parallel ranks, weights whole), so the row is scored, TP traffic overlapped, bf16 gradients reduced in
    bf16. Without the distributed optimizer the core would shard the weights over cp as FSDP, which Megatron does
    not: the row is skipped, as before."""
    row = next(r for r in DATA["runs"] if r["id"] == "mbridge-26.06-l31-405b-pretrain-tp8-pp8-cp2-1024gpu")
    got = overrides(row, None)
    assert skip_reason(row) is None and row.get("config_source") == "megatron-bridge-recipes"
    assert {
        "parallel.dp_shard=8",
        "parallel.dp_replicate=1",
        "parallel.cp=2",
        "parallel.dp_shard_strategy=optim",
    } <= set(got)
    assert {"cluster.overlap_tp=1.0", "cluster.reduce_precision=bf16"} <= set(got)
    assert "Megatron keeps the weights whole" in skip_reason({**row, "flags": ["ddp", "phase=pretrain"]})


def test_a_row_that_does_not_say_whether_it_recomputed_is_read_with_the_least_that_fits():
    """SC'21 Table 2 states no recompute. GPT-3 175B under ZeRO-3 on 384 A100s, micro-batch 4 of 2,048 tokens, no
    model parallelism: by hand, a block keeps at least 32 h bytes a token without recompute (bf16: the norms' inputs
    and outputs 8 h, q, k, v and the attention output 8 h, the MLP's 3 F = 8 h wide tensors 16 h), over 96 blocks
    far more than the 80 GB the run had, so it is read with full recompute; the PTDP row (TP 8 x PP 12, micro-batch 1)
    fits without and is read so; a row that states its recompute keeps it."""
    zero3 = next(r for r in DATA["runs"] if r["id"] == "mlm-sc21-t2-gpt-175b-zero3-384gpu")
    ptdp = next(r for r in DATA["runs"] if r["id"] == "mlm-sc21-t2-gpt-175b-ptdp-384gpu")
    h, micro, seq, layers = zero3["model"]["d_model"], zero3["micro_batch_size"], zero3["seq_len"], 96
    assert zero3["activation_checkpointing"] is None and 32 * h * micro * seq * layers > 80 * 2**30
    assert "memory.recompute=full" in overrides(zero3, None)
    assert "memory.recompute=none" in overrides(ptdp, None)
    assert "memory.recompute=none" in overrides({**zero3, "activation_checkpointing": "none"}, None)


def test_layout_pairs_stay_within_one_release():
    """The same layout moved 1.77x between two Megatron-Bridge containers: rows of two releases are no pair."""
    a = _row()
    b = _row(id="b", layout={"tp": 1, "pp": 1}, measured={"tokens_per_sec_per_gpu": 200.0})
    c = _row(id="c", layout={"tp": 1, "pp": 1}, table="Release '26.02 NeMo Container', System DGX-H100")
    c["measured"]["tokens_per_sec_per_gpu"] = 300.0
    results = {"a": 1.0, "b": 2.0, "c": 0.5}
    assert _pairs([a, b, c], results) == [("a", "b", 100.0, 200.0, True, "")]


def test_a_pair_says_what_differs_besides_its_layout():
    """The issue's criterion: rows that differ in their layout and nothing else. A sharding strategy is layout; an
    expert dispatcher, an overlap option or the recompute stated is not."""
    a = _row(flags=["ddp", "deepep"], activation_checkpointing="selective")
    b = _row(id="b", layout={"tp": 1, "pp": 1}, flags=["distributed_optimizer", "ddp", "deepep"])
    b["activation_checkpointing"], b["measured"] = "selective", {"tokens_per_sec_per_gpu": 200.0}
    c = _row(id="c", layout={"tp": 4, "pp": 1}, flags=["ddp", "a2a", "ep_a2a_1f1b_overlap"])
    c["activation_checkpointing"], c["measured"] = "full", {"tokens_per_sec_per_gpu": 50.0}
    d = _row(id="d", layout={"tp": 8, "pp": 1}, flags=["ddp", "deepep"], activation_checkpointing="selective")
    d["global_batch_sequences"], d["measured"] = 512, {"tokens_per_sec_per_gpu": 300.0}
    assert _pairs([a, d], {"a": 1.0, "d": 2.0})[0][-1] == "global batch 1024 / 512"
    got = _pairs([a, b, c], {"a": 1.0, "b": 2.0, "c": 3.0})
    assert got == [
        ("a", "b", 100.0, 200.0, True, ""),
        ("a", "c", 100.0, 50.0, False, "recompute selective / full; options deepep / a2a, ep_a2a_1f1b_overlap"),
        ("b", "c", 200.0, 50.0, False, "recompute selective / full; options deepep / a2a, ep_a2a_1f1b_overlap"),
    ]


def test_precision_pairs_differ_in_fp8_alone():
    bf16 = _row()
    fp8 = _row(id="f", flags=["ddp", "precision_label=FP8"], measured={"tokens_per_sec_per_gpu": 150.0})
    other = _row(id="o", flags=["ddp", "async_tp", "float8_linear"], measured={"tokens_per_sec_per_gpu": 180.0})
    results = {"a": 1.0, "f": 1.4, "o": 2.0}
    assert _precision_pairs([bf16, fp8, other], results) == [("a", "f", 1.5, 1.4)]
