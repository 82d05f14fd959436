"""Context parallelism: the sequence split over ``cp`` ranks, attention exact over the whole sequence.

Load balance (Megatron-LM's CP, Llama 3 §3.3.2): the sequence is cut into 2*cp equal chunks and rank i holds
chunks i and 2*cp-1-i. Under a causal mask the work of a query grows with its position, so pairing an early chunk
with its mirror gives every rank the same number of unmasked (query, key) pairs.

Attention: each rank all-gathers the keys and values of the whole sequence (with their positions) and attends
from its own queries, the causal mask built from the positions. Why all-gather rather than ring attention with an
online softmax (Liu et al. 2023): with grouped-query attention K and V are small (n_kv_heads of n_heads), the
all-gather is one collective per tensor and layer where the ring needs cp-1 point-to-point rounds, and on this
CPU backend each collective costs milliseconds and point-to-point messages are sent from the host, between
compiled graphs (``comm.p2p``; docs/mindspore-cpu.md, "Collectives and point-to-point"); the ring's advantage,
overlapping each round with compute on a fast link, does not exist here. Llama 3 makes the same choice for the same reason (GQA). The backward reduce-scatters the
key/value gradients to the ranks that own those tokens (``comm.GatherFrom``).

RoPE uses the same positions (``GPT.construct(tokens, positions)``), so each chunk is rotated by where it sits in
the sequence.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn

from core.model.gpt import transformer_blocks
from core.model.layers import CausalAttention
from core.parallel import comm


def chunk_positions(seq_len: int, cp: int, index: int) -> np.ndarray:
    """Positions (seq_len / cp,) int32 held by context-parallel rank ``index``: chunks index and 2cp-1-index."""
    if seq_len % (2 * cp):
        raise ValueError(f"seq_len {seq_len} does not split into 2 * cp = {2 * cp} chunks")
    n = seq_len // (2 * cp)
    first, mirror = index, 2 * cp - 1 - index
    return np.concatenate([np.arange(first * n, (first + 1) * n), np.arange(mirror * n, (mirror + 1) * n)]).astype(
        np.int32
    )


class ContextParallelSDPA(nn.Cell):
    """``sdpa(q, k, v, positions)`` for this rank's chunks: q (B, H, S/cp, E), k/v (B, K, S/cp, E) -> (B, H, S/cp, E)
    over the keys of the whole sequence."""

    def __init__(self, scale: float, group: comm.Group):
        super().__init__()
        self.attend = CausalAttention(scale)
        self.gather_k, self.gather_v = comm.GatherFrom(group, 2), comm.GatherFrom(group, 2)
        self.gather_positions = comm.all_gather(group, 0)  # no gradient: positions are data

    def construct(self, q, k, v, positions):
        k_all, v_all = self.gather_k(k), self.gather_v(v)  # (B, K, S, E)
        # Through float32 (exact below 2^24): the CPU composition sums, and positions are data, not gradients.
        k_positions = self.gather_positions(positions.astype(ms.float32)).astype(ms.int32)  # (S,)
        return self.attend(q, k_all, v_all, positions, k_positions)


def apply_context_parallel(model: nn.Cell, group: comm.Group) -> None:
    for block in transformer_blocks(model):
        block.attn.sdpa = ContextParallelSDPA(block.attn.sdpa.scale, group)
