"""The pipeline step: this rank's actions of a schedule (``core.parallel.pipeline.schedules``) run over its
stages (``core.parallel.pipeline.stages``), with activations and their gradients passed between ranks.

Every stage but the last recomputes its forward in its backward action (MindSpore differentiates functions, not a
recorded tape: ``stages`` says more): the cost of full recompute, paid always, and a micro-batch in flight holds
one (b, S, D) input per stage, not its activations. The last stage runs forward and backward in its F action and
keeps the input gradient for its B action, so it computes nothing twice.

Messages: ``comm.send`` / ``comm.recv`` between global ranks (MindSpore's CPU send is buffered; messages between
two ranks arrive in order, which ``schedules.simulate`` checks every schedule respects).

mpipe (``mpipe.py``): every rank holds the preprocess block (``preprocess``: the embedding and stage 0's first T
blocks; with T = 0 none, a micro-batch's tokens are what is preprocessed). W: rank 0 sends its block's weights, a
rank that preprocesses loads them. P: the block's forward, detached (a forward only); its owner sends the output
and the tokens to rank 0 (send_P; a frozen block: the output alone, and its weights once before the first step). Stage 0's backward leaves the gradient of that output, and R runs the block
again from the tokens and back-propagates it into rank 0's block weights, for every micro-batch.
"""

from __future__ import annotations

import time

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from core.config import TrainConfig
from core.data import micro_batches
from core.model.precision import activation_dtype
from core.parallel.comm import enable_p2p, recv, send
from core.parallel.dims import ParallelDims
from core.parallel.pipeline.schedules import Action, build, schedule_of
from core.parallel.pipeline.stages import Stage, StageFns, accumulate
from core.runtime.graphs import compiled_if


def _sum(a, b):
    return a + b


class PipelineStep:
    """``run(inputs, targets, positions) -> (loss, grads)`` of one step on this rank, as every step
    (``core.training.step``): the mean of the micro-batches' losses (``None`` on ranks without the last stage) and
    the sum of their gradients for ``params`` (this rank's stages' parameters, in order)."""

    def __init__(
        self,
        stages: dict[int, Stage],
        *,
        preprocess: Stage | None = None,
        losses: tuple[nn.Cell, nn.Cell],
        params: list,
        dims: ParallelDims,
        cfg: TrainConfig,
    ):
        """``stages``: {global stage: Stage} this rank holds; ``losses``: the (train, eval) loss cells of the last
        stage; ``dims``: the mesh (this rank's pipeline group, and whether sequence parallelism splits the hidden
        states between stages); ``cfg``: the schedule, micro-batches and modes; ``preprocess``: mpipe's block
        (T >= 1)."""
        p, t = cfg.parallel, cfg.training
        pp_ranks = dims.group_ranks("pp")
        jit = t.mode == "jit"
        self.pp, self.ranks, self.mbs = len(pp_ranks), pp_ranks, t.micro_batch_size
        # hidden states between stages are split on the sequence by cp, and by tp with sequence parallelism
        self.seq_split, self.d_model = (dims.tp if dims.sp else 1), next(iter(stages.values())).cfg.d_model
        self.act_dtype = activation_dtype(next(iter(stages.values())).compute_precision)  # bf16 between stages
        self.index = next(s for s in stages) % self.pp
        self.fns = {
            s: StageFns(stage, loss=losses[0], eval_loss=losses[1], jit=jit, jit_eval=cfg.eval_compiled)
            for s, stage in stages.items()
        }
        self.last = max(stages) == p.stages - 1
        self.mpipe = p.pp_schedule == "mpipe"
        self.actions = build(**schedule_of(cfg))[self.index]
        # one micro-batch's forwards, in the schedule's chunk order: evaluation repeats them per micro-batch (rank
        # 0 preprocessing inline under mpipe)
        self.forwards = [a for a in self.actions if a.op in ("recv_F", "F", "send_F") and a.mb == 0]
        position = {id(p): i for i, p in enumerate(params)}
        self.slots = {s: [position[id(p)] for p in f.params] for s, f in self.fns.items()}
        # a block that trains is sent every step and recomputed from the tokens (R); a frozen one synced once
        self.trains = self.pre_synced = cfg.preprocess_trains
        self.pre = None
        if preprocess is not None:
            self.pre = StageFns(preprocess, loss=losses[0], eval_loss=losses[1], jit=jit, jit_eval=False)
            if self.index == 0:
                self.slots["pre"] = [position[id(p)] for p in self.pre.params]
        self.n_params = len(params)
        self.wait_sec = 0.0
        self._add = compiled_if(jit)(_sum)
        enable_p2p()

    def run(self, inputs: np.ndarray, targets: np.ndarray, positions: Tensor):
        """inputs, targets (m * b, S) of this rank's batch rows. ``wait_sec`` then holds the time this rank spent
        blocked in receives: the pipeline bubble as measured (plus the messages' transfer)."""
        self.wait_sec = 0.0
        grads: list = [None] * self.n_params
        if not self.pre_synced:
            self._sync_frozen_preprocess()
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
        batches = list(micro_batches(inputs, targets, b))  # (b, S) each
        box: dict[tuple, Tensor] = {}  # (kind, mb, stage) -> a tensor received, computed to send, or stashed
        losses = []
        shape = (b, positions.shape[0] // self.seq_split, self.d_model)  # what passes between stages
        for a in actions:
            fns = self.fns.get(a.stage)
            if a.op in ("send_W", "recv_W", "P", "send_P", "recv_P", "R"):
                self._transposed(a, box, batches, positions, shape, grads)
            elif a.op == "recv_F" or a.op == "recv_B":
                # PyNative queues ops and returns: synchronize before (this rank's own work is done) and after
                # (the message is here), so that the time between is waiting for the peer (the bubble)
                ms.runtime.synchronize()
                t0 = time.perf_counter()
                box[(a.op[-1], a.mb, a.stage)] = recv(shape, self.act_dtype, self.ranks[a.peer])
                ms.runtime.synchronize()
                self.wait_sec += time.perf_counter() - t0
            elif a.op == "send_F" or a.op == "send_B":
                send(box.pop(("out" + a.op[-1], a.mb, a.stage)), self.ranks[a.peer])
            elif a.op == "F":
                if a.stage == 0 and self.mpipe:
                    if ("P", a.mb, 0) not in box:  # evaluation: rank 0 preprocesses inline
                        self._preprocess(a.mb, box, batches, positions)
                    x = box.pop(("P", a.mb, 0))
                else:
                    x = Tensor(batches[a.mb][0]) if fns.stage.first else box.pop(("F", a.mb, a.stage))
                if not fns.stage.last:
                    box[("outF", a.mb, a.stage + 1)] = fns.forward(x, positions)
                    if grads is not None:
                        box[("in", a.mb, a.stage)] = x
                elif grads is None:
                    losses.append(float(fns.eval(x, Tensor(batches[a.mb][1]), positions).asnumpy()))
                else:
                    loss, (dx, g) = fns.loss_and_grads(x, Tensor(batches[a.mb][1]), positions)
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
                    box[("outB", a.mb, a.stage - 1)] = dx  # stage 0 of mpipe: the gradient R back-propagates
        return losses

    def _sync_frozen_preprocess(self) -> None:
        """Once, before the first step: rank 0's frozen preprocess weights to every rank that preprocesses (they
        may have been loaded on rank 0 alone: a checkpoint or a Hugging Face model saves and loads them there)."""
        self.pre_synced = True
        if self.pre is None:
            return
        for peer in sorted({a.peer for a in self.actions if a.op in ("send_P", "recv_P")}):
            self._weights(peer, outgoing=self.index == 0)

    def _weights(self, peer: int, *, outgoing: bool) -> None:
        """W: the preprocess block's parameters to pipeline rank ``peer`` (rank 0), or from it into this rank's
        copy, in place (compiled graphs read the Parameters). Every parameter, a router's balancing bias too."""
        for p in self.pre.stage.get_parameters():
            if outgoing:
                send(p.value(), self.ranks[peer])
            else:
                ops.assign(p, recv(p.shape, p.dtype, self.ranks[peer]))

    def _preprocess(self, mb: int, box: dict, batches: list, positions: Tensor) -> None:
        """P: micro-batch ``mb``'s tokens through the preprocess block (forward only), output and tokens boxed."""
        tokens = Tensor(batches[mb][0])
        box[("P", mb, 0)] = tokens if self.pre is None else self.pre.forward(tokens, positions)
        if self.trains:
            box[("tokens", mb)] = tokens  # for R

    def _transposed(self, a: Action, box: dict, batches: list, positions: Tensor, shape: tuple, grads) -> None:
        """mpipe's steps (``mpipe.py``): the weights sent and loaded, a micro-batch preprocessed, shipped, and
        back-propagated on rank 0."""
        tokens_shape = (self.mbs, positions.shape[0])
        if a.op in ("send_W", "recv_W"):
            self._weights(a.peer, outgoing=a.op == "send_W")
        elif a.op == "P":
            self._preprocess(a.mb, box, batches, positions)
        elif a.op == "send_P":  # the block's output (T = 0: the tokens), then the tokens for R
            send(box.pop(("P", a.mb, 0)), self.ranks[a.peer])
            if self.trains:
                send(box.pop(("tokens", a.mb)), self.ranks[a.peer])
        elif a.op == "recv_P":
            ms.runtime.synchronize()
            t0 = time.perf_counter()
            if self.pre is None:
                box[("P", a.mb, 0)] = recv(tokens_shape, ms.int32, self.ranks[a.peer])
            else:
                box[("P", a.mb, 0)] = recv(shape, self.act_dtype, self.ranks[a.peer])
            if self.trains:
                box[("tokens", a.mb)] = recv(tokens_shape, ms.int32, self.ranks[a.peer])
            ms.runtime.synchronize()
            self.wait_sec += time.perf_counter() - t0
        else:  # R: the block again from the tokens, back-propagating the gradient stage 0 left for its output
            tokens, dy = box.pop(("tokens", a.mb)), box.pop(("outB", a.mb, -1))
            accumulate(grads, self.slots["pre"], self.pre.backward(tokens, positions, dy), self._add)

    def _accumulate(self, grads: list, stage: int, g) -> None:
        accumulate(grads, self.slots[stage], g, self._add)
