"""Activation SWAP (``memory.swap``): tensors saved for backward leave fast memory after the forward pass and come
back when the backward pass reads them (MindFormers' ``swap_config``: ``layer_swap``, ``op_swap``,
``backward_prefetch``; Ren et al. 2021, ZeRO-Offload, for the idea).

What moves: the saved tensors of the first ``memory.swap_layers`` blocks (all by default; the first blocks'
activations wait longest for their backward), of the parts ``memory.swap_ops`` names (attention, mlp, norm; all by
default). The embedding, the final norm and the loss's tensors move only when both are null: the whole model,
as ``memory.swap=true`` alone always did. Tensors under ``min_bytes`` (norm statistics, masks) stay where they
are: moving them costs more than it frees.

Mechanism: ``mindspore.saved_tensors_hooks(pack, unpack)``, which PyNative calls for every tensor autodiff saves.
Under ``mindspore.jit`` the compiled graph owns its saved tensors and no hook sees them, so the config refuses
``memory.swap`` there (exit 2) and the search spaces carry that constraint. Which block and part saved a tensor
comes from Cell forward hooks that this module registers on the blocks and their sub-cells (``attn_norm``,
``attn``, ``mlp_norm``, ``mlp``): a pre-hook pushes the tag that ``pack`` reads, the hook after pops it, so the
model code stays unaware of SWAP. Measured with MindSpore 2.10 PyNative on CPU (a 3-block model under
``ms.value_and_grad``): the forward hooks fire, ``pack`` runs synchronously in the forward (the context turns the
asynchronous front-end pipeline off), hooked and unhooked models give bit-identical losses and gradients, no
block saves a tensor outside those four sub-cells (the residual adds save nothing), and ``unpack`` is lazy: each
block's tensors are read, once each, in reverse order, after the gradient of that block's output exists.

Prefetch (``memory.swap_prefetch`` = p): the forward is cut into regions at block boundaries (block i, and the
stretches before, between and after blocks). When backward first reads a region's swapped tensors, a worker
thread starts loading those of the next p regions backward needs (block i-1, ...), in the order it will read them;
``unpack`` takes a loaded tensor out of the queue (so it is used once and freed with autodiff's reference) or
waits for it. File reads release the GIL; a tensor built in the worker gave bit-identical gradients (measured).
Prefetch trades memory for hiding the tier's latency: measured on CPU, the peak rise was lowest without prefetch
(a tensor read on demand is freed as soon as its op's backward used it), and each block read ahead added about a
block's worth of swapped tensors (the first nearly two): three blocks ahead peaked above no SWAP at all, at the
same step time (benchmarks/RESULTS.md, "core/memory/swap.py"). The files come back from the page cache, so on CPU
prefetch hides nothing and is off by default (0).
The slower tier: on Ascend, host memory (a NumPy copy of the device tensor; the worker only wraps it, the copy
back to the device happens when the op runs: not overlapped, not measured). On CPU host and device are one
memory, so a host copy would save nothing (measured); the tier is a disk-backed file per tensor in the trial's
directory — slow, and honest about it. Files are removed when each forward+backward ends, or fails.
"""

from __future__ import annotations

import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from core.config import SWAP_OPS

_PARTS = {"attn_norm": "norm", "attn": "attention", "mlp_norm": "norm", "mlp": "mlp"}  # a Block's sub-cells


def _disk_tier(device: str) -> bool:
    """CPU workaround: host memory is the device's memory, so swapped tensors go to disk."""
    return device == "CPU"


class _Swapped:
    """What ``pack`` keeps of a swapped tensor: its number, the region that saved it, and the file or host copy."""

    __slots__ = ("key", "region", "data")

    def __init__(self, key: int, region: int, data):
        self.key, self.region, self.data = key, region, data


class ActivationSwap:
    """``with swap.step(): loss, grads = grad_fn(...)``: the chosen saved tensors of ``model`` swapped out during
    that call. ``swapped_bytes``: what the last call moved; ``prefetched``: how many of its tensors came back
    through the prefetch; ``count``: tensors swapped so far."""

    def __init__(
        self,
        model: nn.Cell,
        directory: str | Path,
        *,
        device: str,
        layers: int | None = None,
        ops: list[str] | None = None,
        prefetch: int = 0,
        min_bytes: int = 1 << 16,
    ):
        self.dir, self.disk, self.min_bytes, self.prefetch = Path(directory), _disk_tier(device), min_bytes, prefetch
        self.whole = layers is None and ops is None  # the tensors outside blocks too
        self.blocks = range(len(model.layers) if layers is None else layers)
        self.ops = set(ops if ops is not None else SWAP_OPS)
        self.count = self.swapped_bytes = self.prefetched = 0
        self._tags: list[tuple[int, str | None]] = []  # (block, part) of the cells running now, innermost last
        self._reset()
        for i, block in enumerate(model.layers):
            self._tag(block, i, None, boundary=True)
            for name, part in _PARTS.items():
                self._tag(getattr(block, name), i, part)

    def _reset(self) -> None:
        self._region = 0  # block boundaries crossed in this forward
        self._regions: list[int] = []  # the regions with swapped tensors, in forward order
        self._saved: dict[int, list[_Swapped]] = {}  # region -> its swapped tensors, until read or queued
        self._read: set[int] = set()  # the regions backward has started reading
        self._ahead: dict[int, Future] = {}  # key -> a load queued or done, not used yet
        self._pool: ThreadPoolExecutor | None = None

    def _tag(self, cell: nn.Cell, block: int, part: str | None, boundary: bool = False) -> None:
        def enter(_cell, _args):
            self._tags.append((block, part))
            self._region += boundary

        def leave(_cell, _args, _out):
            self._tags.pop()
            self._region += boundary

        cell.register_forward_pre_hook(enter)
        cell.register_forward_hook(leave)

    def _chosen(self) -> bool:
        if not self._tags:
            return self.whole
        block, part = self._tags[-1]
        # a block's own tensors outside its sub-cells (none measured) move only with every part chosen
        return block in self.blocks and (part in self.ops if part else self.ops == set(SWAP_OPS))

    def _pack(self, t: Tensor):
        if not isinstance(t, Tensor) or t.nbytes < self.min_bytes or not self._chosen():
            return t
        self.count += 1
        self.swapped_bytes += t.nbytes
        array = t.asnumpy()
        data = array
        if self.disk:
            data = self.dir / f"{self.count}.npy"
            np.save(data, array)
        packed = _Swapped(self.count, self._region, data)
        if self.prefetch:  # kept for the prefetch until read or queued
            if not self._regions or self._regions[-1] != self._region:
                self._regions.append(self._region)
            self._saved.setdefault(self._region, []).append(packed)
        return packed

    def _unpack(self, packed):
        if isinstance(packed, Tensor):
            return packed
        if self._pool is not None and packed.region not in self._read:
            self._read.add(packed.region)
            self._saved.pop(packed.region, None)  # read as backward needs them, not queued
            self._load_ahead(packed.region)
        ahead = self._ahead.pop(packed.key, None)  # popped: the queue holds a prefetched tensor only once
        if ahead is None:
            return self._load(packed)
        self.prefetched += 1
        return ahead.result()

    def _load_ahead(self, region: int) -> None:
        """Queue the tensors of the ``prefetch`` regions with swapped tensors before ``region`` that are not queued
        yet, as backward reads them: the nearest region first, each region's tensors in reverse order of saving."""
        for r in reversed([r for r in self._regions if r < region][-self.prefetch :]):
            for packed in reversed(self._saved.pop(r, [])):  # popped: queued once
                self._ahead[packed.key] = self._pool.submit(self._load, packed)

    def _load(self, packed: _Swapped) -> Tensor:
        return Tensor(np.load(packed.data) if self.disk else packed.data)

    @contextmanager
    def step(self):
        """The hooks for one forward+backward; its files are removed when it ends."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.swapped_bytes = self.prefetched = 0
        self._tags.clear()  # a failed forward may have left tags behind
        self._reset()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="swap-prefetch") if self.prefetch else None
        try:
            with ms.saved_tensors_hooks(self._pack, self._unpack):
                yield
        finally:
            if self._pool is not None:  # no read may outlive the files, nor a tensor the step
                self._pool.shutdown(wait=True, cancel_futures=True)
            self._reset()
            shutil.rmtree(self.dir, ignore_errors=True)
