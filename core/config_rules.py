"""The config's rules apart from its schema (core.config): the error every rule raises, the layout's divisibility
rules, and facts about the runtime that several modules share (which recompute runs as segments, MoE capacity).

No MindSpore here: the agent imports the config to validate and estimate proposals cheaply.
"""

from __future__ import annotations

import math
from typing import Any, Optional


class ConfigError(ValueError):
    """A configuration the trial refuses to run. ``field`` is the dotted key; the message says the fix."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


def require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise ConfigError(field_name, message)


def positive(section: str, obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        require(value > 0, f"{section}.{name}", f"must be > 0 (got {value})")


def segmented_recompute(mode: str, pipeline: bool) -> bool:
    """Whether full recompute runs as core.recompute's ``SegmentedStep`` (jit without a pipeline) rather than as
    MindSpore's recompute; core.memory counts its activations by the same rule."""
    return mode == "jit" and not pipeline


def eval_compiled(mode: str, eval_mode: str, eval_interval: int, max_steps: Optional[int]) -> bool:
    """Whether validation runs as a compiled graph. ``auto``: only if the trial validates more than once. One pass
    over the validation batches costs less op by op than compiling its graph first: measured on 2 CPU cores,
    2026-12-01, the final validation of a 2-step trial took ~3 s compiled against 1-2 s in PyNative for
    model=tiny and small, 4 s against 3 s for medium (same val_loss to every printed digit)."""
    if mode != "jit" or eval_mode == "pynative":
        return False
    return eval_mode == "jit" or (eval_interval > 0 and (max_steps is None or max_steps > eval_interval))


def selective_costs_memory(device: str, mode: str) -> bool:
    """CPU workaround: under jit MindSpore's CPU runtime keeps a bprop-Cell's forward intermediates as well as
    recomputing them, so selective recompute (core.recompute) adds memory there instead of saving it (measured on
    model=small, seq 512, micro-batch 8: 6.27 vs 5.73 GB). It saves in PyNative (1.76 vs 1.88 GB)."""
    return device == "CPU" and mode == "jit"


def moe_capacity(tokens: int, top_k: int, n_experts: int, factor: Optional[float]) -> int:
    """Slots per expert for ``tokens`` tokens: ceil(factor * tokens * k / n_experts), at most ``tokens``; all
    ``tokens`` when ``factor`` is None (dropless: a token picks an expert at most once). core.model.moe dispatches
    into them; core.memory counts them."""
    if factor is None:
        return tokens
    return min(tokens, math.ceil(factor * tokens * top_k / n_experts))


def check_layout(m, t, p) -> None:  # ModelConfig, TrainingConfig, ParallelConfig
    """Every degree must split the model and the sequence evenly; the message names the field and the fix."""
    for name, value in (("n_heads", m.n_heads), ("n_kv_heads", m.n_kv_heads), ("vocab_size", m.vocab_size),
                        ("ffn_hidden", m.ffn_hidden)):
        require(value % p.tp == 0, "parallel.tp",
                f"{p.tp} does not divide model.{name}={value}; choose a tp that divides n_heads, n_kv_heads, "
                "vocab_size and ffn_hidden")
    if p.cp > 1:
        require(t.seq_len % (2 * p.cp) == 0, "parallel.cp",
                f"training.seq_len={t.seq_len} must split into 2*cp = {2 * p.cp} equal chunks (each rank holds a "
                "chunk and its mirror, for causal load balance); choose cp or seq_len accordingly")
    if p.sp:
        local = t.seq_len // p.cp
        require(local % p.tp == 0, "parallel.sp",
                f"each rank's sequence ({t.seq_len} / cp = {local}) must split into tp={p.tp} equal parts; "
                "choose seq_len, cp and tp accordingly or set parallel.sp=false")
    stages = p.pp * p.pp_virtual
    if p.pp_layers is not None:
        require(len(p.pp_layers) == stages and sum(p.pp_layers) == m.n_layers and min(p.pp_layers) >= 1,
                "parallel.pp_layers", f"{list(p.pp_layers)} must give each of pp * pp_virtual = {stages} stages at "
                f"least one layer, model.n_layers={m.n_layers} in all")
        require(p.pp_offset == 0, "parallel.pp_offset", "applies to the even split; with parallel.pp_layers "
                                                        "set it to 0 and write the split you want")
    else:
        require(m.n_layers % stages == 0, "parallel.pp",
                f"pp * pp_virtual = {stages} stages do not divide model.n_layers={m.n_layers}; choose degrees "
                "that divide it, or give the layers per stage in parallel.pp_layers (e.g. [1,2])")
        split = p.stage_split(m.n_layers)
        require(stages > 1 or p.pp_offset == 0, "parallel.pp_offset", "needs a pipeline (parallel.pp > 1)")
        require(min(split) >= 1, "parallel.pp_offset",
                f"{p.pp_offset} leaves a stage without layers (split {split}); keep |pp_offset| below "
                f"{m.n_layers // stages}")
    require(p.ep == 1 or m.n_experts > 0, "parallel.ep",
            f"expert parallelism (ep={p.ep}) splits an MoE model's experts; choose model=moe-tiny or moe-small, "
            "or set parallel.ep=1")
    if m.n_experts:
        width = m.moe_ffn_hidden or m.ffn_hidden
        require(width % p.tp == 0, "parallel.tp",
                f"{p.tp} does not divide each expert's width (model.moe_ffn_hidden or ffn_hidden = {width}); "
                "choose a tp that divides it")
        require(p.ep == p.dp_shard, "parallel.ep",
                f"experts are split over the FSDP ranks (they are not FSDP-sharded themselves): set parallel.ep = "
                f"parallel.dp_shard = {p.dp_shard}")
        require(m.n_experts % p.ep == 0, "parallel.ep",
                f"{p.ep} ranks do not split model.n_experts={m.n_experts} evenly; choose an ep that divides it")
