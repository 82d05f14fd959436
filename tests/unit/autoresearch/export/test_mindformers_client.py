"""The exported MindFormers YAML read by MindFormers itself: ``mindformers.tools.register.MindFormerConfig``, the loader
its trainer starts from, checks each section it knows against its templates (an unknown key in ``parallel_config``,
``recompute_config``, ``swap_config``, ``runner_config`` or ``moe_config`` is a KeyError) and fills the rest with its
defaults. The fragment is merged into the least a user's training YAML holds (``run_mode: train`` and its wrapper),
as the export's header says to, and every key it wrote must come back with its value.

Needs the ``mindformers`` package (installed by .ci/run from .ci/mindformers-client.txt, without its dependencies);
skipped with the reason elsewhere."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest
import yaml

from autoresearch import export
from autoresearch.export.targets import TARGETS, export_config, flatten
from tests.unit.autoresearch.export.test_export import CASES, flat

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mindformers") is None,
    reason="mindformers is not installed (.ci/run installs it: pip install --no-deps -r .ci/mindformers-client.txt)",
)
USER = {"run_mode": "train", "runner_wrapper": {"type": "MFTrainOneStepCell"}}  # what the user's YAML brings


def merged(fragment: dict, base: dict) -> dict:
    out = dict(base)
    for key, value in fragment.items():
        out[key] = merged(value, out[key]) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.fixture
def load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # importing mindformers makes ./output/log
    monkeypatch.setenv("CRC32C_SW_MODE", "auto")  # what tensorboardX (which it imports) sets; undone after
    from mindformers.tools.register import MindFormerConfig

    def read(doc: dict):
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump(merged(yaml.safe_load(export.yaml_text(doc)), USER)))
        return MindFormerConfig(str(path))

    return read


@pytest.mark.parametrize("case", CASES)
def test_mindformers_reads_every_key_the_export_writes(case, load):
    doc = export_config(TARGETS["mindformers"], flat(*CASES[case])).doc
    loaded = load(doc)
    for path, value in flatten(doc).items():
        node = loaded
        for part in path.split("."):
            node = node[part]
        got = flatten(node) if isinstance(node, dict) else node
        assert got == value, (case, path)


@pytest.mark.parametrize("case", ["hf-llama3-rope", "hf-deepseek-yarn", "hf-qwen3-yarn", "hf-qwen3"])
def test_mindformers_rotates_by_the_cores_angles(case, load):
    """The exported extend_method and scaling_factor, given to MindFormers' own RoPE table (``FreqsMgr``, which
    checks the keys as its models do), give the core's cos table (``core.model.layers.rope_tables``, float64)."""
    import mindspore as ms
    from mindformers.modules.layers import FreqsMgr

    from core.config import load_config
    from core.model.layers import rope_tables

    overrides = CASES[case]
    model = load_config([o for o in overrides if not o.startswith("parallel.")]).model
    mc = export_config(TARGETS["mindformers"], flat(*overrides)).doc["model"]["model_config"]
    table = FreqsMgr(
        model.rope_dim,
        max_position_embedding=mc["max_position_embeddings"],
        rotary_dtype=ms.float32,
        theta=mc["theta"],
        scaling_factor=mc.get("scaling_factor", 1.0),
        extend_method=mc["extend_method"],
    )
    cos, _ = rope_tables(model)  # (S, R/2): MindFormers repeats the halves
    theirs = table.freqs_cos.asnumpy()
    assert theirs.shape == (model.max_seq_len, model.rope_dim)
    np.testing.assert_allclose(theirs[:, : model.rope_dim // 2], cos, atol=1e-4)


def test_mindformers_mla_scales_the_softmax_as_the_core(load):
    """The exported YaRN mscale, through MindFormers' own factor (``_yarn_get_mscale``, squared on the softmax scale
    by its MLA: parallel_core multi_latent_attention.py), gives the core's softmax scale."""
    import math

    from mindformers.parallel_core.training_graph.base_models.common.embeddings.yarn_rotary_pos_embedding import (
        _yarn_get_mscale,
    )

    from core.config import load_config

    model = load_config(CASES["hf-deepseek-yarn"]).model
    factors = export_config(TARGETS["mindformers"], flat(*CASES["hf-deepseek-yarn"])).doc["model"]["model_config"][
        "scaling_factor"
    ]
    theirs = _yarn_get_mscale(factors["factor"], factors["mscale"]) ** 2 / math.sqrt(model.qk_head_size)
    assert model.softmax_scale > 1.2 / math.sqrt(model.qk_head_size)  # YaRN's factor is in it (m^2 = 1.30)
    assert theirs == pytest.approx(model.softmax_scale, rel=1e-9)


def test_a_key_mindformers_does_not_know_is_refused(load):
    """The check can fail: MindFormers' templates refuse a key outside them."""
    doc = export_config(TARGETS["mindformers"], flat(*CASES["hf-deepseek"])).doc
    load(doc)
    doc["moe_config"]["expert_count"] = 8
    with pytest.raises(KeyError, match="moe_config.*expert_count"):
        load(doc)


def test_mindformers_computes_in_the_cores_precisions(load):
    """Each dtype key the export writes for a bf16 run is a field of MindFormers' TransformerConfig, spelled as its
    own converter reads it, and says what core.model.precision does: bf16 compute, RoPE and residual stream; fp32
    parameters, norm statistics, softmax and router."""
    import mindspore as ms
    from mindformers.parallel_core.transformer_config import TransformerConfig, convert_str_to_mstype

    mc = load(export_config(TARGETS["mindformers"], flat(*CASES["hf-deepseek-bf16"])).doc)["model"]["model_config"]
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    dtypes = ("compute_dtype", "rotary_dtype", "layernorm_compute_dtype", "softmax_compute_dtype", "params_dtype")
    assert {*dtypes, "moe_router_dtype", "fp32_residual_connection"} <= fields
    got = {k: convert_str_to_mstype(mc[k]) for k in (*dtypes, "moe_router_dtype")}
    assert got == {
        "compute_dtype": ms.bfloat16,
        "rotary_dtype": ms.bfloat16,
        "layernorm_compute_dtype": ms.float32,
        "softmax_compute_dtype": ms.float32,
        "params_dtype": ms.float32,
        "moe_router_dtype": ms.float32,
    }
    assert mc["fp32_residual_connection"] is False
