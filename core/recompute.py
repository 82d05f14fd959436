"""Activation recompute: activations dropped after the forward pass and computed again for the backward (Chen et al.
2016, "Training Deep Nets with Sublinear Memory Cost"; selective: Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models").

``memory.recompute`` over the first ``memory.recompute_layers`` blocks (of the model, or of each pipeline stage):

- ``selective``: the parts that are cheap to compute and costly to keep — the RMS norms, the SwiGLU product and
  attention's scores and softmax (per head a (S, S) pair, which dominates at long sequences) — save only their
  inputs, the matmul and communication outputs they are computed from, and run again in backward. Each is wrapped
  in a bprop-Cell whose bprop re-runs its forward under ``GradOperation`` (the form whose gradients survive
  ``mindspore.jit``, MINDSPORE_CPU.md), so the same mechanism serves jit and PyNative. It saves memory in
  PyNative; under jit on CPU it adds some (the graph keeps the forward's temporaries as well: measured), so
  core.config refuses it there. An MoE block's experts are not covered (their slots are matmul outputs).
- ``full``: a block keeps only its input and re-runs whole in backward.
  PyNative: MindSpore's own ``Cell.recompute()``, which frees the block's activations there (measured).
  jit: ``Cell.recompute()`` frees nothing on CPU (measured: 1.018x the peak of ``none``, the recomputed graph is
  compiled on top of the saved one), and a block-sized bprop-Cell cannot carry its weights' gradients (MindSpore
  gives a custom bprop's parameters zero gradients). So the step runs as a chain of compiled segments
  (``SegmentedStep``): each recomputed block is one segment, whose forward call returns its output and keeps
  its input, and whose backward call runs its forward again with the vector-Jacobian product; the blocks not
  recomputed, the final norm and the loss form the last segment, forward and backward in one call. What
  lives between the calls is one (b, S, D) input per recomputed block, and the working memory of the few
  compiled graphs: all recomputed blocks of one kind run through one template block's graphs, because the
  CPU runtime keeps every compiled graph's working memory for its lifetime (measured). A pipeline's
  stages already run that way (core.parallel.pipeline: every stage but the last recomputes its forward), so
  under jit ``full`` on a pipeline's last stage is MindSpore's recompute, which saves nothing on CPU.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
from mindspore import Tensor, nn, ops

from core.parallel.pipeline import Stage, StageFns, accumulate
from core.parallel.schedule import GradientAccumulation


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


def recomputed_blocks(n_blocks: int, layers: int | None) -> range:
    """The blocks ``memory.recompute_layers`` names: the first ``layers`` of ``n_blocks`` (all if None)."""
    return range(n_blocks if layers is None else min(layers, n_blocks))


def apply_selective(model: nn.Cell, blocks: range) -> None:
    """Wrap the norms, the SwiGLU product and attention of ``model.layers[i]`` for i in ``blocks``."""
    from core.model.layers import MLP

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


class _Segment:
    """One compiled segment of a ``SegmentedStep``: its functions and the model's parameters its gradients belong
    to; a recomputed block runs through a template (``shared``) whose parameters take the block's before a call."""

    def __init__(self, fns: StageFns, params: list, block: nn.Cell | None = None, template: nn.Cell | None = None):
        self.fns, self.params = fns, params
        self.pairs = list(zip(template.get_parameters(), block.get_parameters())) if block is not None else []

    def load(self) -> None:
        for t, p in self.pairs:
            ops.assign(t, p)

    def store(self) -> None:
        """Non-trainable state the forward updated (an MoE block's dropped-pair count) goes back to the block."""
        for t, p in self.pairs:
            if not p.requires_grad:
                ops.assign(p, t)


def _block_kind(block: nn.Cell) -> tuple:
    """Blocks of one kind (parameter names within the block, shapes) can share one compiled graph."""
    return tuple((p.name.split(".", 2)[-1], tuple(p.shape)) for p in block.get_parameters())


class SegmentedStep(GradientAccumulation):
    """``run`` / ``evaluate`` of one step (as core.parallel.schedule's ``GradientAccumulation``) for a model whose
    first ``recomputed`` blocks are recomputed whole under jit (module docstring). Segments: the embedding; each
    recomputed block; the other blocks with the norm and the loss. A micro-batch runs them forward keeping each
    one's input, the last forward and backward at once, then the others' backward in reverse; the gradients of
    every micro-batch add up.

    MindSpore's CPU runtime keeps each compiled graph's working memory for the graph's lifetime (measured: six
    graphs with 200 MB of temporaries each held 1.2 GB after running one after another), so a graph per block
    would hold every block's activations after all. Blocks of one kind therefore run through one template block
    (a copy of the first) whose parameters are loaded with the block's before each call: one forward graph and
    one backward graph for all of them."""

    def __init__(self, model: nn.Cell, loss: nn.Cell, eval_loss: nn.Cell, params: list, recomputed: range,
                 micro_batch_size: int, jit: bool, jit_eval: bool | None = None):
        """``jit_eval``: the evaluation loss compiled too (default: as ``jit``; config_rules.eval_compiled)."""
        super().__init__(None, None, micro_batch_size)
        jit_eval = jit if jit_eval is None else jit_eval
        n, k = len(model.layers), min(len(recomputed), len(model.layers) - 1)
        if k < 1:
            raise ValueError("a segmented step needs a recomputed block before the last segment")
        embed = Stage(model, range(0), True, False)
        self.segments = [_Segment(StageFns(embed, loss, eval_loss, jit, jit_eval), embed.trainable_params())]
        templates: dict[tuple, tuple[nn.Cell, StageFns]] = {}
        for i in range(k):
            block = model.layers[i]
            kind = _block_kind(block)
            if kind not in templates:
                template = copy.deepcopy(block)
                for p in template.get_parameters():
                    p.name = "recompute_template." + p.name   # not the block's: a graph may not hold both names
                holder = SimpleNamespace(cfg=model.cfg, tie_embeddings=model.tie_embeddings, rope_cos=model.rope_cos,
                                         rope_sin=model.rope_sin, layers=[template], embed=None, norm=None)
                fns = StageFns(Stage(holder, range(1), False, False), loss, eval_loss, jit, jit_eval)
                templates[kind] = template, fns
            template, fns = templates[kind]
            self.segments.append(_Segment(fns, block.trainable_params(), block, template))
        # the last segment's head is the model's own table (one rank holds every segment: no copy)
        last = Stage(model, range(k, n), False, True, head_copy=False)
        self.segments.append(_Segment(StageFns(last, loss, eval_loss, jit, jit_eval), last.trainable_params()))
        position = {id(p): i for i, p in enumerate(params)}
        self.slots = [[position[id(p)] for p in seg.params] for seg in self.segments]
        self.n_params = len(params)

    def run(self, inputs: np.ndarray, targets: np.ndarray, positions: Tensor) -> tuple[float, tuple]:
        grads: list = [None] * self.n_params
        losses = []
        *middle, last = self.segments
        for x, y in self._micro_batches(inputs, targets):
            saved = []
            for seg in middle:                   # forward: keep each segment's input
                saved.append(x)
                x = self._forward(seg, x, positions)
            loss, (dx, g) = last.fns.loss_and_grads(x, y, positions)
            losses.append(float(loss.asnumpy()))
            self._accumulate(grads, len(middle), g)
            for s in range(len(middle) - 1, -1, -1):   # backward: each segment recomputed from its input
                middle[s].load()
                out = middle[s].fns.backward(saved[s], positions, dx)
                if s == 0:
                    self._accumulate(grads, 0, out)
                else:
                    dx, g = out
                    self._accumulate(grads, s, g)
        return float(np.mean(losses)), tuple(grads)

    def evaluate(self, inputs: np.ndarray, targets: np.ndarray, positions: Tensor) -> float:
        losses = []
        *middle, last = self.segments
        for x, y in self._micro_batches(inputs, targets):
            for seg in middle:
                x = self._forward(seg, x, positions)
            losses.append(float(last.fns.eval(x, y, positions).asnumpy()))
        return float(np.mean(losses))

    @staticmethod
    def _forward(seg: _Segment, x, positions):
        seg.load()
        out = seg.fns.forward(x, positions)
        seg.store()
        return out

    def _accumulate(self, grads: list, segment: int, g) -> None:
        accumulate(grads, self.slots[segment], g, ops.add)
