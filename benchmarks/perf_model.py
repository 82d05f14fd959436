"""The step-time model (``core.perf``) against published training runs (``benchmarks/data/published_runs.yaml``).

    python benchmarks/perf_model.py [--out benchmarks/data/perf_model.md]

For each device profile one named row fits ``cluster.matmul_efficiency`` (bisection until the predicted figure
equals the published one; ``FIT``); every other row is held out: predicted from its model, layout, batch,
precision and recompute with that efficiency, and compared with what its source measured, in the source's own
metric (tokens/s per GPU; or TFLOP/s per GPU by the source's FLOP formula; or MFU). Rows the model cannot
represent are listed with the reason and not scored: pipeline rows whose micro-batch size is not published,
models that change the architecture (MegaScale's parallel blocks). FP8 rows (torchtitan's Float8Linear, Megatron's
Transformer Engine recipes) are predicted as ``training.precision=fp8``, with the efficiency fitted on bf16 rows:
none is fitted. Mixture-of-experts rows (DeepSeek-V3, Qwen3 MoE) are scored where the core can express their
layout (its experts split over its FSDP ranks and by tensor parallelism). Megatron rows count the activations
Megatron keeps (``cluster.saved_activations=megatron``); a row that does not state its recompute is read with the
least the memory model says fits its device.

Reported: median and worst |error| on the held-out rows (and on the FP8 and MoE ones apart), for every pair of held-out
rows of one source, model and device count that differ only in layout or schedule whether the model orders them as
measured, for every pair that differs only in precision (bf16 against FP8) the speed-up published and predicted,
peak memory against the rows that publish it, and how many rows that ran are predicted not to fit their device.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.config import ConfigError  # noqa: E402
from core.perf import estimate_step, fits_device  # noqa: E402
from core.perf import planned_config as load  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "published_runs.yaml"
# One row per device profile fits its matmul efficiency (at most one per device, named here).
FIT = {
    "h100-hbm2e-96gb": "tt-llama3.1-8b-fsdp-8gpu-compile-bf16",
    "h100-sxm": "mcore-2024-gpt-7.1b-tp2-pp1-dp48-96gpu",
    "a100-80gb": "mlm-sc21-t1-gpt-1.7b-tp1-pp1-32gpu",
    "ascend-910b": "ms-llama2-7b-bf16-dp8-800ta2",
}
# The published rows' devices as this project's profiles, with what a row's notes say differs.
DEVICES = {
    # Meta's Grand Teton H100: 96 GB HBM2e at 2.4 TB/s, 500 W (the rows' notes; torchtitan's doc)
    "h100-hbm2e-96gb": ("h100-sxm", ["cluster.memory_gib=96", "cluster.memory_bandwidth_gbps=2400"]),
    "h100-sxm": ("h100-sxm", []),
    "h200": ("h200", []),
    "a100-80gb": ("a100-80gb", []),
    "a100": ("a100-80gb", []),  # MegaScale: "NVIDIA Ampere", memory not stated
    "ascend-910b": ("ascend-910b", []),
}
PRESETS = {
    "llama3.1-8b": "llama3-8b",
    "llama3-8b": "llama3-8b",
    "llama3.1-70b": "llama3-70b",
    "llama3-70b": "llama3-70b",
    "llama3.1-405b": "llama3.1-405b",
    "llama2-7b": "llama2-7b",
    "llama2-13b": "llama2-13b",
    "llama2-70b": "llama2-70b",
    "deepseek-v3": "deepseek-v3",
    "qwen3-30b-a3b": "qwen3-30b-a3b",
    "qwen3-235b-a22b": "qwen3-235b-a22b",
}
# The torchtitan releases that compiled the loss under training.compile (cluster.loss=compiled: components/loss.py at
# 820504e and e7c0cae); the 2024 ones ran it eagerly (train.py at 9dec370: "compiling loss function causes CUDA
# errors, turning off for now"; at 3faaa1a not compiled at all).
COMPILED_LOSS = ("torchtitan-asynctp-202506", "torchtitan-h200-trainy-202506")
# The attention kernel of torchtitan's Hopper runs from December 2024 to June 2025: SDPA's FlashAttention-2, as PyTorch
# made cuDNN attention opt-in (pytorch/pytorch#138522, 2.5.1) until 2.9 (#162073); on a 2.6 nightly SDPA measured
# 329 TFLOP/s on an H100 against cuDNN's 631 (#142132), on a 2.7 nightly torchtitan still dispatched FLASH_ATTENTION
# (pytorch/torchtitan#1042). Its rates on an H100 SXM5, head dim 128, 16k tokens, TFLOP/s (forward causal,
# backward): the FlashAttention-3 paper, arXiv:2407.08608, Fig. 5 and 6. (The 2024-08 runs' PyTorch may have
# preferred cuDNN, then the default on H100 for 2.5: not set for them.)
FA2_HOPPER = (335, 322)
FA2_SOURCES = ("torchtitan-perf-202412", "torchtitan-asynctp-202506", "torchtitan-h200-trainy-202506")
# Schedule names of the sources, as the core's. MindSpore's pipeline runs 1F1B (MindFormers' docs).
SCHEDULES = {"interleaved_1f1b": "interleaved", "Interleaved1F1B": "interleaved", "mindspore_pipeline": "1f1b"}
GPT_VOCAB = 51200  # Megatron's GPT vocabulary, padded (the SC'21 runs): for a row that records none
# The sources whose TFLOP/s count the recompute's FLOPs (hardware FLOPs: Narayanan et al. 2021, eq. 3, and the 2021
# README's table of the same runs); Megatron-Core's README of 2024 reports what megatron/training/training.py's
# num_floating_point_operations counts: the model's FLOPs, forward and backward, no recompute.
SC21_FLOPS = ("megatron-sc21-paper", "megatron-sc21-scripts", "megatron-readme-2021")


def distributed_optimizer(row: dict) -> bool:
    """Whether a Megatron row ran its distributed optimizer: flagged so, or implied by --overlap-param-gather, which
    megatron/training/arguments.py (validate_args) refuses without --use-distributed-optimizer."""
    return any(f in row["flags"] for f in ("distributed_optimizer", "overlap_param_gather"))


def precision(row: dict) -> str:
    """fp8 where the row's matmuls ran in FP8 (its precision, a float8 flag or an FP8 label), else bf16 (fp16's
    rows too: the same peak)."""
    fp8 = row["precision"] == "fp8" or any("float8" in f or f.startswith("precision_label=FP8") for f in row["flags"])
    return "fp8" if fp8 else "bf16"


def skip_reason(row: dict) -> str | None:
    if row["source"].startswith("megatron-bridge") and row["precision"] is None:
        return "precision not published (the next release labels the same configs FP8)"
    if "parallel_transformer_block" in row["flags"]:
        return "MegaScale changes the block (parallel attention and MLP, sliding windows): another model"
    if row["layout"]["pp"] > 1 and row["micro_batch_size"] is None and not row["source"].startswith("mcore"):
        return "pipeline micro-batch size not published"
    if any(f == "phase=sft" for f in row["flags"]):
        return "fine-tuning with packed/variable sequences"
    if "recompute_not_published" in row["flags"]:
        return "recompute not published"
    if row["layout"]["cp"] > 1 and row["source"].startswith(("megatron", "mcore")):
        if not distributed_optimizer(row):  # under ZeRO-1 (dp_shard_strategy=optim) weights stay whole
            return (
                "Megatron keeps the weights whole over its context-parallel ranks; the core shards them over cp as FSDP"
            )
    return None


def overrides(row: dict, efficiency: float | None) -> list[str]:
    lay, m = row["layout"], row["model"]
    profile, extra = DEVICES[row["device"]]
    gpus, per_node = row["gpus"], row.get("gpus_per_node") or 8
    out = [f"cluster={profile}", f"cluster.nodes={math.ceil(gpus / per_node)}", f"cluster.devices_per_node={per_node}"]
    out += extra
    if gpus % per_node:
        out[1:3] = ["cluster.nodes=1", f"cluster.devices_per_node={gpus}"]
    if efficiency is not None:
        out.append(f"cluster.matmul_efficiency={efficiency}")
    if row["source"].startswith(("megatron", "mcore")):
        out.append("cluster.saved_activations=megatron")  # its own autograd functions keep less (core.memory)
        if "grad_reduce_fp32" not in row["flags"]:
            # Megatron reduces fp16 gradients in fp16 (the SC'21 rows); bf16 ones in fp32 unless
            # --grad-reduce-in-bf16, as the rows flagged grad_reduce_fp32 leave them
            out.append("cluster.reduce_precision=bf16")
    if row["source"].startswith("torchtitan"):  # PyTorch's cross-entropy, eager or compiled (core.config.cluster)
        compiled = row["source"] in COMPILED_LOSS and "torch.compile" in row["flags"]
        out.append(f"cluster.loss={'compiled' if compiled else 'eager'}")
    if row["source"] in FA2_SOURCES:
        out += [f"cluster.attention_tflops_fwd={FA2_HOPPER[0]}", f"cluster.attention_tflops_bwd={FA2_HOPPER[1]}"]
    if row["source"].startswith("mindformers"):  # its select (comm) recompute (core.config.cluster)
        out.append("cluster.saved_activations=mindformers")
    if any(f in row["flags"] for f in ("param_init_type=bfloat16", "param_init_type=float16")):
        # MindFormers' 16-bit weights: no fp32 masters, 16-bit gradients reduced as they are (core.config.cluster)
        out += ["cluster.master_weights=false", "cluster.reduce_precision=bf16"]
    if any(f in row["flags"] for f in ("deepep", "te_deepep")):
        out.append("cluster.ep_dedup=true")  # DeepEP's dispatch: a token crosses to each remote node once
    if any(f in row["flags"] for f in ("async_tp", "tp_comm_overlap")):
        out.append("cluster.overlap_tp=1.0")  # the run hides TP traffic under compute (its flag)
    if "ep_a2a_1f1b_overlap" in row["flags"]:
        out.append("cluster.overlap_ep=1.0")  # the run hides the experts' all-to-alls under 1F1B's compute
    if m.get("name") in PRESETS:
        out.append(f"model={PRESETS[m['name']]}")
        if "mtp_layers" in m:
            out.append(f"model.mtp_layers={m['mtp_layers']}")
    else:  # a Megatron GPT: GELU MLP of 4h as a SwiGLU of the same FLOPs (3 h F = 8 h^2)
        h, tp = m["d_model"], lay["tp"]
        heads = m["n_heads"] or h // 128  # unpublished: GPT-3 175B's head dimension, 128 (Brown et al. 2020)
        ffn = round(8 * h / 3 / (64 * tp)) * 64 * tp
        out += [
            "model=tiny",
            f"model.vocab_size={m.get('vocab_size') or GPT_VOCAB}",  # as the row records it
            f"model.n_layers={m['n_layers']}",
            f"model.d_model={h}",
            f"model.n_heads={heads}",
            f"model.n_kv_heads={heads}",
            f"model.ffn_hidden={ffn}",
            "model.tie_embeddings=false",
        ]
    seq, micro = row["seq_len"], row["micro_batch_size"] or 1
    out += [f"model.max_seq_len={seq}", f"training.seq_len={seq}", f"training.precision={precision(row)}"]
    out += [f"training.global_batch_size={row['global_batch_sequences']}", f"training.micro_batch_size={micro}"]
    degrees = {key: lay[key] for key in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")}
    if "parallel_optimizer" in row["flags"]:
        # MindSpore's optimizer parallel stores the weights and the optimizer state sliced over the data-parallel
        # ranks and gathers each weight by an AllGather the framework inserts before its use (MindSpore docs,
        # features/parallel/optimizer_parallel.md): the core's sharded data parallelism, not replicas
        degrees["dp_shard"], degrees["dp_replicate"] = degrees["dp_shard"] * degrees["dp_replicate"], 1
    if distributed_optimizer(row):
        # Megatron's distributed optimizer (--use-distributed-optimizer): ZeRO-1 over the data-parallel ranks
        degrees["dp_shard"], degrees["dp_replicate"] = degrees["dp_shard"] * degrees["dp_replicate"], 1
        out.append("parallel.dp_shard_strategy=optim")
    elif degrees["ep"] > 1 and degrees["dp_shard"] == 1:
        # the core splits the experts over its FSDP ranks (parallel.ep = dp_shard): a replicated MoE row's data
        # parallelism is read as FSDP, whose dense weights' gathers the row (a distributed optimizer) did not pay
        degrees["dp_shard"], degrees["dp_replicate"] = degrees["dp_replicate"], 1
    out += [f"parallel.{key}={value}" for key, value in degrees.items()]
    if "etp=1" in row["flags"]:  # experts whole under TP: Megatron's MoE parallel folding (estimated, not trained)
        out.append("parallel.etp=1")
    sp = lay["tp"] > 1 if lay["sp"] is None else bool(lay["sp"])  # as the row states it; unstated: with tp
    out.append(f"parallel.sp={str(sp).lower()}")
    if lay["pp"] > 1:
        virtual = _virtual(row, lay)
        schedule = SCHEDULES.get(lay.get("pp_schedule"), lay.get("pp_schedule"))
        out += [f"parallel.pp_schedule={schedule or ('interleaved' if virtual > 1 else '1f1b')}"]
        out += [f"parallel.pp_virtual={virtual}"]
        if lay.get("pp_layers"):
            out.append(f"parallel.pp_layers=[{','.join(map(str, lay['pp_layers']))}]")
    recompute = row["activation_checkpointing"] or _least_recompute(out)
    if recompute == "selective" and row["source"].startswith("torchtitan") and "ac_selective_layer" not in row["flags"]:
        recompute = "selective_op"  # torchtitan's selective_ac_option=op, its default (the rows' notes)
    out.append(f"memory.recompute={recompute}")
    if recompute == "selective" and row["source"].startswith(("megatron", "mcore")):
        # Megatron's selective recompute is what --recompute-modules names: core_attn unless the row says
        modules = "layernorm,moe_act" if "recompute_norm_act" in row["flags"] else "core_attn"
        out.append(f"memory.recompute_modules=[{modules}]")
    counts = [f.split("=", 1)[1] for f in row["flags"] if f.startswith("select_recompute=")]
    if counts:  # MindFormers' recompute per stage: the first this many blocks of each (its config's select_recompute)
        out.append(f"memory.recompute_stage_layers={counts[0]}")
    return out


def _least_recompute(out: list[str]) -> str:
    """A row that does not say whether it recomputed: the least recompute the memory model says fits its device,
    as whoever ran it had to choose (none, else full: on accelerators selective recompute frees nothing the model
    counts, flash attention never forming the S x S matrices); none if neither fits, and the row is reported over."""
    for recompute in ("none", "full"):
        if fits_device(load([*out, f"memory.recompute={recompute}"])):
            return recompute
    return "none"


def _virtual(row: dict, lay: dict) -> int:
    for flag in row["flags"]:
        if flag.startswith("num_layers_per_virtual_pipeline_stage="):
            per = int(flag.split("=")[1])
            return max(1, row["model"]["n_layers"] // (lay["pp"] * per))
    return lay.get("pp_virtual") or 1


def measured(row: dict) -> tuple[str, float]:
    """The row's figure and its metric: tokens/s per GPU where published, else TFLOP/s per GPU, else MFU."""
    got = row["measured"]
    for metric in ("tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu"):
        if got.get(metric) is not None:
            return metric, float(got[metric])
    raise ValueError(row["id"])


def megatron_flops(row: dict, cfg, *, recompute: bool) -> float:
    """FLOPs per iteration by Megatron's formula (Narayanan et al. 2021, eq. 3): 96 B s l h^2 (1 + s / 6h +
    V / 16 l h) with full recompute, 72 B s l h^2 (1 + s / 6h + V / 12 l h) without."""
    B, s, l, h, V = (
        cfg.training.global_batch_size,
        cfg.training.seq_len,
        cfg.model.n_layers,
        cfg.model.d_model,
        cfg.model.vocab_size,
    )
    if recompute:
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def predicted(row: dict, efficiency: float) -> tuple[float, object]:
    cfg = load(overrides(row, efficiency))
    est = estimate_step(cfg)
    metric, _ = measured(row)
    if metric == "tokens_per_sec_per_gpu":
        return est.tokens_per_sec_per_device, est
    if metric == "mfu" and not row["source"].startswith("llama3"):
        flops = megatron_flops(row, cfg, recompute=False)
        return flops / est.step_time_sec / row["gpus"] / (cfg.cluster.peak_tflops_bf16 * 1e12), est
    if metric == "mfu":
        return est.mfu, est
    if row["source"] in SC21_FLOPS:  # counts recompute when the run recomputes
        flops = megatron_flops(row, cfg, recompute=(row["activation_checkpointing"] or "full") == "full")
        return flops / est.step_time_sec / row["gpus"] / 1e12, est
    if row["source"].startswith(("megatron", "mcore")):  # Megatron-Core's model FLOPs, no recompute
        return megatron_flops(row, cfg, recompute=False) / est.step_time_sec / row["gpus"] / 1e12, est
    return est.mfu * cfg.cluster.peak_tflops_bf16, est  # Llama 3: BF16 model TFLOP/s


def fit(row: dict) -> float:
    """The matmul efficiency at which the model predicts ``row``'s published figure (bisection)."""
    target = measured(row)[1]
    low, high = 0.05, 1.0
    for _ in range(40):
        mid = (low + high) / 2
        if predicted(row, mid)[0] < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "data" / "perf_model.md")
    args = ap.parse_args(argv)
    runs = yaml.safe_load(DATA.read_text())["runs"]
    by_id = {r["id"]: r for r in runs}
    efficiency = {device: fit(by_id[row]) for device, row in FIT.items()}
    efficiency["h200"] = efficiency["h100-sxm"]  # the same chip; no H200 row is fitted
    efficiency["a100"] = efficiency["a100-80gb"]
    for profile in ("h100-sxm", "h200", "a100-80gb", "ascend-910b"):
        written = yaml.safe_load((ROOT / "configs" / "cluster" / f"{profile}.yaml").read_text())["matmul_efficiency"]
        if abs(written - efficiency[profile]) > 0.0005:
            print(
                f"configs/cluster/{profile}.yaml: matmul_efficiency {written} is not this fit's "
                f"{efficiency[profile]:.3f}; write the fit there"
            )
    lines = [
        "| row | device | metric | published | predicted | error | fitted? | memory GiB published / predicted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    memory_errors, over = [], []  # over: rows that ran, predicted not to fit their device
    scored, skipped, results = [], [], {}
    for row in runs:
        reason = skip_reason(row)
        if reason:
            skipped.append((row["id"], reason))
            continue
        try:
            value, est = predicted(row, efficiency[row["device"]])
        except ConfigError as e:
            skipped.append((row["id"], f"the core refuses the layout: {e}"))
            continue
        metric, published = measured(row)
        error = value / published - 1
        fitted = row["id"] in FIT.values()
        results[row["id"]] = value
        if not fitted:
            scored.append((row, error))
        gib = est.peak_memory_bytes_per_rank / 2**30
        memory = row["measured"].get("memory_gib")
        if memory:
            memory_errors.append(gib / memory - 1)
        if not est.fits:
            over.append(est.peak_memory_bytes_per_rank / est.memory_bytes_per_device - 1)
        lines.append(
            f"| {row['id']} | {row['device']} | {metric} | {published:g} | {value:.4g} | {error:+.1%} | "
            f"{'fitted' if fitted else 'held out'} | {memory or '-'} / {gib:.1f} |"
        )
    pairs = _pairs(runs, results)
    only = [p for p in pairs if not p[-1]]  # the pairs: nothing but layout or schedule differs
    others = [p for p in pairs if p[-1]]
    fp8 = [e for row, e in scored if precision(row) == "fp8"]
    moe = [e for row, e in scored if row["model"].get("n_experts")]
    speedups = _precision_pairs(runs, results)
    summary = [
        "efficiencies: "
        + ", ".join(
            f"{d} {e:.3f} ({FIT.get(d, 'as ' + ('h100-sxm' if d == 'h200' else 'a100-80gb'))})"
            for d, e in efficiency.items()
        ),
        f"held-out rows: {len(scored)}; median |error| {statistics.median(abs(e) for _, e in scored):.1%}, "
        f"worst {max(abs(e) for _, e in scored):.1%}",
        f"of them FP8: {len(fp8)}; median |error| {statistics.median(abs(e) for e in fp8):.1%}, worst "
        f"{max(fp8, key=abs):+.1%}",
        f"of them mixture-of-experts: {len(moe)}; median |error| {statistics.median(abs(e) for e in moe):.1%}, worst "
        f"{max(moe, key=abs):+.1%}",
        f"pairs differing only in layout or schedule: {sum(p[4] for p in only)} of {len(only)} ordered as measured; "
        f"pairs whose layouts differ and other settings too: {sum(p[4] for p in others)} of {len(others)}",
        f"pairs differing only in precision: {len(speedups)}; FP8's speed-up over bf16, median published "
        f"{statistics.median(pub for *_, pub, _ in speedups):.2f}x, predicted "
        f"{statistics.median(pred for *_, pred in speedups):.2f}x",
        f"peak memory against the {len(memory_errors)} rows that publish it (nothing fitted): median |error| "
        f"{statistics.median(abs(e) for e in memory_errors):.1%}, worst {max(memory_errors, key=abs):+.1%}",
        f"rows that ran but are predicted not to fit their device's memory: {len(over)} of {len(results)}"
        + (f", by {min(over):+.0%} to {max(over):+.0%}" if over else ""),
    ]
    text = "\n".join(["# Step-time model against published runs", "", *summary, "", *lines, "", "Pairs:", ""])
    text += "\n".join(
        f"- {a} vs {b}: published {pa:g} vs {pb:g}, {'right' if ok else 'WRONG'}"
        + (f" (differ also in {other})" if other else "")
        for a, b, pa, pb, ok, other in pairs
    )
    text += "\n\nFP8 against bf16 (speed-up published, predicted):\n\n" + "\n".join(
        f"- {b} vs {a}: {pub:.2f}x, {pred:.2f}x" for a, b, pub, pred in speedups
    )
    text += "\n\nNot scored:\n\n" + "\n".join(f"- {i}: {why}" for i, why in skipped) + "\n"
    args.out.write_text(text)
    print("\n".join(summary))
    return 0


def _pairs(runs: list[dict], results: dict) -> list[tuple]:
    """(id, id, published, published, ordered as measured?, what else differs) for held-out rows of one source,
    release, model and GPU count whose layout or schedule differs (degrees, pipeline split and schedule, micro-batch,
    the sharding strategy its flags name); what else differs (``_other_settings``) is empty for the pairs that
    differ in nothing else, the issue's criterion."""
    out = []
    scored = [r for r in runs if r["id"] in results and r["id"] not in FIT.values()]
    for i, a in enumerate(scored):
        for b in scored[i + 1 :]:
            same = all(a[k] == b[k] for k in ("source", "gpus", "seq_len", "precision", "device"))
            same = same and a["model"] == b["model"] and _release(a) == _release(b)
            if not same or a["layout"] == b["layout"] or measured(a)[0] != measured(b)[0]:
                continue
            pa, pb = measured(a)[1], measured(b)[1]
            if pa == pb:
                continue
            ok = (pa > pb) == (results[a["id"]] > results[b["id"]])
            out.append((a["id"], b["id"], pa, pb, ok, _other_settings(a, b)))
    return out


# Flags that name how a row's data parallelism shards (ZeRO-3, Megatron's distributed optimizer or its FSDP): its
# layout, as its degrees are.
LAYOUT_FLAGS = {"zero3", "distributed_optimizer", "megatron_fsdp"}


def _other_settings(a: dict, b: dict) -> str:
    """What differs between two rows besides their layout and schedule: the global batch, the recompute they state
    and their run's options (flags: an expert dispatcher, an overlap, ...); "" when nothing does."""
    out = []
    if a["global_batch_sequences"] != b["global_batch_sequences"]:
        out.append(f"global batch {a['global_batch_sequences']} / {b['global_batch_sequences']}")
    if a["activation_checkpointing"] != b["activation_checkpointing"]:
        out.append(f"recompute {a['activation_checkpointing']} / {b['activation_checkpointing']}")
    fa, fb = set(a["flags"]) - LAYOUT_FLAGS, set(b["flags"]) - LAYOUT_FLAGS
    if fa != fb:
        out.append("options " + " / ".join(", ".join(sorted(f)) or "none" for f in (fa - fb, fb - fa)))
    return "; ".join(out)


def _release(row: dict) -> str | None:
    """The software release a row was measured with, where its source publishes several (Megatron-Bridge's
    containers: the same layout moves by up to 1.8x between them)."""
    found = re.search(r"Release '+([^']+)'", row["table"])
    return found.group(1) if found else None


def _precision_pairs(runs: list[dict], results: dict) -> list[tuple]:
    """(bf16 row, FP8 row, published speed-up, predicted speed-up) for scored rows of one source, model, device,
    GPU count, sequence, batch, layout, recompute and flags (FP8's own aside) that differ in precision."""
    keys = ("source", "gpus", "seq_len", "device", "model", "layout", "global_batch_sequences", "micro_batch_size")
    keys += ("activation_checkpointing",)

    def flags(row: dict) -> set[str]:
        return {f for f in row["flags"] if not ("float8" in f or "fp8" in f or f.startswith("precision_label="))}

    scored = [r for r in runs if r["id"] in results]
    out = []
    for a in scored:
        for b in scored:
            same = all(a[k] == b[k] for k in keys) and flags(a) == flags(b)
            if precision(a) == "bf16" and precision(b) == "fp8" and same:
                if measured(a)[0] == measured(b)[0]:
                    pub = measured(b)[1] / measured(a)[1]
                    out.append((a["id"], b["id"], pub, results[b["id"]] / results[a["id"]]))
    return out


if __name__ == "__main__":
    sys.exit(main())
