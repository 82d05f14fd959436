"""Hugging Face checkpoints in and out: a ``transformers`` model directory (``config.json`` with
``model.safetensors``, or shards tied by ``model.safetensors.index.json``) read as the core's parameters, and the
core's parameters written as a directory that ``transformers`` loads.

Names (the Hub's, as Llama, Mistral, Mixtral and Qwen checkpoints are published; the core's in ``core.model.gpt``):

    model.embed_tokens.weight                            embed.weight
    model.layers.{i}.input_layernorm.weight              layers.{i}.attn_norm.weight
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight     layers.{i}.attn.{wq,wk,wv,wo}.weight
    model.layers.{i}.self_attn.{q,k,v}_proj.bias         layers.{i}.attn.{wq,wk,wv}.bias.weight (Qwen2)
    model.layers.{i}.self_attn.{q,k}_norm.weight         layers.{i}.attn.{q,k}_norm.weight (Qwen3)
    model.layers.{i}.post_attention_layernorm.weight     layers.{i}.mlp_norm.weight
    model.layers.{i}.mlp.{gate,up,down}_proj.weight      layers.{i}.mlp.{w_gate,w_up,w_down}.weight
    model.layers.{i}.block_sparse_moe.gate.weight        layers.{i}.mlp.router.weight
    model.layers.{i}.block_sparse_moe.experts.{x}.{w1,w3,w2}.weight
                                                         row x of layers.{i}.mlp.experts.{w_gate,w_up,w_down}
    model.layers.{i}.mlp.gate.weight, model.layers.{i}.mlp.experts.{x}.{gate,up,down}_proj.weight
                                                         the same in Qwen3-MoE
    model.layers.{i}.self_attn.{q_a_proj,q_a_layernorm,q_b_proj,kv_a_proj_with_mqa,kv_a_layernorm,kv_b_proj}.weight
                                                         layers.{i}.attn.{wq_a,q_a_norm,wq_b,wkv_a,kv_a_norm,wkv_b}.weight
                                                         (DeepSeek-V3's MLA; q's and the shared key's rotary rows
                                                         permuted from DeepSeek's interleaved pairs, rope_interleave)
    model.layers.{i}.mlp.gate.e_score_correction_bias    layers.{i}.mlp.score_bias (DeepSeek-V3's choice bias)
    model.layers.{i}.mlp.shared_experts.{gate,up,down}_proj.weight
                                                         layers.{i}.mlp.shared.{w_gate,w_up,w_down}.weight
    model.layers.{L+k}.{enorm,hnorm,eh_proj,shared_head.norm}.weight, model.layers.{L+k}.<a layer's names>
                                                         mtp.{k}.{enorm,hnorm,proj,norm}.weight, mtp.{k}.block.*
                                                         (DeepSeek-V3's MTP module k after L layers; the Hub's
                                                         copies of the embedding and head in it are written, not read)
    model.norm.weight                                    norm.weight
    lm_head.weight                                       lm_head.weight (none when the embedding is tied)

``transformers`` 5 holds Mixtral's experts fused (``mlp.experts.gate_up_proj`` (X, 2F, D), ``mlp.experts.down_proj``
(X, D, F), the router ``mlp.gate.weight``) and converts the Hub's names as it loads and saves; a file in its fused
names is read too. No q/k permutation either way: the core's RoPE rotates the halves (x_i, x_{i+E/2}) of a head,
as transformers' Llama does.

Reading maps the files (safetensors) and converts one tensor at a time to float32, whatever it is stored in
(bf16, the usual case, through ``ml_dtypes``): a rank that takes its shards of a large model holds one full tensor
at a time, never the model. A tensor of the checkpoint that the core does not build is an error naming it (a
model that silently differs from its checkpoint is worse than none). Writing goes to a temporary directory
renamed into place, like every checkpoint here. NumPy only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes  # noqa: F401 — registers bfloat16 with NumPy, so safetensors can hand bf16 tensors over
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from core.ckpt.store import CheckpointError
from core.config import ModelConfig
from core.config.hf import to_hf_config
from core.model.flops import buffer_shapes, param_shapes
from core.runtime.files import fsync_dir

WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
# core name -> the Hub's, {i} a layer; one tensor each
_RENAMES = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
    "layers.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "layers.{i}.attn.wq.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "layers.{i}.attn.wk.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "layers.{i}.attn.wv.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "layers.{i}.attn.wo.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "layers.{i}.attn.wq.bias.weight": "model.layers.{i}.self_attn.q_proj.bias",
    "layers.{i}.attn.wk.bias.weight": "model.layers.{i}.self_attn.k_proj.bias",
    "layers.{i}.attn.wv.bias.weight": "model.layers.{i}.self_attn.v_proj.bias",
    "layers.{i}.attn.q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "layers.{i}.attn.k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "layers.{i}.mlp_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "layers.{i}.mlp.w_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "layers.{i}.mlp.w_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "layers.{i}.mlp.w_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    "layers.{i}.mlp.router.weight": "model.layers.{i}.block_sparse_moe.gate.weight",
    # DeepSeek-V3: MLA's projections, the router's choice bias, the shared experts
    "layers.{i}.attn.wq_a.weight": "model.layers.{i}.self_attn.q_a_proj.weight",
    "layers.{i}.attn.q_a_norm.weight": "model.layers.{i}.self_attn.q_a_layernorm.weight",
    "layers.{i}.attn.wq_b.weight": "model.layers.{i}.self_attn.q_b_proj.weight",
    "layers.{i}.attn.wkv_a.weight": "model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight",
    "layers.{i}.attn.kv_a_norm.weight": "model.layers.{i}.self_attn.kv_a_layernorm.weight",
    "layers.{i}.attn.wkv_b.weight": "model.layers.{i}.self_attn.kv_b_proj.weight",
    "layers.{i}.mlp.score_bias": "model.layers.{i}.mlp.gate.e_score_correction_bias",
    "layers.{i}.mlp.shared.w_gate.weight": "model.layers.{i}.mlp.shared_experts.gate_proj.weight",
    "layers.{i}.mlp.shared.w_up.weight": "model.layers.{i}.mlp.shared_experts.up_proj.weight",
    "layers.{i}.mlp.shared.w_down.weight": "model.layers.{i}.mlp.shared_experts.down_proj.weight",
    # DeepSeek-V3's multi-token prediction module k: layer n_layers + k of the Hub's checkpoint (``as_layer``)
    "layers.{i}.mtp.enorm.weight": "model.layers.{i}.enorm.weight",
    "layers.{i}.mtp.hnorm.weight": "model.layers.{i}.hnorm.weight",
    "layers.{i}.mtp.proj.weight": "model.layers.{i}.eh_proj.weight",
    "layers.{i}.mtp.norm.weight": "model.layers.{i}.shared_head.norm.weight",
}
# The Hub's copies of the embedding and the head in each MTP layer (DeepSeek-V3 stores them; the core shares them)
_MTP_COPIES = {
    "embed.weight": "model.layers.{i}.embed_tokens.weight",
    "head": "model.layers.{i}.shared_head.head.weight",
}
# the core's stacked experts (X, ...) -> each expert's weight in the Hub's names: Mixtral's, Qwen3-MoE's
_EXPERTS = {"w_gate": "w1", "w_up": "w3", "w_down": "w2"}
_EXPERT_HF = "model.layers.{i}.block_sparse_moe.experts.{x}.{w}.weight"
_QWEN_EXPERTS = {"w_gate": "gate_proj", "w_up": "up_proj", "w_down": "down_proj"}
_QWEN_EXPERT_HF = "model.layers.{i}.mlp.experts.{x}.{w}.weight"
# transformers 5's fused names for the same tensors (the router's is also Qwen3-MoE's own)
_FUSED_ROUTER = "model.layers.{i}.mlp.gate.weight"
_FUSED_GATE_UP = "model.layers.{i}.mlp.experts.gate_up_proj"
_FUSED_DOWN = "model.layers.{i}.mlp.experts.down_proj"
# Tensors some checkpoints carry that hold no weights: RoPE's inverse frequencies (recomputed from the config).
_NOT_WEIGHTS = re.compile(r".*\.rotary_emb\.inv_freq$")
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_MTP = re.compile(r"^mtp\.(\d+)\.(block\.)?(.+)$")


def as_layer(name: str, cfg: ModelConfig) -> str:
    """The core's name, with an MTP module's (``mtp.{k}.*``) written as the Hub numbers it: its block's weights as
    layer n_layers + k's, its own as ``layers.{n_layers + k}.mtp.*``."""
    m = _MTP.match(name)
    if m is None:
        return name
    i = cfg.n_layers + int(m.group(1))
    return f"layers.{i}.{m.group(3)}" if m.group(2) else f"layers.{i}.mtp.{m.group(3)}"


def hf_name(name: str) -> str:
    """The Hub's name of the core's parameter ``name`` (one tensor; an MoE block's stacked experts have one per
    expert: ``expert_names``)."""
    m = _LAYER.match(name)
    key, i = (f"layers.{{i}}.{m.group(2)}", m.group(1)) if m else (name, None)
    if key not in _RENAMES:
        raise CheckpointError(f"the core's {name} has no Hugging Face name")
    return _RENAMES[key].format(i=i)


def expert_names(name: str, n_experts: int, *, qwen: bool = False) -> list[str] | None:
    """Each expert's Hub name (Mixtral's, or with ``qwen`` Qwen3-MoE's) for the core's stacked
    ``layers.{i}.mlp.experts.<w>``; None for any other name."""
    m = re.match(r"^layers\.(\d+)\.mlp\.experts\.(w_gate|w_up|w_down)$", name)
    if not m:
        return None
    form, names = (_QWEN_EXPERT_HF, _QWEN_EXPERTS) if qwen else (_EXPERT_HF, _EXPERTS)
    return [form.format(i=m.group(1), x=x, w=names[m.group(2)]) for x in range(n_experts)]


class HFCheckpoint:
    """The tensors of a Hugging Face model directory, read by name (the files stay mapped until ``close``)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        index = self.path / INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
        elif (self.path / WEIGHTS).is_file():
            with safe_open(str(self.path / WEIGHTS), framework="np") as f:
                weight_map = dict.fromkeys(f.keys(), WEIGHTS)
        else:
            raise CheckpointError(f"{self.path} holds neither {WEIGHTS} nor {INDEX}: not a Hugging Face checkpoint")
        self.files = weight_map  # tensor name -> file name in the directory
        self._open: dict[str, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str) -> np.ndarray:
        """The tensor ``name`` as float32."""
        file = self.files.get(name)
        if file is None:
            raise CheckpointError(f"{self.path} has no tensor {name}")
        if file not in self._open:
            self._open[file] = safe_open(str(self.path / file), framework="np")
        return np.asarray(self._open[file].get_tensor(name), dtype=np.float32)

    def close(self) -> None:
        self._open.clear()

    def __enter__(self) -> HFCheckpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def sources(ckpt: HFCheckpoint, name: str, cfg: ModelConfig) -> list[str]:
    """The checkpoint's tensors that make the core's parameter ``name``: the Hub's names, or transformers 5's
    fused ones where the checkpoint has those."""
    name = as_layer(name, cfg)
    experts = expert_names(name, cfg.n_experts)
    if experts is not None:
        for form in (experts, expert_names(name, cfg.n_experts, qwen=True)):
            if form[0] in ckpt:
                return form
        i, w = _LAYER.match(name).group(1), name.rsplit(".", 1)[1]
        return [(_FUSED_DOWN if w == "w_down" else _FUSED_GATE_UP).format(i=i)]
    hub = hf_name(name)
    if name.endswith(".mlp.router.weight") and hub not in ckpt:
        return [_FUSED_ROUTER.format(i=_LAYER.match(name).group(1))]
    return [hub]


def _rope_rows(name: str, array: np.ndarray, cfg: ModelConfig, *, to_hub: bool) -> np.ndarray:
    """MLA's rotary rows in the core's order (halves) from a checkpoint's interleaved pairs, or back with
    ``to_hub`` (``model.rope_interleave``): q's last R rows of each head, the shared key's last R rows of wkv_a."""
    if not (
        cfg.mla and cfg.rope_interleave and name.endswith(("attn.wq.weight", "attn.wq_b.weight", "attn.wkv_a.weight"))
    ):
        return array
    R = cfg.qk_rope_head_dim
    halves = np.concatenate([np.arange(0, R, 2), np.arange(1, R, 2)])  # core row j holds pair element halves[j]
    order = np.argsort(halves) if to_hub else halves
    if name.endswith("attn.wkv_a.weight"):
        return np.concatenate([array[:-R], array[-R:][order]])
    heads = array.reshape(cfg.n_heads, cfg.qk_head_size, -1)
    return np.concatenate([heads[:, :-R], heads[:, -R:][:, order]], axis=1).reshape(array.shape)


def read_param(ckpt: HFCheckpoint, name: str, cfg: ModelConfig) -> np.ndarray:
    """The core's parameter ``name`` (its full, 1-process shape) from ``ckpt``."""
    return _rope_rows(name, _read(ckpt, name, cfg), cfg, to_hub=False)


def _read(ckpt: HFCheckpoint, name: str, cfg: ModelConfig) -> np.ndarray:
    names = sources(ckpt, name, cfg)
    if len(names) > 1:  # the Hub's experts, one tensor each
        return np.stack([ckpt.get(n) for n in names])  # (X, F, D) or (X, D, F)
    array = ckpt.get(names[0])
    if names[0].endswith("gate_up_proj"):  # (X, 2F, D): the gate's rows, then the up projection's
        half = array.shape[1] // 2
        return array[:, :half] if name.endswith("w_gate") else array[:, half:]
    return array


def read_params(path: str | Path, names: list[str], cfg: ModelConfig, shapes: dict[str, tuple]) -> Iterator:
    """(name, full array) for each of the core's parameters ``names`` from the Hugging Face directory ``path``,
    one at a time, each checked against its ``shapes[name]``."""
    with HFCheckpoint(path) as ckpt:
        for name in names:
            array = read_param(ckpt, name, cfg)
            if tuple(array.shape) != tuple(shapes[name]):
                raise CheckpointError(
                    f"{path}: the core's {name} is {tuple(shapes[name])} but the checkpoint's is {array.shape}; "
                    "load it with the model config it was written with (model=hf:<dir>)"
                )
            yield name, array


def check_complete(path: str | Path, cfg: ModelConfig) -> None:
    """A CheckpointError naming what is missing, when the checkpoint at ``path`` lacks a weight of the core's
    model of ``cfg``, or naming what the core does not build, when it holds more (names only: nothing is read)."""
    with HFCheckpoint(path) as ckpt:
        wanted = {n for name in param_shapes(cfg) | buffer_shapes(cfg) for n in sources(ckpt, name, cfg)}
        missing = sorted(wanted - set(ckpt.files))
        if missing:
            raise CheckpointError(f"{path} lacks {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
        copies = {"lm_head.weight"} if cfg.tie_embeddings else set()  # transformers too skips a tied copy
        copies |= {form.format(i=cfg.n_layers + k) for k in range(cfg.mtp_layers) for form in _MTP_COPIES.values()}
        extra = sorted(n for n in set(ckpt.files) - wanted - copies if not _NOT_WEIGHTS.match(n))
        if extra:
            raise CheckpointError(
                f"{path} holds weights the core does not build: {', '.join(extra[:5])}"
                f"{' ...' if len(extra) > 5 else ''}; a model without them would not be this checkpoint's"
            )


def hf_tensors(tensors: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """The core's parameters (full arrays by the core's names) under the Hub's names (an MoE with QK-norm is
    Qwen3-MoE, its router and experts named so, as are DeepSeek-V3's (MLA); any other is Mixtral)."""
    qwen, out = cfg.qk_norm or cfg.mla, {}
    for k in range(cfg.mtp_layers):  # the Hub's copies in each MTP layer
        out[_MTP_COPIES["embed.weight"].format(i=cfg.n_layers + k)] = tensors["embed.weight"]
        head = tensors["embed.weight" if cfg.tie_embeddings else "lm_head.weight"]
        out[_MTP_COPIES["head"].format(i=cfg.n_layers + k)] = head
    for name, array in tensors.items():
        array = _rope_rows(name, array, cfg, to_hub=True)
        name = as_layer(name, cfg)
        experts = expert_names(name, cfg.n_experts, qwen=qwen)
        if experts is not None:
            out.update(zip(experts, array, strict=True))
        elif qwen and name.endswith(".mlp.router.weight"):
            out[_FUSED_ROUTER.format(i=_LAYER.match(name).group(1))] = array
        else:
            out[hf_name(name)] = array
    return out


def save(
    out: str | Path,
    tensors: dict[str, np.ndarray],
    cfg: ModelConfig,
    *,
    dtype: str = "float32",
    max_shard_bytes: int = 5 * 2**30,
) -> Path:
    """Write the core's parameters ``tensors`` (full arrays by the core's names) as the Hugging Face model
    directory ``out`` (``config.json`` and the weights in ``dtype``, float32 or bfloat16, in shards of at most
    ``max_shard_bytes`` with an index when one file would be larger); replaces ``out`` whole."""
    config = to_hf_config(cfg, dtype=dtype)  # first: a model the Hub's classes cannot hold is refused here
    np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype]
    arrays = {k: np.ascontiguousarray(v.astype(np_dtype)) for k, v in hf_tensors(tensors, cfg).items()}
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(arrays):
        if shards[-1] and size + arrays[name].nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = arrays[name]
        size += arrays[name].nbytes
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        files = (
            [WEIGHTS]
            if len(shards) == 1
            else [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
        )
        for file, shard in zip(files, shards, strict=True):
            save_file(shard, str(tmp / file), metadata={"format": "pt"})  # transformers refuses a file without it
        if len(shards) > 1:
            weight_map = {name: file for file, shard in zip(files, shards, strict=True) for name in shard}
            total = sum(a.nbytes for a in arrays.values())
            (tmp / INDEX).write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
            )
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
