"""autoresearch.export: which trial, its resolved config, and the mappings onto MindFormers, torchtitan and the
core's own overrides (round trips, coverage of every parallel and memory key, pinned values)."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import optuna
import pytest
import yaml

from autoresearch import export
from autoresearch.export.__main__ import main as export_main
from autoresearch.export.recipe import recipe_text
from autoresearch.export.targets import TARGETS, canonical, export_config, flatten, import_config, unflatten
from autoresearch.export.targets.mindformers import RECOMPUTE as MINDFORMERS_RECOMPUTE
from autoresearch.export.targets.rules import NoCounterpart, same
from autoresearch.study.storage import load_study
from core.config import MemoryConfig, ParallelConfig, load_config, to_dict
from tests.agent_support import run_agent
from tests.unit.autoresearch.export.stand_in import recipe_fields

MBS, REC, LR = "training.micro_batch_size", "memory.recompute", "optim.lr"
HF = Path(__file__).resolve().parents[4] / "search_spaces" / "hf"  # the shipped HF configs
LAST = ["norm", "lm_head"]  # what torchtitan's last stage ends with


def core_space(tmp_path, name="exp", lrs=(0.001, 0.1)):
    """A space of the core's own keys only (no fake.* knobs), so that its overrides compose with core.config."""
    doc = {
        "name": name,
        "objective": {"metric": "tokens_per_sec", "direction": "maximize"},
        "world_size": 1,
        "fixed": {"model": "tiny", "training.seq_len": 64, "trial.max_steps": 2},
        "params": {
            MBS: {"type": "choice", "values": [4, 8]},
            REC: {"type": "choice", "values": ["full", "none"]},
            LR: {"type": "choice", "values": list(lrs)},
        },
        "baseline": {LR: lrs[0]},  # the core's default learning rate is not among them
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def fake_study(tmp_path_factory):
    """Every grid point on the fake trial: mbs 8 / no recompute / lr 0.001 is fastest; lr 0.1 ends in NaN."""
    tmp = tmp_path_factory.mktemp("export")
    assert run_agent(tmp, core_space(tmp), "--proposer", "grid", "--no-learn") == 0
    return tmp / "trials" / "exp"


def load(study_dir) -> optuna.Study:
    return load_study(study_dir)


def flat(*overrides: str) -> dict:
    return flatten(to_dict(load_config(list(overrides))))


# --- which trial and its config -------------------------------------------------------------------------------


def test_the_winner_is_the_best_ok_trial(fake_study):
    study = load(fake_study)
    best = export.pick_trial(study)
    ok = [t for t in study.trials if t.user_attrs.get("status") == "ok"]
    assert best.number == max(ok, key=lambda t: t.value).number
    assert best.params == {MBS: 8, REC: "none", LR: 0.001}


def test_a_trial_that_did_not_run_ok_or_does_not_exist_is_refused(fake_study, tmp_path):
    study = load(fake_study)
    nan = next(t for t in study.trials if t.user_attrs.get("status") == "nan")
    with pytest.raises(export.ExportError, match=rf"trial {nan.number} did not run ok \(status nan"):
        export.pick_trial(study, nan.number)
    with pytest.raises(export.ExportError, match=r"--trial 999: .* has no such trial \(trials 0\.\.7\)"):
        export.pick_trial(study, 999)
    assert run_agent(tmp_path, core_space(tmp_path, "allnan", lrs=(0.1,)), "--proposer", "grid", "--no-learn") == 0
    with pytest.raises(export.ExportError, match=r"'allnan' has no feasible trial .*4 nan"):
        export.pick_trial(load(tmp_path / "trials" / "allnan"))
    assert export_main([str(tmp_path / "trials" / "allnan"), "--to", "mindformers"]) == 2


def test_the_config_comes_from_the_summary_else_the_space(fake_study):
    study = load(fake_study)
    best = export.pick_trial(study)
    expected = to_dict(
        load_config(
            ["model=tiny", "training.seq_len=64", "trial.max_steps=2", f"{MBS}=8", f"{REC}=none", f"{LR}=0.001"]
        )
    )
    # The fake trial's summary holds its raw key=value pairs, not the core's config: composed from its overrides.
    resolved = export.resolved_config(study, best)
    assert resolved.source.endswith("trial_summary.json (composed from its overrides)")
    assert resolved.config["trial"].pop("dir") == best.user_attrs["trial_dir"]
    assert resolved.config == {**expected, "trial": {k: v for k, v in expected["trial"].items() if k != "dir"}}
    # Without a summary, the study's space (its user attr space_path) and the trial's params give the same config.
    summary = fake_study / f"{best.number:04d}" / "trial_summary.json"
    kept = summary.read_text()
    summary.unlink()
    try:
        from_space = export.resolved_config(study, best)
    finally:
        summary.write_text(kept)
    assert from_space.source == f"the space {study.user_attrs['space_path']} with the trial's params"
    assert from_space.config == expected


def test_a_summary_with_the_core_config_is_used_as_it_is(fake_study, tmp_path):
    study = load(fake_study)
    best = export.pick_trial(study)
    summary_path = fake_study / f"{best.number:04d}" / "trial_summary.json"
    kept = summary_path.read_text()
    real = to_dict(load_config(["model=small", "parallel.tp=2", f"trial.dir={tmp_path}"]))
    summary_path.write_text(json.dumps({**json.loads(kept), "config": real}))
    try:
        resolved = export.resolved_config(study, best)
    finally:
        summary_path.write_text(kept)
    assert resolved.source.endswith("(its resolved config)") and resolved.config == real


# --- the outputs, end to end through the CLI --------------------------------------------------------------------


def test_every_target_writes_a_file_its_reader_parses(fake_study, tmp_path, capsys, monkeypatch):
    study = load(fake_study)
    best = export.pick_trial(study)
    cfg = flatten(export.resolved_config(study, best).config)
    for to in export.CHOICES:
        out = tmp_path / f"winner.{to}"
        assert export_main([str(fake_study), "--to", to, "--out", str(out)]) == 0
        text = out.read_text()
        head = [line for line in text.splitlines() if line.startswith("#")]
        body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
        if to == "overrides":  # the header goes to stderr: $(cat FILE) hands every word to core.train
            assert head == [] and "# not exported (a re-run writes its own" in capsys.readouterr().err
            lines = text.split()
            assert all("=" in line for line in lines)
            again = flatten(to_dict(load_config(lines)))
            assert {k: v for k, v in again.items() if k != "trial.dir"} == {
                k: v for k, v in cfg.items() if k != "trial.dir"
            }
            continue
        assert head[1] == (
            f"# exported by autoresearch.export from study 'exp', trial {best.number}: "
            f"tokens_per_sec = {best.value:.6g} (maximize)"
        )
        assert head[2].startswith("# config: ") and head[2].endswith("(composed from its overrides)")
        exported = export_config(TARGETS[to], cfg)
        if to == "torchtitan":  # a Python recipe: what its tuned() sets, run against the stand-in (stand_in.py)
            assert recipe_fields(text, monkeypatch) == flatten(exported.doc)
        else:
            assert yaml.safe_load(body) == exported.doc
        # every key the target has no counterpart for, with its value, under its reason; each reason said once
        said = " ".join(line[2:].strip() for line in head if not line.startswith(("# exported", "# config", "# stand")))
        reasons = list(dict.fromkeys(reason for _, reason in exported.dropped.values()))
        for reason in reasons:
            assert said.count(f"not exported ({reason}): ") == 1
            keys = [f"{k}={export.value_text(v)}" for k, (v, r) in exported.dropped.items() if r == reason]
            assert said.split(f"not exported ({reason}): ")[1].startswith(", ".join(keys))
        assert all(
            len(line) <= export.HEADER_WIDTH
            for line in head
            if line.startswith("# not exported") or line.startswith("#   ")
        )
        assert "model.n_layers=3" in said and "the model is the " in said  # the target run's, or the base's


def test_overrides_add_the_keys_a_preset_brings(tmp_path):
    cfg = to_dict(
        load_config(
            [
                "model=moe-tiny",
                "parallel.dp_shard=2",
                "parallel.ep=2",
                "parallel.pp_layers=[1,2]",
                "parallel.pp=2",
                "memory.swap_ops=null",
                f"trial.dir={tmp_path}",
            ]
        )
    )
    lines = export.to_overrides(cfg)
    assert (
        "model.n_experts=4" in lines
        and not any(x.startswith("+") for x in lines)
        and "model.n_layers=3" in lines
        and "parallel.pp_layers=[1,2]" in lines
    )
    assert "parallel.pp_schedule='1f1b'" in lines and not any(line.startswith("trial.dir") for line in lines)
    again = to_dict(load_config(lines))
    assert again["trial"].pop("dir") is None and cfg["trial"].pop("dir") == str(tmp_path)
    assert again == cfg
    cfg["data"]["train_path"] = "/data/my corpus.bin"
    with pytest.raises(export.ExportError, match="data.train_path=.* holds whitespace"):
        export.to_overrides(cfg)


# --- the mappings --------------------------------------------------------------------------------------------

CASES = {
    "defaults": [],
    "hsdp-tp-sp-cp-pp": [
        "model=small",
        "parallel.dp_replicate=2",
        "parallel.dp_shard=2",
        "parallel.tp=2",
        "parallel.sp=true",
        "parallel.cp=2",
        "parallel.pp=2",
        "training.global_batch_size=16",
        "training.micro_batch_size=1",
        "memory.recompute=full",
        "memory.recompute_layers=1",
        "parallel.pp_schedule=gpipe",
        "optim.grad_clip=0.5",
        "memory.limit_gb=12.5",
    ],
    "interleaved-uneven": [
        "model=small",
        "model.n_layers=6",
        "parallel.pp=2",
        "parallel.pp_virtual=2",
        "parallel.pp_schedule=interleaved",
        "parallel.pp_layers=[2,1,1,2]",
        "training.micro_batch_size=2",
        "memory.recompute_stages=[full,none,selective,none]",
        "memory.recompute_layers=1",
        "training.mode=pynative",
        "optim=muon",
        "optim.schedule=wsd",
        "optim.decay_ratio=0.3",
        "optim.momentum=0.9",
        "optim.ns_steps=4",
    ],
    "offset-constant": [
        "model=small",
        "parallel.pp=2",
        "parallel.pp_offset=1",
        "optim.schedule=constant",
        "optim.grad_clip=0",
        "memory.recompute=selective",
        "training.mode=pynative",
        "seed=7",
    ],
    "per-stage-counts": [  # MindFormers' per-stage select_recompute, as its 70B configs set it
        "model=small",
        "model.n_layers=8",
        "parallel.pp=4",
        "training.micro_batch_size=2",
        "memory.recompute=selective",
        "memory.recompute_stage_layers=[2,1,1,0]",
        "training.mode=pynative",
    ],
    "swap": [
        "model=tiny",
        "training.mode=pynative",
        "memory.swap=true",
        "memory.swap_layers=2",
        "memory.swap_ops=[attention,norm]",
        "optim.schedule=linear",
        "optim.min_lr_ratio=0.05",
    ],
    "swap-all": [
        "model=tiny",
        "training.mode=pynative",
        "memory.swap=true",
        "optim.lr=0.0007",
        "optim.warmup_steps=3",
        "optim.beta2=0.99",
        "optim.eps=1e-6",
        "optim.weight_decay=0.05",
    ],
    "tp-no-sp-full-wsd": [
        "model=small",
        "parallel.tp=2",
        "parallel.sp=false",
        "memory.recompute=full",
        "optim.schedule=wsd",
        "optim.decay_ratio=0.25",
        "optim.min_lr_ratio=0.0",
    ],
    "interleaved-one-virtual": [
        "model=small",
        "parallel.pp=2",
        "parallel.pp_schedule=interleaved",
        "training.micro_batch_size=2",
    ],
    # HF-imported models: the shape goes with the winner (MindFormers' model_config and moe_config)
    "hf-deepseek": [
        f"model=hf:{HF}/deepseek-tiny",
        "parallel.dp_shard=2",
        "parallel.ep=2",
        "model.moe_bias_update_rate=0.001",
        "model.mtp_loss_weight=0.1",
        "model.moe_capacity_factor=1.25",
    ],
    "hf-deepseek-yarn": [  # DeepSeek's convention: mscale = mscale_all_dim, cos and sin unscaled
        f"model=hf:{HF}/deepseek-tiny",
        "model.rope_scaling=yarn",
        "model.rope_factor=4",
        "model.rope_original_max_len=64",
        "model.rope_mscale_all_dim=1.0",
        "model.rope_attention_factor=1.0",
    ],
    "hf-qwen3": [f"model=hf:{HF}/qwen3-tiny", "parallel.tp=2", "parallel.sp=true"],
    "hf-deepseek-bf16": [f"model=hf:{HF}/deepseek-tiny", "training.precision=bf16", "device=Ascend"],
    "hf-qwen3-yarn": [  # YaRN's default cos and sin factor, 0.1 ln 4 + 1 (no softmax factor on GQA)
        f"model=hf:{HF}/qwen3-tiny",
        "model.rope_scaling=yarn",
        "model.rope_factor=4",
        "model.rope_original_max_len=64",
    ],
    "hf-llama3-rope": [  # Llama 3.1's RoPE scaling, on a small HF config
        f"model=hf:{HF}/qwen3-tiny",
        "model.rope_scaling=llama3",
        "model.rope_factor=8",
        "model.rope_original_max_len=64",
        "model.rope_low_freq_factor=1",
        "model.rope_high_freq_factor=4",
    ],
    "moe-ep": [
        "model=moe-tiny",
        "parallel.dp_shard=2",
        "parallel.ep=2",
        "training.seq_len=128",
        "execution.jit_level=O1",
        "execution.graph_kernel_fusion=true",
        "device=Ascend",
    ],
}


def written_and_read(target: str, doc: dict, monkeypatch) -> dict:
    """A target's document through its file: the YAML parsed, the recipe run (on the stand-in) and read back."""
    if target == "torchtitan":
        return unflatten(recipe_fields(recipe_text(doc, []), monkeypatch))
    return yaml.safe_load(export.yaml_text(doc))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES)
def test_round_trip_gives_back_every_key_the_target_carries(target, case, monkeypatch):
    t, cfg = TARGETS[target], flat(*CASES[case])
    exported = export_config(t, cfg)
    doc = written_and_read(target, exported.doc, monkeypatch)
    assert doc == exported.doc
    carried = [k for k in t.mapped_keys() if k not in exported.dropped]
    # The base supplies what the document does not say: the defaults for the carried keys (so that each value
    # must come from the document), the trial's own values for the rest (the model, which the split needs).
    base = flat() | {k: v for k, v in cfg.items() if k not in carried}
    back = canonical(import_config(t, doc, base))
    want = canonical(cfg)
    assert {k: back[k] for k in carried} == {k: want[k] for k in carried}
    # A value the target cannot say is listed, never carried; keys it has no place for are listed with a reason.
    assert set(exported.dropped) >= {k for k in cfg if k not in t.mapped_keys()}


@pytest.mark.parametrize("target", TARGETS)
def test_every_parallel_and_memory_key_is_mapped_or_listed(target):
    t = TARGETS[target]
    mapped = t.mapped_keys()
    assert len(mapped) == len(set(mapped)), "a core key in two rules"
    paths = [p for rule in t.rules for p in rule.paths]
    assert len(paths) == len(set(paths)), "a target key written by two rules"
    for cls, section in ((ParallelConfig, "parallel"), (MemoryConfig, "memory")):
        for f in fields(cls):
            key = f"{section}.{f.name}"
            assert (key in mapped) != (key in t.unmapped), f"{target}: {key} must be mapped or listed, not both"
    for key in flat("model=moe-tiny"):  # every key of the config, whole sections allowed outside parallel/memory
        # (a section's reason covers its keys no rule maps; a key is never both mapped and listed by name)
        assert not (key in mapped and key in t.unmapped), f"{target}: {key}"
        assert key in mapped or t.unmapped_reason(key) is not None, f"{target}: {key}"
    assert not [k for k in t.unmapped if k not in flat("model=moe-tiny") and "." in k], "a listed key that is gone"


def test_mindformers_pins_the_parallel_keys():
    doc = export_config(TARGETS["mindformers"], flat(*CASES["hsdp-tp-sp-cp-pp"])).doc
    assert doc["parallel_config"] == {
        "data_parallel": 4,
        "model_parallel": 2,
        "pipeline_stage": 2,
        "context_parallel": 2,
        "expert_parallel": 1,
        "use_seq_parallel": True,
        "micro_batch_num": 4,
    }  # 16 / (1 * 4): a pipeline's micro-batches
    assert doc["parallel"] == {
        "enable_parallel_optimizer": True,
        "parallel_optimizer_config": {"optimizer_weight_shard_size": 2},
        "pipeline_config": {"pipeline_interleave": False, "pipeline_scheduler": "gpipe"},
    }
    assert doc["runner_config"] == {"batch_size": 1, "gradient_accumulation_steps": 1}
    assert doc["model"]["model_config"] == {
        "pp_interleave_num": 1,
        "offset": 0,
        "seq_length": 64,
        "compute_dtype": "float32",
    }
    assert doc["recompute_config"] == {"recompute": [1, 1], "select_recompute": [0, 0]}  # 1 of 2 blocks a stage
    assert doc["context"]["max_device_memory"] == "12.5GB"
    assert doc["runner_wrapper"] == {"use_clip_grad": True, "max_grad_norm": 0.5}

    doc = export_config(TARGETS["mindformers"], flat(*CASES["interleaved-uneven"])).doc
    assert doc["parallel"]["pipeline_config"] == {"pipeline_interleave": True, "pipeline_scheduler": "1f1b"}
    # core stage s is chunk s // pp on rank s % pp; MindFormers lists [interleave][stage]
    assert doc["model"]["model_config"] == {
        "pp_interleave_num": 2,
        "offset": [[1, 0], [0, 1]],
        "seq_length": 64,
        "compute_dtype": "float32",
    }
    assert doc["recompute_config"] == {"recompute": [[1, 0], [0, 0]], "select_recompute": [[0, 0], [1, 0]]}
    assert doc["runner_config"] == {"batch_size": 2, "gradient_accumulation_steps": 1}
    assert doc["parallel_config"]["micro_batch_num"] == 4
    assert doc["optimizer"] == {
        "type": "Muon",
        "weight_decay": 0.1,
        "adamw_betas": [0.9, 0.95],
        "adamw_eps": 1e-8,
        "momentum": 0.9,
        "ns_steps": 4,
    }
    assert doc["lr_schedule"] == {
        "learning_rate": 0.02,
        "warmup_steps": 10,
        "type": "WarmUpStableDecayLR",
        "lr_end": 0.002,
        "decay_start_ratio": 0.7,
    }
    assert "mode" not in doc["context"]  # MindFormers' YAML trainer is graph mode only; the header says so

    doc = export_config(TARGETS["mindformers"], flat(*CASES["per-stage-counts"])).doc
    assert doc["recompute_config"] == {"recompute": [0, 0, 0, 0], "select_recompute": [2, 1, 1, 0]}

    doc = export_config(TARGETS["mindformers"], flat(*CASES["offset-constant"])).doc
    assert doc["parallel"]["pipeline_config"] == {"pipeline_interleave": False, "pipeline_scheduler": "1f1b"}
    assert doc["model"]["model_config"]["offset"] == [1, -1]  # small: 4 layers split [3, 1]
    assert doc["recompute_config"] == {"recompute": False, "select_recompute": True}
    assert doc["lr_schedule"] == {"learning_rate": 0.003, "warmup_steps": 10, "type": "ConstantWarmUpLR"}
    assert doc["runner_wrapper"] == {"use_clip_grad": False}
    dropped = export_config(TARGETS["mindformers"], flat(*CASES["offset-constant"])).dropped
    assert dropped["training.mode"] == (
        "pynative",
        "MindFormers' YAML trainer runs in GRAPH_MODE only "
        "(configuration.md: context.mode); its PyNative trainer takes "
        "another config",
    )
    assert dropped["device"][1] == "MindFormers runs on Ascend only (configuration.md: context.device_target)"

    doc = export_config(TARGETS["mindformers"], flat(*CASES["moe-ep"])).doc
    assert doc["parallel_config"]["expert_parallel"] == 2 and doc["parallel_config"]["data_parallel"] == 2
    assert doc["runner_config"] == {"batch_size": 4, "gradient_accumulation_steps": 1}
    assert doc["context"] == {
        "mode": 0,
        "jit_config": {"jit_level": "O1"},
        "enable_graph_kernel": True,
        "device_target": "Ascend",
    }

    doc = export_config(TARGETS["mindformers"], flat(*CASES["swap"])).doc
    assert doc["swap_config"] == {
        "swap": True,
        "op_swap": [
            {"op_name": name, "backward_prefetch": 1, "layers": [0, 1]}
            for name in ("attention", "attention_norm", "ffn_norm")
        ],
    }
    assert doc["lr_schedule"]["type"] == "PolynomialWithWarmUpLR" and doc["lr_schedule"]["power"] == 1.0
    doc = export_config(TARGETS["mindformers"], flat(*CASES["swap-all"])).doc
    assert doc["swap_config"] == {"swap": True, "layer_swap": [{"backward_prefetch": 1, "layers": [0, 1, 2]}]}


def test_mindformers_writes_an_hf_models_shape_as_its_config_json_says():
    hf = json.loads((HF / "deepseek-tiny" / "config.json").read_text())
    doc = export_config(TARGETS["mindformers"], flat(*CASES["hf-deepseek"])).doc
    mc, moe = doc["model"]["model_config"], doc["moe_config"]
    mla = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    assert {k: mc[k] for k in mla} == {k: hf[k] for k in mla}
    shape = ("hidden_size", "num_layers", "num_heads", "n_kv_heads", "intermediate_size", "vocab_size", "theta")
    hf_names = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    hf_names += ("intermediate_size", "vocab_size", "rope_theta")
    assert [mc[k] for k in shape] == [hf[k] for k in hf_names]
    assert (mc["mtp_depth"], mc["mtp_loss_factor"], mc["extend_method"]) == (
        hf["num_nextn_predict_layers"],
        0.1,
        "None",
    )
    assert moe == {
        "expert_num": hf["n_routed_experts"],
        "num_experts_chosen": hf["num_experts_per_tok"],
        "shared_expert_num": hf["n_shared_experts"],
        "moe_intermediate_size": hf["moe_intermediate_size"],
        "first_k_dense_replace": hf["first_k_dense_replace"],
        "n_group": hf["n_group"],
        "topk_group": hf["topk_group"],
        "routed_scaling_factor": hf["routed_scaling_factor"],
        "norm_topk_prob": hf["norm_topk_prob"],
        "balance_via_topk_bias": True,  # DeepSeek-V3's aux-loss-free bias, at the study's update rate
        "topk_bias_update_rate": 0.001,
        "aux_loss_factor": hf["aux_loss_alpha"],
        "capacity_factor": 1.25,
        "use_gating_sigmoid": True,
    }
    yarn = export_config(TARGETS["mindformers"], flat(*CASES["hf-deepseek-yarn"])).doc["model"]["model_config"]
    # as read from a DeepSeek config (mscale = mscale_all_dim = 1: cos and sin unscaled), its own mscale comes back
    assert yarn["extend_method"] == "YARN" and yarn["scaling_factor"] == {
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 64,
        "mscale": pytest.approx(1.0),
    }
    # cos and sin times m = 0.1 ln 4 + 1 in the core (the YaRN default): MindFormers scales them by
    # (0.1 mscale ln 4 + 1) / m (mscale_all_dim 1), so mscale = (m^2 - 1) / (0.1 ln 4) = 2 + 0.1 ln 4, which would
    # scale its MLA's softmax by (0.1 mscale ln 4 + 1)^2 = 1.68 where the core's is m^2 = 1.30: no counterpart
    default = [o for o in CASES["hf-deepseek-yarn"] if not o.startswith("model.rope_attention_factor")]
    dropped = export_config(TARGETS["mindformers"], flat(*default)).dropped
    reason = dropped["model.rope_scaling"][1]
    assert "softmax" in reason and f"{(0.1 * (2 + 0.1 * math.log(4)) * math.log(4) + 1) ** 2:.4g}" in reason
    assert f"{(0.1 * math.log(4) + 1) ** 2:.4g}" in reason
    # on a GQA model (no mscale_all_dim) nothing else reads mscale: MindFormers' cos and sin factor is
    # 0.1 mscale ln 4 + 1, the core's YaRN default at mscale 1
    gqa = CASES["hf-qwen3-yarn"]
    factors = export_config(TARGETS["mindformers"], flat(*gqa)).doc["model"]["model_config"]["scaling_factor"]
    assert factors["mscale"] == pytest.approx(1.0)
    # DeepSeek-V3's sequence-wise balance loss (its config's): MindFormers' YAML has none, and the export says where
    # it is spelled; the batch-wise one is moe_config's aux_loss_factor, nothing dropped
    seq = export_config(TARGETS["mindformers"], flat(*CASES["hf-deepseek"]))
    assert "moe_router_load_balancing_type: seq_aux_loss" in seq.dropped["model.moe_aux_per_sequence"][1]
    batch = export_config(TARGETS["mindformers"], flat(*CASES["hf-deepseek"], "model.moe_aux_per_sequence=false"))
    assert "model.moe_aux_per_sequence" not in batch.dropped
    # a preset sized the search only: no shape written, each key listed with the reason
    preset = export_config(TARGETS["mindformers"], flat("model=moe-tiny"))
    assert "moe_config" not in preset.doc and "hidden_size" not in preset.doc["model"]["model_config"]
    assert "preset only sized the search" in preset.dropped["model.n_experts"][1]


def test_torchtitan_pins_the_parallel_keys():
    doc = export_config(TARGETS["torchtitan"], flat(*CASES["hsdp-tp-sp-cp-pp"])).doc
    assert doc["parallelism"] == {
        "data_parallel_replicate_degree": 2,
        "data_parallel_shard_degree": 2,
        "tensor_parallel_degree": 2,
        "enable_sequence_parallel": True,
        "pipeline_parallel_degree": 2,
        "context_parallel_degree": 2,
        "expert_parallel_degree": 1,
        "pipeline_parallel_schedule": "GPipe",
        "module_fqns_per_model_part": [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3"] + LAST],
        "pipeline_parallel_microbatch_size": 1,
    }
    assert doc["training"] == {
        "disable_cuda_graphs": True,  # torchtitan rejects CUDA graphs with a pipeline
        "global_batch_size": 16,
        "local_batch_size": 4,
        "seq_len": 64,
        "max_norm": 0.5,
        "mixed_precision_param": "float32",
    }  # with a pipeline a rank's batch is its micro-batches
    assert doc["compile"] == {"enable": True} and doc["debug"] == {"seed": 0}
    assert doc["optimizer"] == {"lr": 0.003, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    assert doc["lr_scheduler"] == {
        "warmup_steps": 10,
        "decay_type": "cosine",
        "min_lr_factor": 0.1,
        "decay_ratio": None,
    }
    exported = export_config(TARGETS["torchtitan"], flat(*CASES["hsdp-tp-sp-cp-pp"]))
    assert "activation_checkpoint" not in exported.doc  # the first k blocks: no torchtitan counterpart
    assert "not the first 1 of each stage" in exported.dropped["memory.recompute_layers"][1]

    exported = export_config(TARGETS["torchtitan"], flat(*CASES["interleaved-uneven"]))
    assert exported.doc["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert exported.doc["parallelism"]["module_fqns_per_model_part"] == [  # [2, 1, 1, 2] layers, 2 stages a rank
        ["tok_embeddings", "layers.0", "layers.1"],
        ["layers.2"],
        ["layers.3"],
        ["layers.4", "layers.5"] + LAST,
    ]
    assert exported.doc["lr_scheduler"] == {
        "warmup_steps": 10,
        "decay_type": "linear",
        "min_lr_factor": 0.1,
        "decay_ratio": 0.3,
    }
    # Muon: every optimizer key is listed (an AdamW at Muon's lr is not the tuned optimizer), none written
    assert "optimizer" not in exported.doc
    for key in ("optim.name", "optim.lr", "optim.beta1", "optim.beta2", "optim.eps", "optim.weight_decay"):
        assert exported.dropped[key][1].startswith("the study ran Muon; torchtitan's Muon (DistMuon, ")
    assert exported.dropped["optim.momentum"][1].startswith("a Muon setting, and a recipe carries AdamW only")

    doc = export_config(TARGETS["torchtitan"], flat(*CASES["offset-constant"])).doc
    assert doc["parallelism"]["pipeline_parallel_schedule"] == "1F1B"
    assert doc["parallelism"]["module_fqns_per_model_part"] == [
        ["tok_embeddings", "layers.0", "layers.1", "layers.2"],
        ["layers.3"] + LAST,
    ]
    assert doc["activation_checkpoint"] == "selective"
    assert doc["lr_scheduler"] == {  # constant
        "warmup_steps": 10,
        "decay_type": "linear",
        "min_lr_factor": 1.0,
        "decay_ratio": None,
    }
    assert doc["training"]["max_norm"] == float("inf") and doc["compile"]["enable"] is False
    assert doc["debug"]["seed"] == 7 and "pipeline_parallel_microbatch_size" in doc["parallelism"]

    doc = export_config(TARGETS["torchtitan"], flat(*CASES["moe-ep"])).doc
    assert doc["parallelism"]["expert_parallel_degree"] == 2 and doc["parallelism"]["data_parallel_shard_degree"] == 2
    assert doc["parallelism"]["module_fqns_per_model_part"] is None  # one stage: nothing to split
    assert doc["training"] == {
        "global_batch_size": 8,
        "local_batch_size": 4,
        "seq_len": 128,
        "max_norm": 1.0,
        "mixed_precision_param": "float32",
    }  # no pipeline: 8 / (4 * 2) = 1 step, no accumulation; CUDA graphs are the base's to choose
    assert doc["activation_checkpoint"] == "none"  # torchtitan's own default is selective

    exported = export_config(TARGETS["torchtitan"], flat(*CASES["interleaved-one-virtual"]))
    assert "pipeline_parallel_schedule" not in exported.doc["parallelism"]
    assert "two or more stages per rank" in exported.dropped["parallel.pp_schedule"][1]


def test_tensor_parallel_with_and_without_sequence_parallel():
    for sp in (True, False):
        exported = export_config(TARGETS["torchtitan"], flat("model=tiny", "parallel.tp=2", f"parallel.sp={sp}"))
        assert exported.doc["parallelism"]["enable_sequence_parallel"] is sp and "parallel.sp" not in exported.dropped
    assert "parallel.sp" not in export_config(TARGETS["mindformers"], flat("model=tiny", "parallel.tp=2")).dropped


def test_a_split_torchtitan_cannot_name_is_refused_on_the_way_back():
    t, base = TARGETS["torchtitan"], flat("model=small", "parallel.pp=2")
    doc = export_config(t, base).doc
    doc["parallelism"]["module_fqns_per_model_part"] = [["tok_embeddings", "layers.1"], ["layers.0", "layers.2"]]
    with pytest.raises(ValueError, match="is not the blocks in order between embedding and head"):
        import_config(t, doc, base)
    doc = export_config(t, base).doc
    doc["lr_scheduler"] |= {"decay_type": "cosine", "decay_ratio": 0.2}  # torchtitan's WSD with a cosine decay
    with pytest.raises(ValueError, match="decay_type='cosine' with decay_ratio=0.2 has no core schedule"):
        import_config(t, doc, base)


def test_canonical_spells_equal_configs_one_way():
    # an explicit split equal to the even one moved by an offset; per-stage recompute that is the same everywhere
    a = canonical(
        flat(
            "model=small",
            "parallel.pp=2",
            "parallel.pp_layers=[3,1]",
            "memory.recompute_stages=[full,full]",
            "memory.recompute_layers=3",
        )
    )
    b = canonical(flat("model=small", "parallel.pp=2", "parallel.pp_offset=1", "memory.recompute=full"))
    assert a == b and (b["parallel.pp_layers"], b["parallel.pp_offset"]) == (None, 1)
    assert b["memory.recompute_layers"] is None  # 3 blocks cover both stages (3 and 1 layers)
    # settings without effect go to their defaults: decay_ratio outside WSD, Muon's under AdamW
    c = canonical(flat("optim.decay_ratio=0.5", "optim.momentum=0.5", "optim.min_lr_ratio=1.0"))
    assert (c["optim.decay_ratio"], c["optim.momentum"], c["optim.schedule"], c["optim.min_lr_ratio"]) == (
        0.2,
        0.95,
        "constant",
        0.1,
    )


def test_per_stage_counts_are_spelled_the_plainest_way_that_says_the_same():
    """A count per stage is recompute_layers when it is the first k of every recomputing stage, nothing when it
    covers them, and a stage that recomputes none of its blocks is a stage without recompute."""
    base = ("model=small", "model.n_layers=8", "parallel.pp=4", "memory.recompute=full")

    def spelled(counts: str) -> tuple:
        c = canonical(flat(*base, f"memory.recompute_stage_layers={counts}"))
        return tuple(
            c[f"memory.{k}"] for k in ("recompute", "recompute_stages", "recompute_layers", "recompute_stage_layers")
        )

    assert spelled("[2,2,2,2]") == ("full", None, None, None)
    assert spelled("[1,1,1,1]") == ("full", None, 1, None)
    assert spelled("[2,1,1,0]") == ("none", ["full", "full", "full", "none"], None, [2, 1, 1, 0])
    assert spelled("[0,0,0,0]") == ("none", None, None, None)
    assert spelled("[2,2,0,0]") == ("none", ["full", "full", "none", "none"], None, None)


def test_mindformers_per_stage_recompute_reads_back_as_its_counts():
    """MindFormers' own Llama 3 70B recompute_config (research/llama3/finetune_llama3_70b.yaml at 2388c729:
    select_recompute [10, 8, 6, 4, 2, 0, 0, 0] over 8 stages of 10 layers) is the core's per-stage counts; a stage
    recomputing some blocks whole and the next selectively has no core counterpart."""
    core = flat("model=small", "model.n_layers=80", "parallel.pp=8", "training.global_batch_size=16")
    select = {"recompute_config.recompute": False, "recompute_config.select_recompute": [10, 8, 6, 4, 2, 0, 0, 0]}
    restored = MINDFORMERS_RECOMPUTE.restore(select, core)
    assert restored["memory.recompute_stage_layers"] == [10, 8, 6, 4, 2, 0, 0, 0]
    assert restored["memory.recompute_stages"] == ["selective"] * 5 + ["none"] * 3
    # every block of stage 0 whole: its select count says nothing more
    whole = MINDFORMERS_RECOMPUTE.restore({**select, "recompute_config.recompute": [10, 0, 0, 0, 0, 0, 0, 0]}, core)
    assert whole["memory.recompute_stages"][:2] == ["full", "selective"]
    with pytest.raises(ValueError, match="one mode per stage"):
        MINDFORMERS_RECOMPUTE.restore({**select, "recompute_config.recompute": [2, 0, 0, 0, 0, 0, 0, 0]}, core)


def test_a_value_mapped_to_no_counterpart_is_raised_and_the_rest_restore():
    rule = same("optim.name", "optimizer.name", {"adamw": "AdamW", "muon": NoCounterpart("no Muon")})
    assert rule.export({"optim.name": "adamw"}) == {"optimizer.name": "AdamW"}
    assert rule.restore({"optimizer.name": "AdamW"}, {}) == {"optim.name": "adamw"}
    with pytest.raises(NoCounterpart, match="no Muon"):
        rule.export({"optim.name": "muon"})


@pytest.mark.parametrize("target, name", [("mindformers", "MindFormers"), ("torchtitan", "torchtitan")])
def test_mpipe_is_listed_as_having_no_counterpart(target, name):
    mpipe = ("model=tiny", "model.n_layers=4", "parallel.pp=2", "parallel.pp_schedule=mpipe")
    exported = export_config(TARGETS[target], flat(*mpipe, "parallel.pp_transpose_layers=1"))
    for key in ("parallel.pp_schedule", "parallel.pp_transpose_layers", "parallel.pp_transpose_overflow"):
        value, reason = exported.dropped[key]
        assert f"{name} has no counterpart" in reason and "hyper-parallel" in reason, key
    assert exported.dropped["parallel.pp_transpose_layers"][0] == 1
    # another schedule carries nothing for T and the overflow policy, and drops neither
    plain = export_config(TARGETS[target], flat("model=tiny", "model.n_layers=4", "parallel.pp=2"))
    assert not {k for k in plain.dropped if k.startswith("parallel.pp")}


def test_per_op_recompute_is_torchtitans_own_policy_and_mindformers_has_none():
    """memory.recompute=selective_op (estimated, not trained) is torchtitan's SelectiveAC itself; MindFormers'
    recompute_config names no such policy, so the key is dropped with the reason and the rest exports."""
    cfg = flat("model=small", "memory.recompute=selective_op")
    assert export_config(TARGETS["torchtitan"], cfg).doc["activation_checkpoint"] == "selective"
    exported = export_config(TARGETS["mindformers"], cfg)
    assert "recompute_config" not in exported.doc
    assert "every second matmul" in exported.dropped["memory.recompute"][1]
