"""Activation recompute: activations dropped after the forward pass and computed again for the backward (Chen et al.
2016, "Training Deep Nets with Sublinear Memory Cost"; selective: Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models").

``memory.recompute`` over the first ``memory.recompute_layers`` blocks (of the model, or of each pipeline stage; or
as many as ``memory.recompute_stage_layers`` counts for each stage):

- ``selective``: the parts that are cheap to compute and costly to keep — the RMS norms, the SwiGLU product and
  attention's scores and softmax (per head a (S, S) pair, which dominates at long sequences) — save only their inputs,
  the matmul and communication outputs they are computed from, and run again in backward. Each is wrapped in a
  bprop-Cell whose bprop re-runs its forward under ``GradOperation`` (the form whose gradients survive
  ``mindspore.jit``, docs/mindspore-cpu.md), so the same mechanism serves jit and PyNative. It saves memory in
  PyNative; under jit on CPU it adds some (the graph keeps the forward's temporaries as well), so the config refuses
  it there (``core.config.rules.selective_recompute_saves_memory``). An MoE block's experts are not covered (their
  slots are matmul outputs).
- ``full``: a block keeps only its input and re-runs whole in backward.
  PyNative: MindSpore's own ``Cell.recompute()``, which frees the block's activations there.
  jit: ``Cell.recompute()`` frees nothing on CPU (the recomputed graph is compiled on top of the saved one:
  benchmarks/RESULTS.md, "Recompute"), and a block-sized bprop-Cell cannot carry its weights' gradients
  (MindSpore gives a custom bprop's parameters zero gradients). So the step runs as a chain of compiled segments
  (``core.memory.segmented.SegmentedStep``). A pipeline's stages already run that way (``core.parallel.pipeline``:
  every stage but the last recomputes its forward), so under jit ``full`` on a pipeline's last stage is
  MindSpore's recompute, which saves nothing on CPU.

Which blocks of which stage recompute, and how, is decided once: ``core.memory.plan``.
"""

from __future__ import annotations

from mindspore import nn, ops

from core.model.layers import MLP


class _Recomputed(nn.Cell):
    """Base of the wrappers: ``fn``'s output, its inputs saved, its vector-Jacobian product computed again."""

    def __init__(self, fn: nn.Cell):
        super().__init__()
        self.fn = fn
        self.grad = ops.GradOperation(get_all=True, sens_param=True)


class Recomputed2(_Recomputed):
    """``fn(a, b)`` (a norm's (x, weight), SwiGLU's (gate, up)) recomputed in backward."""

    def construct(self, a, b):
        return self.fn(a, b)

    def bprop(self, a, b, out, dout):
        return self.grad(self.fn)(a, b, dout)


class Recomputed4(_Recomputed):
    """``fn(q, k, v, positions)`` (attention) recomputed in backward."""

    def construct(self, q, k, v, positions):
        return self.fn(q, k, v, positions)

    def bprop(self, q, k, v, positions, out, dout):
        return self.grad(self.fn)(q, k, v, positions, dout)


def apply_selective(model: nn.Cell, blocks: range) -> None:
    """Wrap the norms, the SwiGLU product and attention of ``model.layers[i]`` for i in ``blocks``."""
    for i in blocks:
        block = model.layers[i]
        for norm in (block.attn_norm, block.mlp_norm):
            norm.op = Recomputed2(norm.op)
        block.attn.sdpa = Recomputed4(block.attn.sdpa)
        if isinstance(block.mlp, MLP):
            block.mlp.act = Recomputed2(block.mlp.act)


def mark_full(model: nn.Cell, blocks: range) -> None:
    """MindSpore's recompute on whole blocks (PyNative; see the module docstring for jit)."""
    for i in blocks:
        model.layers[i].recompute()
