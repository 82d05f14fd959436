"""The memory estimate by precision: bf16 keeps fp32 master weights, gradients and states beside a bf16 compute
copy (gathered by FSDP instead of kept), halves the saved activations, and on accelerators counts flash attention
(no S x S matrices) and in-place gradient accumulation. Counted here from the parameter shapes directly."""

import math

import pytest

from core.config import ConfigError, load_config
from core.config.rules import check_runnable
from core.memory.estimate import terms
from core.model.flops import param_shapes
from core.parallel.placement import is_expert, layout_placement


def _cfg(*overrides, device="GPU"):
    return load_config([f"device={device}", "model=small", "training.seq_len=128", *overrides])


def test_bf16_adds_a_compute_copy_without_fsdp_and_halves_activations():
    numel = sum(math.prod(s) for s in param_shapes(_cfg().model).values())
    fp32, bf16 = terms(_cfg()), terms(_cfg("training.precision=bf16"))
    assert fp32.params == 4 * numel
    assert bf16.params == 4 * numel + 2 * numel
    assert bf16.grads == fp32.grads == 4 * numel and bf16.optimizer == fp32.optimizer == 8 * numel
    assert bf16.activations * 2 == fp32.activations
    assert bf16.scores == fp32.scores == 0  # flash attention on an accelerator


def test_fsdp_gathers_the_bf16_copy_instead_of_keeping_it():
    sharded = terms(_cfg("training.precision=bf16", "parallel.dp_shard=2"))
    whole = terms(_cfg("training.precision=bf16"))
    assert sharded.params < whole.params / 2  # fp32 shards only
    largest = max(math.prod(s) for s in param_shapes(_cfg().model).values())
    assert sharded.gathered == 2 * largest  # the largest weight, gathered in bf16


def test_cpu_keeps_its_measured_accounting():
    cpu = terms(_cfg(device="CPU"))
    assert cpu.scores > 0  # no flash attention on the CPU: the S x S matrices are saved
    accumulating = terms(_cfg("training.micro_batch_size=4", "training.global_batch_size=8", device="CPU"))
    assert accumulating.grads == 3 * cpu.params  # the old sum, the new gradient and the new sum


def test_cpu_emulates_bf16_and_counts_it_as_fp32():
    cpu = _cfg("training.precision=bf16", device="CPU")
    check_runnable(cpu)  # runs: bf16's values in fp32 storage (TrainConfig.compute_precision)
    assert (cpu.compute_precision, _cfg("training.precision=bf16").compute_precision) == ("bf16-emulated", "bf16")
    assert terms(cpu) == terms(_cfg(device="CPU"))
    assert terms(cpu) != terms(_cfg("training.precision=bf16"))


def test_swap_keeps_one_block_in_the_activations_precision():
    """SWAP moves every block's saved tensors and brings one back at a time: what stays is one block of the
    activations it is taken from, bf16 with flash attention on an accelerator (the moved parts were once counted in
    fp32 without flash, which left a negative residue)."""
    swap = ("training.mode=pynative", "memory.swap=true")
    for precision in ("fp32", "bf16"):
        kept = terms(_cfg(f"training.precision={precision}", *swap))
        every = terms(_cfg(f"training.precision={precision}", "training.mode=pynative"))
        assert kept.recomputed * _cfg().model.n_layers == every.activations > 0
    assert terms(_cfg("training.precision=bf16", *swap)).recomputed * 2 == terms(_cfg(*swap)).recomputed


def test_a_whole_gradient_is_held_in_the_precision_it_is_reduced_in():
    """Megatron's gradient buffer takes the reduction's dtype (grad_reduce_in_fp32): a gradient kept whole is counted
    at cluster.reduce_precision on accelerators; FSDP's shards land in the fp32 masters' gradients, and the CPU
    keeps its fp32 gradients."""
    numel = sum(math.prod(s) for s in param_shapes(_cfg().model).values())
    assert terms(_cfg("training.precision=bf16")).grads == 4 * numel
    assert terms(_cfg("training.precision=bf16", "cluster.reduce_precision=bf16")).grads == 2 * numel
    shards = [
        _cfg("training.precision=bf16", "parallel.dp_shard=2", f"cluster.reduce_precision={p}")
        for p in ("fp32", "bf16")
    ]
    assert terms(shards[0]).grads == terms(shards[1]).grads < 4 * numel
    assert terms(_cfg("cluster.reduce_precision=bf16", device="CPU")).grads == 4 * numel


def test_folded_experts_keep_fp32_shards_beside_whole_dense_gradients():
    """A layout that shards some weights and keeps others whole (folded experts: FSDP over the 2 ranks holding the
    same experts, the dense weights split by tp only) holds each gradient by its own weight's sharding: only the
    dense ones move with cluster.reduce_precision."""
    layout = ("model=moe-small", "training.precision=bf16", "parallel.tp=4", "parallel.sp=true")
    layout += ("parallel.ep=2", "parallel.etp=1")
    fp32, bf16 = (_cfg(*layout, f"cluster.reduce_precision={p}") for p in ("fp32", "bf16"))
    assert fp32.parallel.expert_dp == 2 and fp32.parallel.dp_shard == 1
    dense = sum(
        layout_placement(name, shape, 4, 1, ep=2).local_numel
        for name, shape in param_shapes(fp32.model).items()
        if not is_expert(name)
    )
    assert terms(fp32).grads - terms(bf16).grads == 2 * dense > 0


def test_the_logits_are_held_as_the_stacks_loss_holds_them():
    """Bytes a logit holds at the loss's peak (cluster.loss), by hand for model=small's head (this rank's tokens x
    its vocabulary): the core's fused loss the logits and their fp32 copy; PyTorch's eager cross-entropy the fp32
    log-softmax output, its gradient and the input's; a compiled loss the logits and their gradient."""
    cfg = _cfg()
    n = cfg.training.micro_batch_size * cfg.training.seq_len * cfg.model.vocab_size
    expected = {("fp32", "fused"): 4, ("bf16", "fused"): 2 + 4, ("fp32", "eager"): 3 * 4, ("bf16", "eager"): 3 * 4}
    expected |= {("fp32", "compiled"): 2 * 4, ("bf16", "compiled"): 2 * 2}
    for (precision, loss), per_logit in expected.items():
        got = terms(_cfg(f"training.precision={precision}", f"cluster.loss={loss}")).logits
        assert got == per_logit * n, (precision, loss)
    with pytest.raises(ConfigError, match="cluster.loss"):  # the core trains its own loss only
        check_runnable(_cfg("cluster.loss=eager", device="CPU"))
    with pytest.raises(ConfigError, match="cluster.loss: must be fused, eager or compiled"):
        _cfg("cluster.loss=chunked")


def test_weights_without_masters_are_held_in_16_bits():
    """MindFormers' 16-bit weights (cluster.master_weights=false): by hand from the parameter count, the weights and
    their gradients 2 bytes each, no compute copy, the states fp32 (8 bytes) as with masters; FSDP keeps 16-bit
    shards of the weights and gradients. The rules refuse it where it cannot hold: fp32 compute, 32-bit gradient
    reductions, and the core's own training (fp32 masters)."""
    numel = sum(math.prod(s) for s in param_shapes(_cfg().model).values())
    no_masters = ("training.precision=bf16", "cluster.master_weights=false", "cluster.reduce_precision=bf16")
    whole = terms(_cfg(*no_masters))
    assert (whole.params, whole.grads, whole.optimizer) == (2 * numel, 2 * numel, 8 * numel)
    with_masters = terms(_cfg("training.precision=bf16", "cluster.reduce_precision=bf16"))
    assert (with_masters.params, with_masters.grads) == (6 * numel, 2 * numel)  # master + copy; reduced in bf16
    sharded = terms(_cfg(*no_masters, "parallel.dp_shard=2"))
    shard = sum(layout_placement(name, shape, 1, 2).shard_len for name, shape in param_shapes(_cfg().model).items())
    assert (sharded.params, sharded.grads, sharded.optimizer) == (2 * shard, 2 * shard, 8 * shard)
    with pytest.raises(ConfigError, match="cluster.master_weights: false stores the weights in 16 bits"):
        _cfg("cluster.master_weights=false", "cluster.reduce_precision=bf16")
    with pytest.raises(ConfigError, match="cluster.reduce_precision: must be bf16 with cluster.master_weights"):
        _cfg("training.precision=bf16", "cluster.master_weights=false")
    with pytest.raises(ConfigError, match="cluster.master_weights"):  # the core trains with fp32 masters
        check_runnable(_cfg(*no_masters, device="CPU"))
