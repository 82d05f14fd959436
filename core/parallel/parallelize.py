"""``parallelize(model, dims, cfg)``: the one place where a model becomes a mesh-parallel one.

In this order (torchtitan's): tensor and sequence parallelism split weights and wrap their ops; context
parallelism replaces attention; recompute; FSDP shards whatever weights are left (TP blocks included) and wraps
every op once more, knowing which blocks recompute. The blocks are *marked* for recompute last, once every weight
has its final Parameter: MindSpore's PyNative recompute captures a block's parameters when it is marked (marked
before FSDP, it differentiated the replaced full weights and lost the shards' gradients: measured). The model's
code never changes: only its ``op`` and ``sdpa`` seams and its weights (core.model.layers). The trainer asks for
a ``Parallelized`` and never branches on a degree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mindspore import nn

from core.config import TrainConfig
from core.loss import LinearCrossEntropyLoss
from core.parallel import comm
from core.parallel.context_parallel import apply_context_parallel, chunk_positions
from core.parallel.dims import ParallelDims
from core.parallel.fsdp import apply_fsdp
from core.parallel.placement import Placement, replicated
from core.parallel.tensor_parallel import apply_tensor_parallel


@dataclass
class Parallelized:
    """A model ready for this rank, and what the trainer needs around it."""

    model: nn.Cell
    loss: nn.Cell            # (hidden, head weight, labels) -> mean loss, for training
    eval_loss: nn.Cell       # the same without gradients
    placements: dict         # parameter name -> Placement (checkpoints, optimizer, clipping, estimate)
    dims: ParallelDims
    groups: dict             # axis or view -> comm.Group
    positions: np.ndarray    # (S / cp,) int32: the sequence positions of this rank's tokens

    def local_tokens(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """This rank's (inputs, targets), each (b, S / cp), from its batch rows (b, S + 1)."""
        return rows[:, :-1][:, self.positions], rows[:, 1:][:, self.positions]


def parallelize(model: nn.Cell, dims: ParallelDims, cfg: TrainConfig) -> Parallelized:
    groups = comm.mesh_groups(dims)
    placements: dict[str, Placement] = {p.name: replicated(p.shape) for p in model.trainable_params()}
    loss, eval_loss = LinearCrossEntropyLoss(train=True), LinearCrossEntropyLoss(train=False)
    if dims.tp > 1:
        loss, eval_loss = apply_tensor_parallel(model, groups["tp"], dims.sp, placements)
    if dims.cp > 1:
        apply_context_parallel(model, groups["cp"])
    recompute = cfg.memory.recompute == "full"
    if dims.size("fsdp") > 1:
        loss, eval_loss = apply_fsdp(model, groups["fsdp"], placements, loss, eval_loss, recomputed=recompute)
    if recompute:
        for block in model.layers:
            block.recompute()
    S = cfg.training.seq_len
    positions = chunk_positions(S, dims.cp, dims.index("cp")) if dims.cp > 1 else np.arange(S, dtype=np.int32)
    return Parallelized(model, loss, eval_loss, placements, dims, groups, positions)
