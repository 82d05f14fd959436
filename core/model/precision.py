"""Mixed precision: where the model's values leave fp32, and how (``TrainConfig.compute_precision`` says which).

The parameters stay fp32 (the master weights the optimizer updates); each op casts its weight to the compute precision
where it uses it, so autodiff's cast-back hands the parameter an fp32 gradient (FSDP casts the shard before its gather
instead, and the gradient back to fp32 before its reduce-scatter: ``core.parallel.fsdp``). Activations run in the
compute precision from the embedding's output on: every matmul's operands and output, the residual stream, attention's
q, k, v and probabilities. Kept in fp32 whatever the precision, as MindFormers' and Megatron's defaults do: RMSNorm's
statistics, softmax, the MoE router (its matmul, scores and gates: ``moe_router_dtype``), the loss (the head's logits
are made from bf16 operands in fp32 arithmetic: ``rounded``).

Precisions (``cells.compute_precision``, a plain string that graph mode reads as a constant):
- ``fp32``: every function below is the identity;
- ``bf16``: real bf16 tensors (Ascend, GPU);
- ``bf16-emulated``: on CPU, whose MindSpore 2.10 kernels lack bf16 (``TrainConfig.compute_precision``): the same
  values rounded to bf16 and stored in fp32, each op's output rounded where an accelerator writes bf16
  (``written``), the arithmetic in fp32;
- ``fp16``: real fp16 tensors, for tests only: CPU has fp16 kernels, so the real-cast path (the one Ascend runs
  in bf16) runs here and shows any op that mixes precisions wrongly. Not a ``training.precision``: fp16 training
  wants loss scaling, which the trainer does not do.

Casts, not copies kept: a weight's compute copy lives while its op runs (and in the graph's saved inputs for
backward), as MindFormers' ``compute_dtype`` does.
"""

import mindspore as ms
from mindspore import nn

FP32, BF16, EMULATED, FP16 = "fp32", "bf16", "bf16-emulated", "fp16"
_REAL = {BF16: ms.bfloat16, FP16: ms.float16}


class Computes:
    """Mixed into the cells that cast (ops with a weight, attention, a block, a loss); ``set_precision`` sets it
    unless ``in_fp32`` (the MoE router's matmul: fp32 whatever the precision)."""

    compute_precision = FP32
    in_fp32 = False


def _split_bf16(x):
    # Veltkamp's split (Dekker 1971) at 2^16 + 1: the high part of an fp32 keeps its 8 leading significant bits,
    # rounded to nearest even, which is bf16's rounding (every normal tie pattern checked against ml_dtypes:
    # tests/unit/core/model/test_precision.py). Subnormals (|x| < 1.2e-38) round to within 2^-133; |x| > 5.2e33,
    # where x (2^16 + 1) overflows, and infinities come out NaN: a run there has diverged on any hardware.
    c = x * 65537.0
    return c - (c - x)


class _RoundBF16(nn.Cell):
    """fp32 x -> x rounded to bf16, in fp32; backward: the gradient rounded likewise (as an accelerator's bf16
    activation gradient is). Three element-wise kernels: the cast to bf16 and back took 6x as long on this CPU
    (MindSpore 2.10's bf16 -> fp32 cast: 5 ms per million elements, benchmarks/RESULTS.md, "bf16 training on CPU")."""

    def construct(self, x):
        return _split_bf16(x)

    def bprop(self, x, out, dout):
        return (_split_bf16(dout),)


# Shared, built at import: it owns no Parameter (a bprop-Cell's gradients survive jit only then: core.model.loss)
_round_bf16 = _RoundBF16()


def to_compute(x, precision: str):
    """``x`` (a weight or an activation) in the compute precision: a cast, or on CPU a rounding."""
    if precision == FP32:
        return x
    if precision == EMULATED:
        return _round_bf16(x)
    return x.astype(_REAL[precision])


def written(y, precision: str):
    """An op's output as the device writes it: emulated bf16 rounds the fp32 result of bf16 operands (an
    accelerator's output already has the compute dtype, so elsewhere this is the identity)."""
    return _round_bf16(y) if precision == EMULATED else y


def to_fp32(x, precision: str):
    """``x`` (a gradient of a compute copy) back in fp32, for an fp32 reduction: a cast where the copy was real."""
    return x.astype(ms.float32) if precision in _REAL else x


def rounded(x, precision: str):
    """``x``'s value in the compute precision, in fp32 storage (the loss: bf16 operands, fp32 arithmetic)."""
    return to_fp32(to_compute(x, precision), precision)


def set_precision(cells: list[nn.Cell], precision: str) -> None:
    """Make every ``Computes`` cell in ``cells``' trees compute in ``precision``; before anything compiles."""
    if precision not in (FP32, EMULATED, *_REAL):
        raise ValueError(f"precision must be one of fp32, bf16, bf16-emulated, fp16 (got {precision!r})")
    for root in cells:
        for _, cell in root.cells_and_names():
            if isinstance(cell, Computes) and not cell.in_fp32:
                cell.compute_precision = precision


def activation_dtype(precision: str):
    """The dtype of the activations between stages (and their gradients) in ``precision``."""
    return _REAL.get(precision, ms.float32)
