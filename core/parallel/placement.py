"""Where one parameter's elements live on the mesh: the record that FSDP, TP, the optimizer, gradient clipping,
checkpoints and the memory estimate share.

A parameter of the 1-process model (``full_shape``) is split in up to three stages:

0. expert parallelism cuts an MoE block's stacked experts into ``ep_size`` blocks of whole experts along dim 0
   (``ep_index``: this rank's); no other parameter has an ep split.
1. tensor parallelism cuts it into ``tp_size`` equal blocks along ``tp_dim`` (rows of a column-parallel weight,
   columns of a row-parallel one, vocabulary rows of the embedding, each expert's width); ``tp_index`` is this
   rank's block, of ``local_shape``. Parameters that TP does not split (norm gains) have ``tp_dim=None`` and are
   replicated.
2. FSDP flattens the block, pads it with zeros to a multiple of ``fsdp_size`` and keeps slice ``fsdp_index``:
   a 1-D shard of ``shard_len`` elements (ZeRO-3, Rajbhandari et al. 2020). Flat shards need no divisibility
   and give every rank the same share; the padding (< fsdp_size elements per parameter) stays zero forever,
   because its gradient is zero and AdamW and Muon both map a zero gradient on a zero weight to zero.

Experts are not FSDP-sharded (their ep block is already a data-parallel rank's share, core.parallel.expert_parallel).
Data-parallel replicas (``dp_replicate``) hold identical copies and have no field here.

No MindSpore: NumPy only, so that checkpoints and the agent's estimate can use it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

# Which dim of a weight tensor parallelism splits, by parameter-name suffix (core.parallel.tensor_parallel applies
# it; core.memory counts with it): 0 = output rows (column-parallel linears, vocabulary rows), 1 = input columns
# (row-parallel linears); an MoE block's stacked experts (X, F, D), (X, F, D), (X, D, F) split each expert's width F.
# Weights not listed (norm gains, MoE routers) are replicated over tp.
TP_SPLIT_DIMS = {
    "attn.wq.weight": 0,
    "attn.wk.weight": 0,
    "attn.wv.weight": 0,
    "attn.wo.weight": 1,
    "attn.wq_b.weight": 0,  # MLA's up-projections, split by heads; its down-projections are replicated
    "attn.wkv_b.weight": 0,
    "attn.wq.bias.weight": 0,  # a column-parallel linear's bias: its output rows
    "attn.wk.bias.weight": 0,
    "attn.wv.bias.weight": 0,
    "mlp.w_gate.weight": 0,
    "mlp.w_up.weight": 0,
    "mlp.w_down.weight": 1,
    "shared.w_gate.weight": 0,
    "shared.w_up.weight": 0,
    "shared.w_down.weight": 1,
    "experts.w_gate": 1,
    "experts.w_up": 1,
    "experts.w_down": 2,
    "embed.weight": 0,
    "lm_head.weight": 0,
}


# Gains replicated over tp that each tp rank applies to its own heads only (QK-norm): their gradients are partial
# sums over tp, added up after backward (core.parallel.grads), as sequence parallelism's norm gains are.
PER_HEAD = ("attn.q_norm.weight", "attn.k_norm.weight")


def per_head(name: str) -> bool:
    return name.endswith(PER_HEAD)


def is_expert(name: str) -> bool:
    """Whether ``name`` is an MoE block's stacked expert weight (split over ep, never FSDP-sharded)."""
    return ".experts." in name


def tp_split_dim(name: str) -> int | None:
    """The dim tensor parallelism splits of the parameter ``name`` (e.g. ``layers.0.attn.wo.weight``), or None."""
    for suffix, dim in TP_SPLIT_DIMS.items():
        if name == suffix or name.endswith("." + suffix):
            return dim
    return None


def layout_placement(
    name: str, shape, tp: int, fsdp: int, *, ep: int = 1, tp_index: int = 0, fsdp_index: int = 0, ep_index: int = 0
) -> Placement:
    """The placement of parameter ``name`` under tensor-parallel degree ``tp``, FSDP degree ``fsdp`` and expert
    parallel degree ``ep`` (experts: ep and tp blocks, no FSDP; everything else: tp block and FSDP shard)."""
    dim = tp_split_dim(name) if tp > 1 else None
    tp_fields = (dim, tp, tp_index) if dim is not None else (None, 1, 0)
    if is_expert(name):
        return Placement(tuple(int(s) for s in shape), *tp_fields, ep_size=ep, ep_index=ep_index if ep > 1 else 0)
    return Placement(tuple(int(s) for s in shape), *tp_fields, fsdp, fsdp_index)


@dataclass(frozen=True)
class Placement:
    full_shape: tuple[int, ...]
    tp_dim: int | None = None
    tp_size: int = 1
    tp_index: int = 0
    fsdp_size: int = 1
    fsdp_index: int = 0
    ep_size: int = 1  # blocks of whole experts along dim 0
    ep_index: int = 0

    def __post_init__(self):
        if self.full_shape and self.full_shape[0] % self.ep_size:
            raise ValueError(f"dim 0 of {self.full_shape} does not split into {self.ep_size} expert blocks")
        if self.tp_dim is not None and self.full_shape[self.tp_dim] % self.tp_size:
            raise ValueError(f"dim {self.tp_dim} of {self.full_shape} does not split into {self.tp_size} blocks")

    # ---- shapes ----------------------------------------------------------------------------------------------
    @property
    def local_shape(self) -> tuple[int, ...]:
        """The block this rank holds before FSDP: its experts (ep), of them its tensor-parallel block."""
        shape = list(self.full_shape)
        if self.ep_size > 1:
            shape[0] //= self.ep_size
        if self.tp_dim is not None:
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
    def fsdp_pad(self) -> int:
        """Zeros after the block's flat elements that make it split into ``fsdp_size`` shards of ``shard_len``."""
        return self.shard_len * self.fsdp_size - self.local_numel

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The shape of the Parameter this rank holds: the TP block, or its flat FSDP shard."""
        return (self.shard_len,) if self.fsdp_size > 1 else self.local_shape

    @property
    def tp_split(self) -> bool:
        return self.tp_dim is not None and self.tp_size > 1

    @property
    def key(self) -> tuple[int, int, int]:
        """(ep_index, tp_index, fsdp_index): which piece of the parameter this rank stores."""
        return self.ep_index, self.tp_index, self.fsdp_index

    def piece_keys(self) -> list[tuple[int, int, int]]:
        """The keys of every piece that together make the parameter."""
        return [
            (e, t, f)
            for e in range(self.ep_size)
            for t in range(self.tp_size if self.tp_split else 1)
            for f in range(self.fsdp_size)
        ]

    def with_fsdp(self, size: int, index: int) -> Placement:
        return dataclasses.replace(self, fsdp_size=size, fsdp_index=index)

    # ---- full <-> stored ---------------------------------------------------------------------------------------
    def block(self, full: np.ndarray) -> np.ndarray:
        """This rank's block of a full array (its experts' rows, then its TP block), before FSDP."""
        out = np.asarray(full)
        if self.ep_size > 1:
            n = self.local_shape[0]
            out = out[self.ep_index * n : (self.ep_index + 1) * n]
        if self.tp_split:
            n = self.local_shape[self.tp_dim]
            out = np.take(out, np.arange(self.tp_index * n, (self.tp_index + 1) * n), axis=self.tp_dim)
        return out

    def shard(self, full: np.ndarray) -> np.ndarray:
        """The array this rank stores, cut from the 1-process array."""
        full = np.asarray(full)
        if tuple(full.shape) != tuple(self.full_shape):
            raise ValueError(f"expected shape {self.full_shape}, got {full.shape}")
        return self.fsdp_shard(self.block(full))

    def fsdp_shard(self, block: np.ndarray) -> np.ndarray:
        """This rank's flat FSDP shard of its TP block (the block itself without FSDP)."""
        block = np.asarray(block, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
        if tuple(block.shape) != tuple(self.local_shape):
            raise ValueError(f"expected a block of shape {self.local_shape}, got {block.shape}")
        if self.fsdp_size == 1:
            return block
        flat = np.zeros(self.shard_len * self.fsdp_size, block.dtype)
        flat[: block.size] = block.reshape(-1)
        return flat[self.fsdp_index * self.shard_len : (self.fsdp_index + 1) * self.shard_len].copy()

    def assemble(self, pieces: Mapping[tuple[int, int, int], np.ndarray]) -> np.ndarray:
        """The 1-process array from every rank's stored array, keyed by ``key`` (ep, tp, fsdp index)."""
        experts = []
        for e in range(self.ep_size):
            blocks = []
            for t in range(self.tp_size if self.tp_split else 1):
                flat = np.concatenate([np.asarray(pieces[(e, t, f)]).reshape(-1) for f in range(self.fsdp_size)])
                blocks.append(flat[: self.local_numel].reshape(self.local_shape))
            experts.append(blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=self.tp_dim))
        return experts[0] if len(experts) == 1 else np.concatenate(experts, axis=0)

    # ---- records -----------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"full_shape": list(self.full_shape)}

    @classmethod
    def from_json(cls, d: dict) -> Placement:
        return cls(**(d | {"full_shape": tuple(d["full_shape"])}))  # (records before ep: its defaults)


def replicated(shape) -> Placement:
    return Placement(tuple(int(s) for s in shape))
