"""What a block keeps for backward, by the stack that runs it (``cluster.saved_activations``): autograd's count
(the core, torchtitan) against Megatron-LM's with Transformer Engine, each derived here per token by hand from the
tensors the stacks' code saves (the sources are cited in ``core.config.cluster``)."""

import pytest

from core.config import ConfigError, load_config
from core.config.rules import check_runnable
from core.memory.activations import block_activation_parts

D, HEADS, KV_HEADS, F, TP, SEQ = 256, 8, 4, 512, 4, 64
KV = 2 * D * KV_HEADS // HEADS  # keys and values


def _parts(
    saved: str, precision: str, tp: int = TP, *extra: str, moe: bool = False, selective: bool = False
) -> dict[str, int]:
    cfg = load_config(
        [
            "device=GPU",
            "cluster=h100-sxm",
            "model=tiny",
            f"model.d_model={D}",
            f"model.n_heads={HEADS}",
            f"model.n_kv_heads={KV_HEADS}",
            f"model.ffn_hidden={F}",
            f"training.seq_len={SEQ}",
            "training.micro_batch_size=1",
            "training.global_batch_size=1",
            f"training.precision={precision}",
            f"parallel.tp={tp}",
            f"parallel.sp={str(tp > 1).lower()}",
            f"cluster.saved_activations={saved}",
            *extra,
        ]
    )
    assert cfg.device != "CPU"  # flash attention: no S x S matrices in the counts below
    parts = block_activation_parts(cfg, moe=moe, selective=selective)
    return {part: n // SEQ for part, n in parts.items()}  # bytes per token


def test_autograd_keeps_the_gathered_norm_outputs_and_four_mlp_tensors_in_bf16_even_under_fp8():
    bf16 = {"norm": 2 * (2 * D // TP) + 2 * (2 * D), "attention": 2 * (2 * D + KV) // TP, "mlp": 2 * 4 * F // TP}
    assert _parts("autograd", "bf16") == bf16
    assert _parts("autograd", "fp8") == bf16  # torchao's float8 linears keep their bf16 inputs


def test_megatron_keeps_the_shard_and_the_fused_swiglus_input():
    # norms' inputs and outputs as this rank's shard; SwiGLU's input (gate, up) and the down projection's input
    norm, attention = 2 * (2 * D // TP) * 2, 2 * (2 * D + KV) // TP
    assert _parts("megatron", "bf16") == {"norm": norm, "attention": attention, "mlp": 2 * 3 * F // TP}


def test_megatron_under_fp8_keeps_each_projections_fp8_copy_of_its_input():
    got = _parts("megatron", "fp8")
    # the norm outputs: FP8 row- and column-wise copies (2 bytes) of the shard, gathered again in backward
    assert got["norm"] == 2 * (2 * D // TP) + 2 * (2 * D // TP)
    # flash attention's bf16 output and the output projection's one-byte copy of it
    assert got["attention"] == 2 * (2 * D + KV) // TP + D // TP
    # the SwiGLU's bf16 input and the down projection's one-byte copy of its output
    assert got["mlp"] == (2 * 2 * F + F) // TP
    # without sequence parallelism nothing is gathered again: one byte (the column-wise copy) per norm output
    whole = _parts("megatron", "fp8", tp=1)
    assert whole["norm"] == 2 * 2 * D + 2 * D and whole["mlp"] == 2 * 2 * F + F


def test_under_fp8_megatron_routes_experts_from_bf16_and_keeps_their_fp8_copies():
    # an MoE block, no shared expert, no TP: the MLP norm's output goes to the router in bf16, not to a projection;
    # per routed token the grouped matmul's one-byte copy of its input, the expert's bf16 output, SwiGLU's input
    # and the down projection's one-byte copy of its output (capacity factor 1: top-k slots a token)
    experts, top_k, width = 4, 2, 128
    got = _parts(
        "megatron", "fp8", 1, f"model.n_experts={experts}", f"model.moe_top_k={top_k}", f"model.moe_ffn_hidden={width}",
        moe=True,
    )  # fmt: skip
    assert got["norm"] == 2 * 2 * D + D + 2 * D
    router = 4 * experts * 2  # the core's router scores, per token, in bf16 (unchanged by the stack)
    assert got["mlp"] == top_k * (D + 2 * D + 2 * 2 * width + width) + router


def test_the_core_trains_autograds_and_refuses_megatrons():
    cfg = load_config(["model=tiny", "cluster.saved_activations=megatron"])
    with pytest.raises(ConfigError, match="cluster.saved_activations"):
        check_runnable(cfg)
    with pytest.raises(ConfigError, match="cluster.saved_activations"):
        load_config(["cluster.saved_activations=deepspeed"])


MOE = ("model.n_experts=4", "model.moe_top_k=2", "model.moe_ffn_hidden=128")


def test_megatrons_recompute_modules_drop_the_norms_outputs_and_the_experts_activation():
    """--recompute-modules layernorm moe_act (output-discarding checkpoints): the norms keep only their inputs, a
    routed expert only its SwiGLU's input; under FP8 the projections then save the originals, dropped with them."""
    top_k, width, router = 2, 128, 4 * 4 * 2
    modules = ("memory.recompute=selective", "memory.recompute_modules=[layernorm,moe_act]")
    for precision in ("bf16", "fp8"):
        got = _parts("megatron", precision, 1, *MOE, *modules, moe=True, selective=True)
        assert got["norm"] == 2 * 2 * D  # the two norms' inputs, in bf16
        cast = 1 if precision == "fp8" else 2  # the grouped matmul's copy of its input
        assert got["mlp"] == top_k * (cast * D + 2 * D + 2 * 2 * width) + router
    dense = _parts(
        "megatron", "bf16", TP, "memory.recompute=selective", "memory.recompute_modules=[layernorm]", selective=True
    )
    assert dense == {**_parts("megatron", "bf16"), "norm": 2 * (2 * D // TP)}
    # where the blocks do not recompute, or under Megatron's default (core_attn: flash keeps no S x S), nothing moves
    assert _parts("megatron", "fp8", 1, *MOE, *modules, moe=True) == _parts("megatron", "fp8", 1, *MOE, moe=True)
    default = ("memory.recompute=selective", "memory.recompute_modules=[core_attn]")
    assert _parts("megatron", "bf16", TP, *default, selective=True) == _parts("megatron", "bf16")


def test_recompute_modules_are_megatrons_and_named():
    with pytest.raises(ConfigError, match="memory.recompute_modules"):  # autograd's saving has no such checkpoints
        load_config(["model=tiny", "memory.recompute_modules=[layernorm]"])
    with pytest.raises(ConfigError, match="memory.recompute_modules.*core_attn, layernorm, moe_act"):
        load_config(["model=tiny", "cluster.saved_activations=megatron", "memory.recompute_modules=[mlp]"])


def test_mindformers_select_recompute_keeps_the_gate_and_up_outputs_and_the_norms_shards():
    """MindFormers' selective (its default select_recompute and select_comm_recompute patterns): the SwiGLU's silu and
    product recomputed (gate and up outputs kept, 2F), the communication after each norm re-run (its output kept as
    this rank's sequence shard); without recompute autograd's count, and a MoE block's experts as autograd's."""
    norm_shard = 2 * (2 * D // TP) * 2  # inputs and outputs, this rank's shard, bf16
    attention = 2 * (2 * D + KV) // TP
    assert _parts("mindformers", "bf16", selective=True) == {
        "norm": norm_shard,
        "attention": attention,
        "mlp": 2 * 2 * F // TP,
    }
    assert _parts("mindformers", "bf16") == _parts("autograd", "bf16")  # nothing recomputed: autograd's
    # a MoE block's experts keep autograd's count (tp 1: the norms' outputs are this rank's whole either way)
    moe = _parts("mindformers", "bf16", 1, *MOE, moe=True, selective=True)
    assert moe == _parts("autograd", "bf16", 1, *MOE, moe=True, selective=True)
    # the core's selective keeps the gathered norm outputs and three MLP tensors
    assert _parts("autograd", "bf16", selective=True)["mlp"] == 2 * 3 * F // TP
    with pytest.raises(ConfigError, match="cluster.saved_activations: must be autograd, megatron or mindformers"):
        _parts("mindspore", "bf16")
    with pytest.raises(ConfigError, match="mindformers counts what another stack keeps"):
        check_runnable(load_config(["cluster.saved_activations=mindformers"]))
