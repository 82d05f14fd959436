"""The machinery the export tables (``autoresearch.export.targets.mindformers``, ``.torchtitan``) are written in.

A ``Target`` is a list of ``Rule``s plus an explicit list of the core keys it has no counterpart for, each with the
reason. A rule carries one or more core keys (dotted, as in the resolved ``config`` of a trial summary, flattened:
``parallel.tp``) to target key paths (``parallel_config.model_parallel``) and back; the way back is what makes the
round trip testable (tests/unit/autoresearch/export/test_export.py). Rules read the whole flat config, so a value
that depends on another key (the batch on the data-parallel degree) is computed where it is written. When a target
has a key but cannot express a value (a torchtitan recipe cannot carry the core's Muon) the rule raises
``NoCounterpart`` and the exporter lists the keys with the reason in the output's header instead of dropping them.

Rules see the config in its ``canonical`` form: settings that change nothing are at their defaults and settings
that mean the same thing are spelled one way (a target cannot tell the spellings apart either), so a round trip
is exact on the canonical form.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from core.config import MemoryConfig, OptimConfig, ParallelConfig

Flat = dict[str, Any]
TRIAL_ONLY = "how the trial measured itself (logging, validation, profiling), not part of the winning config"


class NoCounterpart(Exception):
    """The target has no way to say this value; ``reason`` says why (one line, for the output's header)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class Rule:
    keys: tuple[str, ...]  # the core keys this rule carries
    paths: tuple[str, ...]  # the target keys it may write (flat, dotted)
    export: Callable[[Flat], Flat]  # canonical core config -> {target path: value}; may raise NoCounterpart
    restore: Callable[[Flat, Flat], Flat]  # (target doc, core config so far) -> {core key: value}


def same(key: str, path: str, values: dict | None = None) -> Rule:
    """One core key to one target key. ``values`` maps each core value to the target's spelling (the way back is
    its inverse); a value mapped to a ``NoCounterpart`` is one the target cannot say."""
    back = {v: k for k, v in (values or {}).items() if not isinstance(v, NoCounterpart)}

    def export(c: Flat) -> Flat:
        value = c[key]
        if values is None:
            return {path: value}
        spelled = values[value]
        if isinstance(spelled, NoCounterpart):
            raise spelled
        return {path: spelled}

    def restore(doc: Flat, core: Flat) -> Flat:
        return {key: doc[path] if values is None else back[doc[path]]}

    return Rule((key,), (path,), export, restore)


@dataclass(frozen=True)
class Target:
    name: str  # the --to choice
    title: str  # what the output is, for its header
    rules: tuple[Rule, ...]
    unmapped: dict[str, str]  # core key, or a whole section ("model"), -> why the target has no counterpart

    def mapped_keys(self) -> list[str]:
        return [k for rule in self.rules for k in rule.keys]

    def unmapped_reason(self, key: str) -> str | None:
        return self.unmapped.get(key) or self.unmapped.get(key.split(".")[0] if "." in key else "")


# --- flat <-> nested -------------------------------------------------------------------------------------------


MPIPE = (
    "MPipe Transpose is MindSpore hyper-parallel's schedule (core.parallel.pipeline.mpipe); {target} has no "
    "counterpart: run its (interleaved) 1F1B, which the trial's schedule reduces to without the transposed steps"
)


def no_mpipe(target: str) -> None:
    """Raise NoCounterpart for the mpipe schedule (no target but hyper-parallel has it; none is exported yet)."""
    raise NoCounterpart(MPIPE.format(target=target))


def transpose_rule(target: str) -> Rule:
    """mpipe's T and overflow policy: nothing to write for any other schedule (they are at their defaults then,
    ``ParallelConfig`` checks); no counterpart under mpipe."""

    def export(c: Flat) -> Flat:
        if c["parallel.pp_schedule"] == "mpipe":
            no_mpipe(target)
        return {}

    return Rule(
        ("parallel.pp_transpose_layers", "parallel.pp_transpose_overflow"),
        (),
        export,
        lambda doc, core: {"parallel.pp_transpose_layers": 0, "parallel.pp_transpose_overflow": "full"},
    )


def flatten(nested: dict, prefix: str = "") -> Flat:
    """{"parallel": {"tp": 2}} -> {"parallel.tp": 2}; lists (and what they hold) are values."""
    out: Flat = {}
    for k, v in nested.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def unflatten(flat: Flat) -> dict:
    out: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def section(flat: Flat, name: str) -> dict:
    """The keys of one section without its prefix: section(c, "parallel") -> {"tp": ..., ...}."""
    return {k.split(".", 1)[1]: v for k, v in flat.items() if k.startswith(name + ".")}


# --- what the config means: stage split, recompute per stage, the canonical spelling ---------------------------


def stage_split(c: Flat) -> list[int]:
    """Layers per pipeline stage (pp * pp_virtual of them), as the core splits them."""
    return ParallelConfig(**section(c, "parallel")).stage_split(c["model.n_layers"])


def stage_recompute(c: Flat) -> tuple[list[str], list[int | None]]:
    """Each pipeline stage's recompute setting and block count (None: all), as the core reads them
    (``MemoryConfig.recompute_of`` / ``recompute_layers_of``)."""
    memory, stages = MemoryConfig(**section(c, "memory")), range(len(stage_split(c)))
    return [memory.recompute_of(s) for s in stages], [memory.recompute_layers_of(s) for s in stages]


def split_spelling(split: list[int], n_layers: int) -> tuple[list[int] | None, int]:
    """(parallel.pp_layers, parallel.pp_offset) for a split: the even split moved by an offset when it is one
    (how the core spells it by default), else the layers per stage."""
    stages = len(split)
    if n_layers % stages == 0:
        base, k = n_layers // stages, split[0] - n_layers // stages
        even = [base] * stages
        if stages > 1:
            even[0], even[-1] = base + k, base - k
        if split == even:
            return None, k
    return list(split), 0


def recompute_spelling(settings: list[str], counts: list[int | None], split: list[int]) -> Flat:
    """memory.recompute / recompute_stages / recompute_layers / recompute_stage_layers for per-stage settings and
    per-stage block counts (None: all): a stage that recomputes none of its blocks is ``none``; one setting for all
    stages is ``recompute``; counts covering every recomputed stage's blocks are null, the first k of each
    ``recompute_layers``, and any others ``recompute_stage_layers``."""
    done = [n if k is None else min(k, n) for k, n in zip(counts, split, strict=True)]
    settings = ["none" if n and k == 0 else s for s, k, n in zip(settings, done, split, strict=True)]
    uniform = len(set(settings)) == 1
    recomputed = [(k, n) for s, k, n in zip(settings, done, split, strict=True) if s != "none"]
    first = max((k for k, _ in recomputed), default=0)
    if all(k == n for k, n in recomputed):  # every block of each recomputing stage
        layers, listed = None, None
    elif all(k == min(first, n) for k, n in recomputed):  # the first k of each
        layers, listed = first, None
    else:
        layers, listed = None, [k if s != "none" else 0 for s, k in zip(settings, done, strict=True)]
    return {
        "memory.recompute": settings[0] if uniform else DEFAULTS["memory.recompute"],
        "memory.recompute_stages": None if uniform else list(settings),
        "memory.recompute_layers": layers,
        "memory.recompute_stage_layers": listed,
    }


DEFAULTS: Flat = {f"optim.{f.name}": f.default for f in fields(OptimConfig)} | {
    f"memory.{f.name}": f.default for f in fields(MemoryConfig)
}


def canonical(c: Flat) -> Flat:
    """The config as every target reads it: settings without effect at their defaults (``decay_ratio`` outside
    WSD, ``momentum``/``ns_steps`` under AdamW, ``recompute`` when ``recompute_stages`` overrides it), and one
    spelling for equal settings (a floor of 1.0 is a constant schedule; the stage split by ``split_spelling``;
    per-stage recompute by ``recompute_spelling``; a ``swap_layers`` covering every block is null: the targets
    name blocks only, so they cannot tell the core's null, which also moves the tensors outside blocks, from it)."""
    out = dict(c)
    split = stage_split(c)
    out["parallel.pp_layers"], out["parallel.pp_offset"] = split_spelling(split, c["model.n_layers"])
    out.update(recompute_spelling(*stage_recompute(c), split))
    if c["memory.swap_layers"] is not None and c["memory.swap_layers"] >= c["model.n_layers"]:
        out["memory.swap_layers"] = None
    if out["optim.min_lr_ratio"] == 1.0:
        out["optim.schedule"] = "constant"
    if out["optim.schedule"] == "constant":
        out["optim.min_lr_ratio"] = DEFAULTS["optim.min_lr_ratio"]
    if out["optim.schedule"] != "wsd":
        out["optim.decay_ratio"] = DEFAULTS["optim.decay_ratio"]
    if out["optim.name"] != "muon":
        out["optim.momentum"], out["optim.ns_steps"] = DEFAULTS["optim.momentum"], DEFAULTS["optim.ns_steps"]
    return out


def rounded(value: float) -> float:
    """A value computed from two others (lr_end = lr * ratio, and back), rounded to 12 significant digits so that
    3e-3 * 0.1 is written as 0.0003 and comes back as 0.1, not 0.00030000000000000003 and 0.10000000000000002."""
    return float(f"{value:.12g}")


# --- export and import -----------------------------------------------------------------------------------------


@dataclass
class Exported:
    doc: dict  # the target's nested document
    dropped: dict[str, tuple[Any, str]]  # core key -> (its value in the trial, why it is not in doc)


def export_config(target: Target, c: Flat) -> Exported:
    """The target's document for a resolved core config (flat), and every key it does not carry, with why."""
    canon = canonical(c)
    written: Flat = {}
    dropped: dict[str, tuple[Any, str]] = {}
    for rule in target.rules:
        try:
            values = rule.export(canon)
        except NoCounterpart as exc:
            dropped.update({k: (c[k], exc.reason) for k in rule.keys})
            continue
        stray = set(values) - set(rule.paths)
        assert not stray, f"rule for {rule.keys} wrote {stray}, not among its paths {rule.paths}"
        written.update(values)
    mapped = set(target.mapped_keys())
    for key in c:
        if key not in mapped:
            reason = target.unmapped_reason(key)
            if reason is None:  # a new core key: the table must say where it goes (the coverage test fails too)
                raise KeyError(
                    f"{target.name}: core key {key} is neither mapped nor listed as unmapped in "
                    f"autoresearch/export/targets/{target.name}.py"
                )
            dropped[key] = (c[key], reason)
    return Exported(unflatten(written), {k: dropped[k] for k in c if k in dropped})


def import_config(target: Target, doc: dict, base: Flat) -> Flat:
    """The core config a target document says, on top of ``base`` (a flat core config) for what it does not say
    (the model, above all). Rules whose keys are absent from the document keep the base's values."""
    flat = flatten(doc)
    out = dict(base)
    for rule in target.rules:
        if rule.paths and not any(p in flat for p in rule.paths):
            continue
        out.update(rule.restore(flat, out))
    return out
