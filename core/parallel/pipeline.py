"""Pipeline parallelism: this rank's stages of the model, and the schedule that runs a step over them.

``split_stages`` cuts a GPT into ``pp * pp_virtual`` stages (``core.parallel.pipeline_schedules.stage_layers``:
even, or ``parallel.pp_layers``) and keeps this rank's. A ``Stage`` is a GPT-shaped cell (``embed``, ``layers``,
``norm``, ``head_weight()``), so tensor, context and data parallelism apply to each stage as to a whole model;
the first stage embeds, the last normalises and owns the loss. With tied embeddings the last stage holds a copy
of the embedding table as its head (Megatron's "embedding group"): the two copies start equal, their gradients
are summed between the first and last stage (``GradientSync``), so they stay equal; only the first is saved.

How a stage runs under MindSpore's autodiff. MindSpore differentiates functions, not a recorded tape that a
later call could run backward through: a backward is a call that runs the forward again and then its vector-
Jacobian product. So a stage's forward action (F) computes its output to send downstream and keeps only its
input; its backward action (B) runs forward and backward from that input and the output gradient it received —
every stage but the last recomputes its forward once (the cost of full recompute, paid always), and a micro-batch
in flight holds one (b, S, D) input per stage, not its activations. The last stage runs forward and backward in
its F action and keeps the input gradient for its B action, so it computes nothing twice.

Messages: ``comm.send`` / ``comm.recv`` between global ranks (MindSpore's CPU send is buffered; messages between
two ranks arrive in order, which ``pipeline_schedules.simulate`` checks every schedule respects).
"""

from __future__ import annotations

import time

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from core import execution
from core.parallel import comm
from core.parallel.pipeline_schedules import Action, build, stage_layers


class Stage(nn.Cell):
    """Blocks ``layers`` of ``model``, with the embedding (first stage) and the final norm and head (last).

    construct: tokens (B, S) int32 on the first stage, else hidden (B, S, D) -> hidden (B, S, D)."""

    def __init__(self, model: nn.Cell, layers: range, first: bool, last: bool, head_copy: bool = True):
        """``head_copy``: a last stage of a tied model holds a copy of the table (another rank holds the first
        stage); False: it uses the model's own (one rank holds both, core.recompute)."""
        super().__init__(auto_prefix=False)  # keep the GPT's parameter names: checkpoints and the optimizer use them
        self.first, self.last = first, last
        self.cfg, self.tie_embeddings = model.cfg, model.tie_embeddings
        self.rope_cos, self.rope_sin = model.rope_cos, model.rope_sin
        self.layers = nn.CellList([model.layers[i] for i in layers], auto_prefix=False)
        self.embed = model.embed if first else None
        self.norm = model.norm if last else None
        self.mirrors: tuple[str, ...] = ()  # parameters that copy another stage's (saved there, not here)
        if last and not model.tie_embeddings:
            self.lm_head = model.lm_head
        elif last and not first and not head_copy:
            self.embed = model.embed   # for its table only: a stage that is not first does not embed
        elif last and not first:
            table = model.embed.weight
            self.embed = type(model.embed)(*table.shape, model.cfg.init_std)  # the head's copy of the table
            self.embed.weight = Parameter(Tensor(table.asnumpy()), name=table.name)
            self.mirrors = (table.name,)

    def head_weight(self):
        """The (V, D) head on the last stage; None elsewhere."""
        if not self.last:
            return None
        return self.embed.weight if self.tie_embeddings else self.lm_head.weight

    def construct(self, x, positions):
        cos = ops.gather(self.rope_cos, positions, 0)    # (S, E/2)
        sin = ops.gather(self.rope_sin, positions, 0)    # (S, E/2)
        h = self.embed(x) if self.first else x           # (B, S, D)
        for block in self.layers:
            h = block(h, cos, sin, positions)
        return self.norm(h) if self.last else h


def split_stages(model: nn.Cell, pp: int, virtual: int, index: int, split: list[int] | None) -> dict[int, Stage]:
    """{global stage: Stage} held by pipeline rank ``index``: stages index, index + pp, ... (interleaved)."""
    n = pp * virtual
    ranges = stage_layers(len(model.layers), n, split)
    return {s: Stage(model, ranges[s], s == 0, s == n - 1) for s in range(index, n, pp)}


def _sum(a, b):
    return a + b


class StageFns:
    """The compiled functions of one stage: forward; forward+backward from an output gradient (or, on the last
    stage, from the loss)."""

    def __init__(self, stage: Stage, loss: nn.Cell, eval_loss: nn.Cell, jit: bool, jit_eval: bool):
        """``jit_eval``: the last stage's evaluation loss compiled too (config_rules.eval_compiled)."""
        self.stage, self.params = stage, stage.trainable_params()
        owners = (stage, loss, eval_loss)  # the cells whose Parameters the graphs read (execution.jit)
        wrap = execution.compiled_if(jit, owners=owners)
        if stage.last:
            def loss_fn(x, targets, positions):
                return loss(stage(x, positions), stage.head_weight(), targets)

            def eval_fn(x, targets, positions):
                return eval_loss(stage(x, positions), stage.head_weight(), targets)

            self.loss_and_grads = wrap(ms.value_and_grad(loss_fn, 0, self.params))
            self.eval = execution.compiled_if(jit_eval, owners=owners)(eval_fn)
        else:
            def vjp(x, positions, dy):  # d/dx, d/dW of <stage(x), dy> is the vector-Jacobian product
                return (stage(x, positions) * dy).sum()

            def forward(x, positions):
                return stage(x, positions)

            self.forward = wrap(forward)
            self.backward = wrap(ms.grad(vjp, None if stage.first else 0, self.params))


class PipelineSchedule:
    """``run(inputs, targets, positions) -> (loss, grads)`` of one step on this rank, as ``GradientAccumulation``:
    the mean of the micro-batches' losses (``None`` on ranks without the last stage) and the sum of their
    gradients for ``params`` (this rank's stages' parameters, in order)."""

    def __init__(self, stages: dict[int, Stage], loss: nn.Cell, eval_loss: nn.Cell, params: list, pp_ranks: tuple,
                 schedule: str, micro_batches: int, micro_batch_size: int, virtual: int, jit: bool, jit_eval: bool,
                 seq_split: int):
        """``seq_split``: the factor by which the hidden states between stages are split on the sequence beyond
        context parallelism (tp with sequence parallelism, else 1)."""
        self.pp, self.ranks, self.mbs = len(pp_ranks), pp_ranks, micro_batch_size
        self.seq_split, self.d_model = seq_split, next(iter(stages.values())).cfg.d_model
        self.index = next(s for s in stages) % self.pp
        self.fns = {s: StageFns(stage, loss, eval_loss, jit, jit_eval) for s, stage in stages.items()}
        self.last = max(stages) == self.pp * virtual - 1
        self.actions = build(schedule, self.pp, micro_batches, virtual)[self.index]
        # one micro-batch's forwards, in the schedule's chunk order: evaluation repeats them per micro-batch
        self.forwards = [a for a in self.actions if a.op in ("recv_F", "F", "send_F") and a.mb == 0]
        position = {id(p): i for i, p in enumerate(params)}
        self.slots = {s: [position[id(p)] for p in f.params] for s, f in self.fns.items()}
        self.n_params = len(params)
        self.wait_sec = 0.0
        self._add = execution.compiled_if(jit)(_sum)
        comm.enable_p2p()

    def run(self, inputs: np.ndarray, targets: np.ndarray, positions: Tensor):
        """inputs, targets (m * b, S) of this rank's batch rows. ``wait_sec`` then holds the time this rank spent
        blocked in receives: the pipeline bubble as measured (plus the messages' transfer)."""
        self.wait_sec = 0.0
        grads: list = [None] * self.n_params
        losses = self._execute(self.actions, inputs, targets, positions, grads)
        return (float(np.mean(losses)) if self.last else None), tuple(grads)

    def evaluate(self, inputs: np.ndarray, targets: np.ndarray, positions: Tensor):
        """The forwards alone (no gradients) over any number of micro-batches: their mean loss on the last stage."""
        n = len(inputs) // self.mbs
        actions = [Action(a.op, mb, a.stage, a.peer) for mb in range(n) for a in self.forwards]
        wait, losses = self.wait_sec, self._execute(actions, inputs, targets, positions, None)
        self.wait_sec = wait  # a step's figure, not evaluation's
        return float(np.mean(losses)) if self.last else None

    def _execute(self, actions, inputs, targets, positions, grads):
        b = self.mbs
        tokens = lambda mb: Tensor(inputs[mb * b:(mb + 1) * b])     # noqa: E731  (b, S)
        labels = lambda mb: Tensor(targets[mb * b:(mb + 1) * b])    # noqa: E731
        box: dict[tuple, Tensor] = {}   # (kind, mb, stage) -> a tensor received, computed to send, or stashed
        losses = []
        shape = (b, positions.shape[0] // self.seq_split, self.d_model)   # what passes between stages
        for a in actions:
            fns = self.fns.get(a.stage)
            if a.op == "recv_F" or a.op == "recv_B":
                # PyNative queues ops and returns: synchronize before (this rank's own work is done) and after
                # (the message is here), so that the time between is waiting for the peer (the bubble)
                ms.runtime.synchronize()
                t0 = time.perf_counter()
                box[(a.op[-1], a.mb, a.stage)] = comm.recv(shape, ms.float32, self.ranks[a.peer])
                ms.runtime.synchronize()
                self.wait_sec += time.perf_counter() - t0
            elif a.op == "send_F" or a.op == "send_B":
                comm.send(box.pop(("out" + a.op[-1], a.mb, a.stage)), self.ranks[a.peer])
            elif a.op == "F":
                x = tokens(a.mb) if fns.stage.first else box.pop(("F", a.mb, a.stage))
                if not fns.stage.last:
                    box[("outF", a.mb, a.stage + 1)] = fns.forward(x, positions)
                    if grads is not None:
                        box[("in", a.mb, a.stage)] = x
                elif grads is None:
                    losses.append(float(fns.eval(x, labels(a.mb), positions).asnumpy()))
                else:
                    loss, (dx, g) = fns.loss_and_grads(x, labels(a.mb), positions)
                    losses.append(float(loss.asnumpy()))
                    self._accumulate(grads, a.stage, g)
                    box[("outB", a.mb, a.stage - 1)] = dx
            else:  # B
                if fns.stage.last:
                    continue  # its backward ran with its forward; the input gradient waits in the box
                x, dy = box.pop(("in", a.mb, a.stage)), box.pop(("B", a.mb, a.stage))
                out = fns.backward(x, positions, dy)
                if fns.stage.first:
                    self._accumulate(grads, a.stage, out)
                else:
                    dx, g = out
                    self._accumulate(grads, a.stage, g)
                    box[("outB", a.mb, a.stage - 1)] = dx
        return losses

    def _accumulate(self, grads: list, stage: int, g) -> None:
        accumulate(grads, self.slots[stage], g, self._add)


def accumulate(grads: list, slots: list[int], g, add) -> None:
    """grads[slots[j]] += g[j] (a parameter's first gradient of the step is taken as it is)."""
    for i, gi in zip(slots, g):
        grads[i] = gi if grads[i] is None else add(grads[i], gi)

