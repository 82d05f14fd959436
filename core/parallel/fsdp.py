"""Fully sharded data parallelism (ZeRO-3, Rajbhandari et al. 2020; PyTorch FSDP, Zhao et al. 2023) over the
``fsdp`` ranks (dp_shard * cp), with replicas over ``dp_replicate`` making it HSDP.

Every weight is stored as this rank's flat 1-D shard (``Placement``: padded to a multiple of the degree), and
so are its gradient and optimizer states: each of the three is 1/fsdp of the model per rank. A layer's op is
wrapped so that

    forward:  the full weight is all-gathered just before the op and dropped after it;
    backward: the weight is all-gathered again, the op's vector-Jacobian product computed with it, and the
              weight's gradient reduce-scattered back to shards (summed over the group).

Re-gathering in backward (as FSDP does with ``reshard_after_forward``) is what keeps a full weight from living
between the forward and the backward pass; with autodiff through a plain all-gather, every gathered weight would
be saved for backward, which is the memory of an unsharded model. It costs one more all-gather per op. The
wrapper is a bprop-Cell whose weight arrives as an input (the form whose gradients survive ``mindspore.jit``,
docs/mindspore-cpu.md "Autodiff and custom backward"); its bprop differentiates the wrapped op with ``GradOperation``, so it composes with whatever
the op is (tensor-parallel, vocab-parallel, the loss).

Inside a block marked for recompute the op is wrapped more simply (``GatheredOp``: a gather whose backward
reduce-scatters): recompute re-runs the block's forward, gather included, in backward, which is the same
re-gathering; and MindSpore's recompute cannot re-run an op whose own bprop differentiates it (measured: a graph
cycle under jit, wrong gradients in PyNative).

Every forward gather waits for the activation its op consumes (``ops.depend``): a gather that depends on nothing
but its shard may be scheduled anywhere in the compiled graph, and ranks that schedule it differently pair
different collectives (measured: dp_shard=4 on the small model paired the final norm's gather with the head's,
"RunRingAllReduce Memcpy error"; equal-sized ones would swap silently). Backward re-gathers go without that
dependency on the incoming gradient: with it, every layer's re-gather raced the reduce-scatters of the layers
after it and dp_shard=4 paired mismatched sizes again (measured; once the gradients were NaN). Only an op that
asks for it (``regather_after_grad``: an MoE router whose tokens are gathered over a cp x tp group, where the
free re-gather ran against that group's gather) gets ``GradOrderedShardedOp``. Not every ordering is guaranteed
by construction: each layout runs in the tests.

In mixed precision (``core.model.precision``) a shard is cast to the compute precision before its gather (bf16:
half the bytes and half the gathered buffer, as torch FSDP's param_dtype and the estimates count it), and the
weight's gradient back to fp32 before its reduce-scatter (fp32 reductions). The MoE router's weight gathers in fp32,
as its matmul runs in fp32.

The gradient leaves the bprop summed over the fsdp ranks; ``GradientSync`` then sums over ``dp_replicate`` and
divides by the number of ranks whose losses average into the global loss.
"""

from __future__ import annotations

from mindspore import Parameter, Tensor, nn, ops

from core.model.precision import Computes, to_compute, to_fp32
from core.parallel import comm
from core.parallel.placement import Placement, replicated


class _Unshard(nn.Cell):
    """flat shard (n,) -> the weight this rank's op uses (the TP block, ``placement.local_shape``)."""

    def __init__(self, group: comm.Group, placement: Placement):
        super().__init__()
        self.gather = comm.all_gather(group, 0)
        self.numel, self.shape = placement.local_numel, placement.local_shape

    def construct(self, shard):
        return unshard(self.gather, shard, self.numel, self.shape)


class _ShardGrad(nn.Cell):
    """gradient of the full (TP-block) weight -> this rank's flat shard of its sum over the group."""

    def __init__(self, group: comm.Group, placement: Placement):
        super().__init__()
        self.scatter = comm.reduce_scatter(group, 0)
        self.pad = placement.fsdp_pad

    def construct(self, grad):
        return shard_grad(self.scatter, grad, self.pad)


def unshard(gather, shard, numel: int, shape: tuple):
    """flat shard (n,) -> the whole weight (``shape``, ``numel`` elements): all-gathered, the padding cut. A
    function, not a cell, so that ZeRO-1 (``core.parallel.zero1``) maps it over every weight in one graph."""
    flat = gather(shard)  # (fsdp * n,)
    if flat.shape[0] != numel:  # only then: a slice copies the whole weight (ZeRO-1 at 1.4x FSDP's step with it
        flat = flat[:numel]  # on every weight, 0.8x without; benchmarks/RESULTS.md, "ZeRO-1")
    return flat.reshape(shape)


def shard_grad(scatter, grad, pad: int):
    """a whole weight's gradient -> this rank's flat shard (n,) of its sum over the group: flattened, padded with
    ``pad`` zeros, reduce-scattered."""
    flat = grad.reshape(-1)
    if pad:
        flat = ops.concat((flat, ops.zeros((pad,), flat.dtype)))
    return scatter(flat)


class ShardedOp(nn.Cell, Computes):
    """FSDP around ``op(x, w)``: takes ``w`` as this rank's shard (see the module docstring)."""

    def __init__(self, op: nn.Cell, group: comm.Group, placement: Placement):
        super().__init__()
        self.op = op
        self.unshard, self.unshard_again = _Unshard(group, placement), _Unshard(group, placement)
        self.shard_grad = _ShardGrad(group, placement)
        self.grad = ops.GradOperation(get_all=True, sens_param=True)

    def construct(self, x, shard):
        return self.op(x, self.unshard(to_compute(ops.depend(shard, x), self.compute_precision)))

    def bprop(self, x, shard, out, dout):
        p = self.compute_precision
        dx, dw = self.grad(self.op)(x, self.unshard_again(to_compute(shard, p)), dout)
        return dx, self.shard_grad(to_fp32(dw, p))


class GradOrderedShardedOp(ShardedOp):
    """``ShardedOp`` whose backward re-gather waits for the incoming gradient (module docstring: for an op whose
    re-gather would otherwise race a collective of another group)."""

    def bprop(self, x, shard, out, dout):
        p = self.compute_precision
        dx, dw = self.grad(self.op)(x, self.unshard_again(to_compute(ops.depend(shard, dout), p)), dout)
        return dx, self.shard_grad(to_fp32(dw, p))


class _GatherShard(nn.Cell, Computes):
    """flat shard -> the full (TP-block) weight; backward: the gradient reduce-scattered back to the shard."""

    def __init__(self, group: comm.Group, placement: Placement):
        super().__init__()
        self.unshard, self.shard_grad = _Unshard(group, placement), _ShardGrad(group, placement)

    def construct(self, shard):
        return self.unshard(to_compute(shard, self.compute_precision))

    def bprop(self, shard, out, dout):
        return (self.shard_grad(to_fp32(dout, self.compute_precision)),)


class ShardedLoss(nn.Cell):
    """FSDP around the loss op ``loss(hidden, head_weight, labels)``.

    No re-gather here: the fused cross-entropy makes its weight gradient in the forward pass (core.model.loss), so the
    gathered head weight and its gradient both exist once per step whatever is done; re-running the loss in a
    bprop would redo the whole forward for nothing (and MindSpore's graph compiler refuses a helper with a branch
    called from both a construct and a bprop: docs/mindspore-cpu.md, "Autodiff and custom backward")."""

    def __init__(self, loss: nn.Cell, group: comm.Group, placement: Placement):
        super().__init__()
        self.loss, self.gather = loss, _GatherShard(group, placement)

    def construct(self, hidden, shard, labels):
        return self.loss(hidden, self.gather(ops.depend(shard, hidden)), labels)


class GatheredOp(nn.Cell):
    """FSDP around ``op(x, w)`` inside a recomputed block: ``op(x, gather(shard))``, the gradient reduce-scattered."""

    def __init__(self, op: nn.Cell, group: comm.Group, placement: Placement):
        super().__init__()
        self.op, self.gather = op, _GatherShard(group, placement)

    def construct(self, x, shard):
        return self.op(x, self.gather(ops.depend(shard, x)))


def _shard_parameter(cell: nn.Cell, group: comm.Group, placements: dict) -> Placement:
    old = cell.weight
    placement = placements.get(old.name, replicated(old.shape)).with_fsdp(group.size, group.index)
    flat = placement.fsdp_shard(old.asnumpy())  # old: the TP block, or the whole weight
    cell.weight = Parameter(Tensor(flat), name=old.name, requires_grad=old.requires_grad)
    placements[old.name] = placement
    return placement


def apply_fsdp(
    model: nn.Cell,
    group: comm.Group,
    placements: dict,
    loss: nn.Cell,
    eval_loss: nn.Cell,
    *,
    recomputed: range = range(0),
) -> tuple[nn.Cell, nn.Cell]:
    """Shard every weight of ``model`` over ``group`` and wrap its op (``recomputed``: the blocks that re-run their
    forward in backward, see the module docstring); returns the wrapped (train, eval) loss ops, which gather the
    head weight (the tied embedding or lm_head) the same way."""
    in_blocks = {id(c) for i in recomputed for _, c in model.layers[i].cells_and_names()}
    seen: dict[int, Placement] = {}
    for _, cell in model.cells_and_names():
        if isinstance(getattr(cell, "weight", None), Parameter) and hasattr(cell, "op"):
            if id(cell.weight) not in seen:
                seen[id(cell.weight)] = _shard_parameter(cell, group, placements)
            wrap = (
                GatheredOp
                if id(cell) in in_blocks
                else GradOrderedShardedOp
                if getattr(cell, "regather_after_grad", False)
                else ShardedOp
            )
            cell.op = wrap(cell.op, group, seen[id(cell.weight)])
            if getattr(cell.op.op, "in_fp32", False):  # the router's: gathered in fp32 (module docstring)
                (cell.op.gather if isinstance(cell.op, GatheredOp) else cell.op).in_fp32 = True
    head = model.head_weight()
    if head is None:  # a pipeline stage without the head
        return loss, eval_loss
    placement = placements[head.name]
    return ShardedLoss(loss, group, placement), ShardedLoss(eval_loss, group, placement)
