"""After backward: each gradient summed over the ranks that computed a part of it, and the factor that scales it
into the gradient of the global mean loss, clipped by the global norm — one compiled graph. The optimizer applies
the factor as it reads each gradient (``Optimizer.step(grads, lr, scale)``), so no scaled copy is written.

Who holds a part of which gradient:
- FSDP-sharded weights leave backward already summed over the fsdp ranks (their reduce-scatter, ``fsdp.py``);
- every weight is summed over ``dp_replicate`` (one flat all-reduce: a collective has a fixed cost per call,
  milliseconds on CPU, docs/mindspore-cpu.md "Collectives and point-to-point", so one big one beats one per weight);
- with sequence parallelism, weights that tensor parallelism does not split (the norm gains) saw 1/tp of the
  tokens each, so they are summed over ``tp`` too; so are QK-norm's gains under any tensor parallelism (each rank
  normalised its own heads: ``placement.per_head``).
- with a pipeline and tied embeddings, the first stage's table and the last stage's copy (its head) are summed
  between the two (``Parallelized.tied``), so that both take the same step.
Then the sum is divided by the ranks whose losses average into the global loss (dp_replicate * dp_shard * cp)
and by the micro-batches.

The global norm (Pascanu et al. 2013, as PyTorch's ``clip_grad_norm_``): squares summed over this rank's
gradients, a weight replicated over ``tp`` counted 1/tp times (MoE experts, replicated over ``cp``, 1/cp), then
summed over the ranks that hold one copy of the model (pp * dp_shard * cp * tp), the copy of a tied table not
counted. FSDP padding is zero and adds nothing. With ``fused`` (CPU, ``execution.cpu_kernels``) the squares are
summed by one kernel over all gradients (``core.runtime.kernels.sum_of_squares``) instead of three per gradient.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint, nn, ops

from core.parallel import comm
from core.parallel.dims import ParallelDims
from core.parallel.placement import Placement, is_expert, per_head
from core.runtime import kernels
from core.runtime.graphs import each, jit, pick

NORM_EPS = 1e-6  # guards a zero norm in the clipping coefficient max_norm / (norm + eps)


class _FlatAllReduce(nn.Cell):
    """Sum a tuple of tensors over a group with one collective."""

    def __init__(self, group: comm.Group, shapes: list[tuple[int, ...]]):
        super().__init__()
        self.reduce = comm.all_reduce(group)
        self.shapes = tuple(shapes)
        self.sizes = tuple(math.prod(s) for s in shapes)

    def construct(self, tensors):
        flat = mint.cat(each(_flat, tensors))
        parts = mint.split(self.reduce(flat), self.sizes)
        return each(_reshape, parts, self.shapes)


class _Sync(nn.Cell):
    def __init__(
        self,
        names: list[str],
        shapes: list[tuple[int, ...]],
        *,
        placements: dict[str, Placement],
        dims: ParallelDims,
        groups: dict,
        scale: float,
        max_norm: float,
        tied: tuple,
        mirrors: tuple,
        fused: bool,
    ):
        super().__init__()
        self.replicas = _FlatAllReduce(groups["dp_replicate"], shapes) if dims.dp_replicate > 1 else None
        self.tied = tuple(i for i, name in enumerate(names) if name in tied)
        self.tied_sum = _FlatAllReduce(groups["embed"], [shapes[i] for i in self.tied]) if self.tied else None
        partial = [
            i
            for i, name in enumerate(names)
            if (dims.sp and not placements[name].tp_split) or (dims.tp > 1 and per_head(name))
        ]
        self.partial = tuple(partial)
        self.tp_sum = _FlatAllReduce(groups["tp"], [shapes[i] for i in partial]) if partial else None
        self.norm_weight = tuple(0.0 if name in mirrors else share_of(name, placements[name], dims) for name in names)
        self.norm_sum = comm.all_reduce(groups["model"])
        self.sums = any(x is not None for x in (self.replicas, self.tp_sum, self.tied_sum))
        self.scale, self.max_norm = scale, max_norm
        self.fused = fused
        self.weights = Tensor(np.asarray(self.norm_weight, np.float32))

    def construct(self, grads):
        if self.replicas is not None:
            grads = self.replicas(grads)
        if self.tp_sum is not None:
            grads = _replace(grads, self.partial, self.tp_sum(pick(grads, self.partial)))
        if self.tied_sum is not None:
            grads = _replace(grads, self.tied, self.tied_sum(pick(grads, self.tied)))
        # The norm of the scaled gradients from the unscaled ones; the optimizer multiplies by scale * clip as it
        # reads them: each gradient is read twice (squares, update), not four times (scale, square, sum, clip).
        if self.fused:
            total = kernels.sum_of_squares(grads, self.weights)  # (1,)
        else:
            total = ops.addn(each(weighted_sum_of_squares, grads, self.norm_weight)).reshape(1)
        norm = ops.sqrt(self.norm_sum(total)).reshape(()) * self.scale
        coef = ops.fill(ms.float32, (), self.scale)
        if self.max_norm > 0:
            coef = ops.minimum(self.max_norm / (norm + NORM_EPS), 1.0) * self.scale
        if self.sums:
            return grads, norm, coef
        # Gradients no collective changed are not returned: a graph copies what it returns, a cost per step
        # (benchmarks/RESULTS.md, "core/parallel/grads.py").
        return norm, coef


def share_of(name: str, placement: Placement, dims: ParallelDims) -> float:
    """1 / the number of ranks of the ``model`` group that hold the same gradient: tensor-parallel replicas of a
    weight TP does not split, and the context-parallel replicas of experts (never FSDP-sharded)."""
    copies = dims.tp if dims.tp > 1 and not placement.tp_split else 1
    return 1.0 / (copies * (dims.cp if is_expert(name) else 1))


def _flat(x):
    return x.reshape(-1)


def _reshape(x, shape):
    return x.reshape(shape)


def sum_of_squares(x: Tensor) -> Tensor:
    """sum(x^2) over every element, a float32 scalar: rows first, then their sums. Why: MindSpore 2.10's CPU
    ReduceSum over all axes of a matrix takes a slow path, several times slower than reducing the last axis first
    and then the rest (benchmarks/RESULTS.md, "Before: the AVX-512 machine of 2026-12-01 morning"); the value is
    the same, so every device runs this form. On CPU with the fused kernels built, the kernel replaces it."""
    return ops.sum(ops.sum(ops.square(x.reshape(-1, x.shape[-1])), -1))


def weighted_sum_of_squares(g, weight):
    return sum_of_squares(g) * weight


def _replace(grads: tuple, indices: tuple, new: tuple) -> tuple:
    out = list(grads)
    for j in range(len(indices)):
        out[indices[j]] = new[j]
    return tuple(out)


class GradientSync:
    """``sync(grads) -> (grads, norm, scale)`` for ``params`` (in the optimizer's order): the summed gradients,
    the global norm of the global mean loss's gradient, and the factor (0-d) that turns the summed gradients into
    that gradient, clipped by ``max_norm`` (0: not clipped). ``tied``: parameters whose gradient is summed with a
    copy on another pipeline stage, ``mirrors`` those copies held here (``core.training.parallelize``);
    ``fused``: the norm by ``core.runtime.kernels`` (CPU)."""

    def __init__(
        self,
        params: list,
        *,
        placements: dict[str, Placement],
        dims: ParallelDims,
        groups: dict,
        micro_batches: int,
        max_norm: float,
        tied: tuple = (),
        mirrors: tuple = (),
        fused: bool = False,
    ):
        names, shapes = [p.name for p in params], [tuple(p.shape) for p in params]
        self._cell = _Sync(
            names,
            shapes,
            placements=placements,
            dims=dims,
            groups=groups,
            scale=1.0 / (dims.size("loss") * micro_batches),
            max_norm=max_norm,
            tied=tied,
            mirrors=mirrors,
            fused=fused,
        )
        self._fn = jit(self._cell, source=True)

    @property
    def scale(self) -> float:
        """The factor that turns the summed gradients into the global mean loss's (before clipping)."""
        return self._cell.scale

    def __call__(self, grads):
        # mutable: a jit function given a plain tuple of Tensors treats it as a constant and recompiles each step
        out = self._fn(ms.mutable(tuple(grads)))
        return out if self._cell.sums else (tuple(grads), *out)
