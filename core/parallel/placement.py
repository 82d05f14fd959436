"""Where one parameter's elements live on the mesh: the record that FSDP, TP, the optimizer, gradient clipping,
checkpoints and the memory estimate share.

A parameter of the 1-process model (``full_shape``) is split in two stages:

1. tensor parallelism cuts it into ``tp_size`` equal blocks along ``tp_dim`` (rows of a column-parallel weight,
   columns of a row-parallel one, vocabulary rows of the embedding); ``tp_index`` is this rank's block, of
   ``local_shape``. Parameters that TP does not split (norm gains) have ``tp_dim=None`` and are replicated.
2. FSDP flattens the block, pads it with zeros to a multiple of ``fsdp_size`` and keeps slice ``fsdp_index``:
   a 1-D shard of ``shard_len`` elements (ZeRO-3, Rajbhandari et al. 2020). Flat shards need no divisibility
   and give every rank the same share; the padding (< fsdp_size elements per parameter) stays zero forever,
   because its gradient is zero and AdamW and Muon both map a zero gradient on a zero weight to zero.

Data-parallel replicas (``dp_replicate``) hold identical copies and have no field here.

No MindSpore: NumPy only, so that checkpoints and the agent's estimate can use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np


# Which dim of a weight tensor parallelism splits, by parameter-name suffix (core.parallel.tensor_parallel applies
# it; core.memory counts with it): 0 = output rows (column-parallel linears, vocabulary rows), 1 = input columns
# (row-parallel linears). Weights not listed (norm gains) are replicated over tp.
TP_SPLIT_DIMS = {
    "attn.wq.weight": 0, "attn.wk.weight": 0, "attn.wv.weight": 0, "attn.wo.weight": 1,
    "mlp.w_gate.weight": 0, "mlp.w_up.weight": 0, "mlp.w_down.weight": 1,
    "embed.weight": 0, "lm_head.weight": 0,
}


def tp_split_dim(name: str) -> Optional[int]:
    """The dim tensor parallelism splits of the parameter ``name`` (e.g. ``layers.0.attn.wo.weight``), or None."""
    for suffix, dim in TP_SPLIT_DIMS.items():
        if name == suffix or name.endswith("." + suffix):
            return dim
    return None


def layout_placement(name: str, shape, tp: int, fsdp: int, tp_index: int = 0, fsdp_index: int = 0) -> "Placement":
    """The placement of parameter ``name`` under tensor-parallel degree ``tp`` and FSDP degree ``fsdp``."""
    dim = tp_split_dim(name) if tp > 1 else None
    return Placement(tuple(int(s) for s in shape), dim, tp if dim is not None else 1,
                     tp_index if dim is not None else 0, fsdp, fsdp_index)


@dataclass(frozen=True)
class Placement:
    full_shape: tuple[int, ...]
    tp_dim: Optional[int] = None
    tp_size: int = 1
    tp_index: int = 0
    fsdp_size: int = 1
    fsdp_index: int = 0

    def __post_init__(self):
        if self.tp_dim is not None and self.full_shape[self.tp_dim] % self.tp_size:
            raise ValueError(f"dim {self.tp_dim} of {self.full_shape} does not split into {self.tp_size} blocks")

    # ---- shapes ----------------------------------------------------------------------------------------------
    @property
    def local_shape(self) -> tuple[int, ...]:
        """The block this tensor-parallel rank holds (before FSDP)."""
        if self.tp_dim is None:
            return self.full_shape
        shape = list(self.full_shape)
        shape[self.tp_dim] //= self.tp_size
        return tuple(shape)

    @property
    def local_numel(self) -> int:
        return math.prod(self.local_shape)

    @property
    def shard_len(self) -> int:
        """Elements of one FSDP shard (the block's numel rounded up to a multiple of fsdp_size, split)."""
        return -(-self.local_numel // self.fsdp_size)

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The shape of the Parameter this rank holds: the TP block, or its flat FSDP shard."""
        return (self.shard_len,) if self.fsdp_size > 1 else self.local_shape

    @property
    def tp_split(self) -> bool:
        return self.tp_dim is not None and self.tp_size > 1

    def with_fsdp(self, size: int, index: int) -> "Placement":
        return Placement(self.full_shape, self.tp_dim, self.tp_size, self.tp_index, size, index)

    # ---- full <-> stored ---------------------------------------------------------------------------------------
    def tp_block(self, full: np.ndarray) -> np.ndarray:
        """This rank's TP block of a full array."""
        if not self.tp_split:
            return full
        n = self.local_shape[self.tp_dim]
        return np.take(full, np.arange(self.tp_index * n, (self.tp_index + 1) * n), axis=self.tp_dim)

    def shard(self, full: np.ndarray) -> np.ndarray:
        """The array this rank stores, cut from the 1-process array."""
        full = np.asarray(full)
        if tuple(full.shape) != tuple(self.full_shape):
            raise ValueError(f"expected shape {self.full_shape}, got {full.shape}")
        return self.fsdp_shard(self.tp_block(full))

    def fsdp_shard(self, block: np.ndarray) -> np.ndarray:
        """This rank's flat FSDP shard of its TP block (the block itself without FSDP)."""
        block = np.asarray(block, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
        if tuple(block.shape) != tuple(self.local_shape):
            raise ValueError(f"expected a block of shape {self.local_shape}, got {block.shape}")
        if self.fsdp_size == 1:
            return block
        flat = np.zeros(self.shard_len * self.fsdp_size, block.dtype)
        flat[:block.size] = block.reshape(-1)
        return flat[self.fsdp_index * self.shard_len:(self.fsdp_index + 1) * self.shard_len].copy()

    def assemble(self, pieces: Mapping[tuple[int, int], np.ndarray]) -> np.ndarray:
        """The 1-process array from every rank's stored array, keyed by (tp_index, fsdp_index)."""
        blocks = []
        for t in range(self.tp_size if self.tp_split else 1):
            flat = np.concatenate([np.asarray(pieces[(t, f)]).reshape(-1) for f in range(self.fsdp_size)])
            blocks.append(flat[:self.local_numel].reshape(self.local_shape))
        return blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=self.tp_dim)

    # ---- records -----------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"full_shape": list(self.full_shape), "tp_dim": self.tp_dim, "tp_size": self.tp_size,
                "tp_index": self.tp_index, "fsdp_size": self.fsdp_size, "fsdp_index": self.fsdp_index}

    @classmethod
    def from_json(cls, d: dict) -> "Placement":
        return cls(tuple(d["full_shape"]), d["tp_dim"], d["tp_size"], d["tp_index"], d["fsdp_size"],
                   d["fsdp_index"])


def replicated(shape) -> Placement:
    return Placement(tuple(int(s) for s in shape))
