"""A model cut into pipeline stages, and the compiled functions of one stage.

``split_stages`` cuts a GPT into ``pp * pp_virtual`` stages (``core.parallel.pipeline.schedules.stage_layers``:
even, or ``parallel.pp_layers``) and keeps this rank's. A ``Stage`` is a GPT-shaped cell (``embed``, ``layers``,
``norm``, ``head_weight()``), so tensor, context and data parallelism apply to each stage as to a whole model;
the first stage embeds, the last normalises and owns the loss, and runs the multi-token-prediction modules
(``core.model.mtp``) after its blocks. With tied embeddings the last stage holds a copy of the embedding table as
its head (Megatron's "embedding group"), and with MTP as the table the modules embed the later tokens with: the two
copies start equal, their gradients are summed between the first and last stage (``GradientSync``), so they stay
equal; only the first is saved.

How a stage runs under MindSpore's autodiff. MindSpore differentiates functions, not a recorded tape that a
later call could run backward through: a backward is a call that runs the forward again and then its vector-
Jacobian product. So a stage's forward (``StageFns.forward``) computes its output and keeps only its input; its
backward (``StageFns.backward``) runs forward and backward from that input and the output gradient it received.
The last stage runs forward and backward at once (``StageFns.loss_and_grads``). The segmented recompute step
(``core.memory.segmented``) runs a whole model's blocks as stages of one rank in the same way.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, Tensor, nn

from core.model.layers import rope_at
from core.model.mtp import CarriesMTP, MTPLoss, mtp_objective
from core.model.precision import Computes
from core.parallel.pipeline.schedules import stage_layers
from core.runtime.graphs import compiled_if


class Stage(nn.Cell, CarriesMTP, Computes):
    """Blocks ``layers`` of ``model``, with the embedding (first stage) and the final norm and head (last).

    construct: tokens (B, S) int32 on the first stage, else hidden (B, S, D) -> hidden (B, S, D)."""

    def __init__(self, model: nn.Cell, layers: range, *, first: bool, last: bool, head_copy: bool = True):
        """``head_copy``: a last stage of a tied model holds a copy of the table (another rank holds the first
        stage); False: it uses the model's own (one rank holds both: core.memory.segmented)."""
        super().__init__(auto_prefix=False)  # keep the GPT's parameter names: checkpoints and the optimizer use them
        self.first, self.last = first, last
        self.cfg, self.tie_embeddings = model.cfg, model.tie_embeddings
        self.rope_cos, self.rope_sin = model.rope_cos, model.rope_sin
        self.compute_precision = model.compute_precision  # (a stage built after set_precision: segmented recompute)
        self.layers = nn.CellList([model.layers[i] for i in layers], auto_prefix=False)
        self.embed = model.embed if first else None
        self.norm = model.norm if last else None
        self.mirrors: tuple[str, ...] = ()  # parameters that copy another stage's (saved there, not here)
        self.mtp = model.mtp if last and getattr(model, "mtp_depth", 0) else None
        if last and not model.tie_embeddings:
            self.lm_head = model.lm_head
        if last and not first and reads_table_last(model):  # (for its table only: a stage not first does not embed)
            if head_copy:
                table = model.embed.weight
                self.embed = type(model.embed)(*table.shape, init_std=model.cfg.init_std)  # a copy of the table
                self.embed.weight = Parameter(Tensor(table.asnumpy()), name=table.name)
                self.mirrors = (table.name,)
            else:
                self.embed = model.embed

    def head_weight(self):
        """The (V, D) head on the last stage; None elsewhere."""
        if not self.last:
            return None
        return self.embed.weight if self.tie_embeddings else self.lm_head.weight

    def construct(self, x, positions):
        cos, sin = rope_at(self.rope_cos, self.rope_sin, positions, self.compute_precision)  # (S, E/2) each
        h = self.embed(x) if self.first else x  # (B, S, D)
        for block in self.layers:
            h = block(h, cos, sin, positions)
        return self.norm(h) if self.last else h


def reads_table_last(model: nn.Cell) -> bool:
    """Whether the last stage reads the embedding table: as its tied head, or for the MTP modules to embed with
    (another stage's table: a copy whose gradient is summed with the first stage's)."""
    return model.tie_embeddings or bool(getattr(model, "mtp_depth", 0))


def split_stages(
    model: nn.Cell, *, pp: int, virtual: int, index: int, split: list[int] | None, transposed: int = 0
) -> dict[int, Stage]:
    """{global stage: Stage} held by pipeline rank ``index``: stages index, index + pp, ... (interleaved).
    ``transposed``: mpipe's preprocess block holds the embedding and stage 0's first this many blocks
    (``preprocess``), stage 0 the rest."""
    n = pp * virtual
    ranges = stage_layers(len(model.layers), n, split)
    ranges[0] = ranges[0][transposed:]
    first = not transposed
    return {s: Stage(model, ranges[s], first=s == 0 and first, last=s == n - 1) for s in range(index, n, pp)}


def preprocess(model: nn.Cell, layers: int) -> Stage:
    """mpipe's preprocess block: the embedding and the first ``layers`` blocks (``core.parallel.pipeline.mpipe``);
    every pipeline rank holds one, rank 0's the one that trains."""
    return Stage(model, range(layers), first=True, last=False)


class StageFns:
    """The compiled functions of one stage: forward; forward+backward from an output gradient (or, on the last
    stage, from the loss)."""

    def __init__(self, stage: Stage, *, loss: nn.Cell, eval_loss: nn.Cell, jit: bool, jit_eval: bool):
        """``jit_eval``: the last stage's evaluation loss compiled too (``TrainConfig.eval_compiled``)."""
        self.stage, self.params = stage, stage.trainable_params()
        owners = (stage, loss, eval_loss)  # the cells whose Parameters the graphs read (graphs.jit)
        wrap = compiled_if(jit, owners=owners)
        if stage.last:
            if stage.mtp is not None:  # targets (B, S, 1 + D); the main loss is what it returns
                mtp_loss = MTPLoss(stage.cfg.mtp_loss_weight, stage.cfg.mtp_layers)

                def loss_fn(x, targets, positions):
                    return mtp_objective(stage, loss, mtp_loss, stage(x, positions), targets, positions)

            else:

                def loss_fn(x, targets, positions):
                    return loss(stage(x, positions), stage.head_weight(), targets)

            def eval_fn(x, targets, positions):
                return eval_loss(stage(x, positions), stage.head_weight(), targets)

            self.loss_and_grads = wrap(ms.value_and_grad(loss_fn, 0, self.params))
            self.eval = compiled_if(jit_eval, owners=owners)(eval_fn)
        else:

            def vjp(x, positions, dy):  # d/dx, d/dW of <stage(x), dy> is the vector-Jacobian product
                return (stage(x, positions) * dy).sum()

            def forward(x, positions):
                return stage(x, positions)

            self.forward = wrap(forward)
            self.backward = wrap(ms.grad(vjp, None if stage.first else 0, self.params))


def accumulate(grads: list, slots: list[int], g, add) -> None:
    """grads[slots[j]] += g[j] (a parameter's first gradient of the step is taken as it is)."""
    for i, gi in zip(slots, g, strict=True):
        grads[i] = gi if grads[i] is None else add(grads[i], gi)
