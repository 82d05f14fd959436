"""Run health: the L2 norm of each block's gradients and of its parameters (the embedding, every transformer block,
the final norm, the head, each MTP module), the numbers Megatron and MindFormers log per layer to see which part of a model a
divergence starts in. One compiled graph per call site, one collective: every rank's weighted sums of squares per
block, all-reduced over the ranks that hold one copy of the model, then square-rooted.

Who holds what is ``core.parallel.grads``'s rule: a weight tensor parallelism does not split is counted 1/tp times
on each tp rank (MoE experts, replicated over cp, 1/cp), FSDP shards and pipeline stages add up, and a pipeline's
mirrored copy of a tied table is not counted. Gradients are passed summed over their ranks (what
``GradientSync`` returns) with the factor that makes them the global mean loss's (its ``scale``); parameters
with factor 1.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from core.parallel import comm
from core.parallel.dims import ParallelDims
from core.parallel.grads import share_of, weighted_sum_of_squares
from core.parallel.placement import Placement
from core.runtime.graphs import each, jit


def block_of(name: str) -> str:
    """The block a parameter belongs to: ``layers.<i>``, ``mtp.<k>`` (a multi-token-prediction module), or
    ``embed``, ``norm``, ``lm_head``."""
    head, _, rest = name.partition(".")
    return f"{head}.{rest.split('.', 1)[0]}" if head in ("layers", "mtp") else head


def blocks(n_layers: int, tied: bool, mtp_layers: int = 0) -> list[str]:
    """Every block of the model in order (the same on every rank, whatever it holds)."""
    head = [] if tied else ["lm_head"]
    return ["embed", *(f"layers.{i}" for i in range(n_layers)), "norm", *head, *(f"mtp.{k}" for k in range(mtp_layers))]


class _Norms(nn.Cell):
    def __init__(self, weights: list[float], membership: np.ndarray, group: comm.Group):
        super().__init__()
        self.weights = tuple(weights)
        self.membership = Tensor(membership, ms.float32)  # (tensors, blocks): 1 where a tensor is in a block
        self.reduce = comm.all_reduce(group)

    def construct(self, tensors, factor):
        squares = ops.stack(each(weighted_sum_of_squares, tensors, self.weights)).reshape(1, -1)  # (1, tensors)
        per_block = ops.matmul(squares, self.membership).reshape(-1)  # (blocks,)
        return ops.sqrt(self.reduce(per_block)) * factor


class BlockNorms:
    """``norms(tensors, factor) -> {block: L2 norm}`` for tensors in the order of ``params`` (the optimizer's):
    their gradients or the parameters themselves. Every rank must call it at the same steps (a collective)."""

    def __init__(
        self,
        params: list,
        *,
        placements: dict[str, Placement],
        dims: ParallelDims,
        groups: dict,
        n_layers: int,
        tied_embeddings: bool,
        mtp_layers: int = 0,
        mirrors: tuple = (),
    ):
        self.names = blocks(n_layers, tied_embeddings, mtp_layers)
        index = {b: j for j, b in enumerate(self.names)}
        membership = np.zeros((len(params), len(self.names)), np.float32)
        for i, p in enumerate(params):
            membership[i, index[block_of(p.name)]] = 1.0
        weights = [0.0 if p.name in mirrors else share_of(p.name, placements[p.name], dims) for p in params]
        self._fn = jit(_Norms(weights, membership, groups["model"]), source=True)

    def __call__(self, tensors, factor: float = 1.0) -> dict[str, float]:
        out = self._fn(ms.mutable(tuple(tensors)), Tensor(np.float32(factor)))
        return dict(zip(self.names, (float(v) for v in out.asnumpy()), strict=True))
