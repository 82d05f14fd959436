"""Context parallelism: the sequence split over ``cp`` ranks, attention exact over the whole sequence.

Load balance (Megatron-LM's CP, Llama 3 §3.3.2): the sequence is cut into 2*cp equal chunks and rank i holds
chunks i and 2*cp-1-i. Under a causal mask the work of a query grows with its position, so pairing an early chunk
with its mirror gives every rank the same number of unmasked (query, key) pairs.

Attention: each rank all-gathers the keys and values of the whole sequence (one collective: k and v side by side)
and attends from its own queries, the causal mask built from the positions; the keys' positions are the layout's
(every rank's chunks in group order), known when the model is built, so they are not gathered. Why all-gather rather
than ring attention with an online softmax (Liu et al. 2023): with grouped-query attention K and V are small
(n_kv_heads of n_heads), the all-gather is one collective per layer where the ring needs cp-1 point-to-point
rounds, and on this CPU backend each collective costs milliseconds and point-to-point messages are sent from the
host, between compiled graphs (``comm.p2p``; docs/mindspore-cpu.md, "Collectives and point-to-point"); the
ring's advantage, overlapping each round with compute on a fast link, does not exist here. Llama 3 makes the same
choice for the same reason (GQA). The backward reduce-scatters the key/value gradients to the ranks that own those
tokens (``comm.GatherFrom``), again one collective for both.

RoPE uses the same positions (``GPT.construct(tokens, positions)``), so each chunk is rotated by where it sits in
the sequence.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

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


def key_positions(seq_len: int, cp: int) -> np.ndarray:
    """(seq_len,) int32: the positions of the whole sequence's keys as the all-gather lays them out, rank by rank."""
    return np.concatenate([chunk_positions(seq_len, cp, i) for i in range(cp)])


class ContextParallelSDPA(nn.Cell):
    """``sdpa(q, k, v, positions)`` for this rank's chunks: q (B, H, S/cp, E), k (B, K, S/cp, E), v (B, K, S/cp, Ev)
    -> (B, H, S/cp, Ev) over the keys of the whole sequence, at ``k_positions`` (S,)."""

    def __init__(self, scale: float, group: comm.Group, k_positions: np.ndarray):
        super().__init__()
        self.attend = CausalAttention(scale)
        self.gather = comm.GatherFrom(group, 2)
        self.k_positions = Tensor(k_positions, ms.int32)

    def construct(self, q, k, v, positions):
        E = k.shape[-1]
        kv = self.gather(ops.concat((k, v), -1))  # (B, K, S, E + Ev): one all-gather (and reduce-scatter) for both
        k_all, v_all = ops.split(kv, [E, kv.shape[-1] - E], axis=-1)  # kernels, not views (core.model.layers)
        return self.attend(q, k_all, v_all, positions, self.k_positions)


def apply_context_parallel(model: nn.Cell, group: comm.Group, seq_len: int) -> None:
    k_positions = key_positions(seq_len, group.size)
    for block in transformer_blocks(model):
        block.attn.sdpa = ContextParallelSDPA(block.attn.sdpa.scale, group, k_positions)
