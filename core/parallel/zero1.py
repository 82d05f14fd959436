"""The distributed optimizer (ZeRO-1, Rajbhandari et al. 2020; Megatron-LM's ``--use-distributed-optimizer``,
MindSpore's optimizer parallelism): ``parallel.dp_shard_strategy=optim``.

Every rank of the ``fsdp`` group (dp_shard * cp) holds each weight whole (its TP block) and computes its gradient
whole, as plain data parallelism does; the optimizer's side is sharded as FSDP shards it. For each weight
FSDP would shard (every one but the experts, ``placement.is_expert``) a **master** is this rank's flat fp32 shard
(``Placement.fsdp_shard``: padded to a multiple of the degree), and the optimizer, gradient clipping and checkpoints
see the masters with their FSDP placements, so a ZeRO-1 checkpoint is an FSDP one and resumes on any layout. Once
a step:

    reduce(grads)   the micro-batches' summed whole gradients -> each master's shard of their sum over the group
                    (a reduce-scatter per weight)
    publish()       the updated masters -> every rank's whole weights (an all-gather per weight)

A collective per weight, not one over a flat buffer of the whole model: packing every weight into one buffer (and
out of it) made copies of the model's size on each rank (``model=medium``: 813 MiB more a rank and a slower step;
benchmarks/RESULTS.md, "ZeRO-1").

Against FSDP: the weights and gradients stay whole (P each per rank, not P / n), no weight is gathered per use
and no gradient reduce-scattered per micro-batch, so a step communicates 2P once whatever the micro-batches
(FSDP: a gather per use in forward and backward and a reduce-scatter per micro-batch). The memory and step-time
models count it so (``core.memory.estimate``, ``core.perf.work``).

The whole weights stay fp32 and are cast at each use in bf16 (``core.model.precision``), so the core keeps fp32
masters beside fp32 weights, where Megatron's fp32 weights are their own masters (and its bf16 weights sit beside
fp32 masters). ``core.memory.estimate`` counts the core's on CPU, where it runs, and Megatron's on accelerators.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from core.parallel import comm
from core.parallel.fsdp import shard_grad, unshard
from core.parallel.placement import Placement, is_expert
from core.runtime.graphs import each, jit


class MasterWeights:
    """``params``: what the optimizer, clipping and checkpoints hold for the differentiated ``weights`` (in their
    order): the masters under ZeRO-1, the weights themselves otherwise (``group`` None or of size 1), when
    ``reduce`` and ``publish`` do nothing. Updates ``placements`` with the masters' FSDP placements."""

    def __init__(self, weights: list, placements: dict[str, Placement], group: comm.Group | None):
        self.params = list(weights)
        self.sharded = ()
        if group is None or group.size == 1:
            return
        sharded = [i for i, w in enumerate(weights) if not is_expert(w.name)]
        for i in sharded:
            w = weights[i]
            placement = placements[w.name].with_fsdp(group.size, group.index)
            placements[w.name] = placement
            flat = placement.fsdp_shard(w.asnumpy().astype("float32"))
            self.params[i] = Parameter(Tensor(flat), name=w.name, requires_grad=True)
        self.sharded = tuple(sharded)
        chosen = [placements[weights[i].name] for i in sharded]
        self._reduce = jit(_ReduceScatter(group, chosen), source=True)
        self._publish = jit(_Publish(group, chosen, [weights[i] for i in sharded]), source=True)

    def reduce(self, grads: tuple) -> tuple:
        """Whole gradients (in ``weights``' order) -> gradients of ``params``: each master's summed shard."""
        if not self.sharded:
            return grads
        shards = self._reduce(ms.mutable(tuple(grads[i] for i in self.sharded)))
        out = list(grads)
        for i, g in zip(self.sharded, shards, strict=True):
            out[i] = g
        return tuple(out)

    def publish(self) -> None:
        """Every rank's whole weights from the masters (after each optimizer step, and after loading them)."""
        if self.sharded:
            self._publish(ms.mutable(tuple(self.params[i] for i in self.sharded)))


class _ReduceScatter(nn.Cell):
    """whole gradients -> this rank's shard of each, summed over the group: a collective per weight, so that no
    buffer of the whole model is built (on CPU each collective composes from an all-reduce of its one weight)."""

    def __init__(self, group: comm.Group, placements: list[Placement]):
        super().__init__()
        self.scatter = comm.reduce_scatter(group, 0)
        self.pads = tuple(p.fsdp_pad for p in placements)

    def construct(self, grads):
        return each(ops.partial(shard_grad, self.scatter), grads, self.pads)  # each (shard_len,)


class _Publish(nn.Cell):
    """masters (this rank's shards) -> the whole weights, assigned in place: a collective per weight."""

    def __init__(self, group: comm.Group, placements: list[Placement], weights: list):
        super().__init__()
        self.gather = comm.all_gather(group, 0)
        self.numels = tuple(p.local_numel for p in placements)
        self.shapes = tuple(p.local_shape for p in placements)
        self.weights = ParameterTuple(weights)

    def construct(self, shards):
        return each(ops.partial(_unshard_into, self.gather), self.weights, shards, self.numels, self.shapes)


def _unshard_into(gather, weight, shard, numel, shape):
    return ops.assign(weight, unshard(gather, shard, numel, shape))
