"""Full recompute under jit: one step as a chain of compiled segments (``memory.recompute=full``,
``training.mode=jit``, no pipeline; ``core.memory.recompute`` says why MindSpore's own recompute cannot do it).

Segments: the embedding; each recomputed block; the other blocks with the final norm and the loss. A micro-batch
runs them forward keeping each one's input, the last forward and backward at once, then the others' backward in
reverse, each running its forward again with the vector-Jacobian product; the gradients of every micro-batch add
up. What lives between the calls is one (b, S, D) input per recomputed block, and the working memory of the few
compiled graphs.

CPU workaround: MindSpore's CPU runtime keeps each compiled graph's working memory for the graph's lifetime (six
graphs of a few hundred MB of temporaries each held all of it after running one after another), so a graph per
block would hold every block's activations after all. Blocks of one kind therefore run through one template
block (a copy of the first) whose parameters are loaded with the block's before each call: one forward graph and
one backward graph for all of them.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
from mindspore import Tensor, nn, ops

from core.data import micro_batches
from core.parallel.pipeline.stages import Stage, StageFns, accumulate


class _Segment:
    """One compiled segment of a ``SegmentedStep``: its functions and the model's parameters its gradients belong
    to; a recomputed block runs through a template (``shared``) whose parameters take the block's before a call."""

    def __init__(self, fns: StageFns, params: list, *, block: nn.Cell | None = None, template: nn.Cell | None = None):
        self.fns, self.params = fns, params
        self.pairs = (
            list(zip(template.get_parameters(), block.get_parameters(), strict=True)) if block is not None else []
        )

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


class SegmentedStep:
    """``run`` / ``evaluate`` of one step (as every step, ``core.training.step``) for a model whose first
    ``recomputed`` blocks are recomputed whole under jit (module docstring); never the last block, which the last
    segment holds."""

    def __init__(
        self,
        model: nn.Cell,
        *,
        losses: tuple[nn.Cell, nn.Cell],
        params: list,
        recomputed: range,
        micro_batch_size: int,
        jit: bool,
        jit_eval: bool | None = None,
    ):
        """``losses``: the (train, eval) loss cells; ``jit_eval``: the evaluation loss compiled too (default: as
        ``jit``; ``TrainConfig.eval_compiled``)."""
        loss, eval_loss = losses
        self.micro_batch_size = micro_batch_size
        jit_eval = jit if jit_eval is None else jit_eval
        n, k = len(model.layers), min(len(recomputed), len(model.layers) - 1)
        if k < 1:
            raise ValueError("a segmented step needs a recomputed block before the last segment")
        embed = Stage(model, range(0), first=True, last=False)
        self.segments = [
            _Segment(
                StageFns(embed, loss=loss, eval_loss=eval_loss, jit=jit, jit_eval=jit_eval), embed.trainable_params()
            )
        ]
        templates: dict[tuple, tuple[nn.Cell, StageFns]] = {}
        for i in range(k):
            block = model.layers[i]
            kind = _block_kind(block)
            if kind not in templates:
                template = copy.deepcopy(block)
                for p in template.get_parameters():
                    p.name = "recompute_template." + p.name  # not the block's: a graph may not hold both names
                holder = SimpleNamespace(
                    cfg=model.cfg,
                    tie_embeddings=model.tie_embeddings,
                    rope_cos=model.rope_cos,
                    rope_sin=model.rope_sin,
                    compute_precision=model.compute_precision,
                    layers=[template],
                    embed=None,
                    norm=None,
                )
                fns = StageFns(
                    Stage(holder, range(1), first=False, last=False),
                    loss=loss,
                    eval_loss=eval_loss,
                    jit=jit,
                    jit_eval=jit_eval,
                )
                templates[kind] = template, fns
            template, fns = templates[kind]
            self.segments.append(_Segment(fns, block.trainable_params(), block=block, template=template))
        # the last segment's head (and MTP's embedding) is the model's own table (one rank holds every segment: no copy)
        last = Stage(model, range(k, n), first=False, last=True, head_copy=False)
        self.segments.append(
            _Segment(
                StageFns(last, loss=loss, eval_loss=eval_loss, jit=jit, jit_eval=jit_eval), last.trainable_params()
            )
        )
        position = {id(p): i for i, p in enumerate(params)}
        self.slots = [[position[id(p)] for p in seg.params] for seg in self.segments]
        self.n_params = len(params)

    def run(self, inputs: np.ndarray, targets: np.ndarray, positions: Tensor) -> tuple[float, tuple]:
        grads: list = [None] * self.n_params
        losses = []
        *middle, last = self.segments
        for x, y in self._micro_batches(inputs, targets):
            saved = []
            for seg in middle:  # forward: keep each segment's input
                saved.append(x)
                x = self._forward(seg, x, positions)
            loss, (dx, g) = last.fns.loss_and_grads(x, y, positions)
            losses.append(float(loss.asnumpy()))
            self._accumulate(grads, len(middle), g)
            for s in range(len(middle) - 1, -1, -1):  # backward: each segment recomputed from its input
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

    def _micro_batches(self, inputs: np.ndarray, targets: np.ndarray):
        for x, y in micro_batches(inputs, targets, self.micro_batch_size):
            yield Tensor(x), Tensor(y)

    @staticmethod
    def _forward(seg: _Segment, x, positions):
        seg.load()
        out = seg.fns.forward(x, positions)
        seg.store()
        return out

    def _accumulate(self, grads: list, segment: int, g) -> None:
        accumulate(grads, self.slots[segment], g, ops.add)
