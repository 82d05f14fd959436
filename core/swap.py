"""Activation SWAP (``memory.swap``): tensors saved for backward leave fast memory after the forward pass and come
back when the backward pass reads them (MindFormers' ``swap_config``; Ren et al. 2021, ZeRO-Offload, for the idea).

Mechanism: ``mindspore.saved_tensors_hooks(pack, unpack)``, which PyNative calls for every tensor autodiff saves.
Under ``mindspore.jit`` the compiled graph owns its saved tensors and no hook sees them, so core.config refuses
``memory.swap`` there (exit 2) and the search spaces carry that constraint.

The slower tier: on Ascend, host memory (a NumPy copy of the device tensor). On CPU host and device are one
memory, so a host copy would save nothing (measured); the tier is a disk-backed file per tensor in the trial's
directory — slow, and honest about it. Tensors under ``min_bytes`` (norm statistics, masks) stay where they are:
moving them costs more than it frees. Every layer's saved activations are swapped; per-layer or per-op choice
is not built.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor


def _disk_tier(device: str) -> bool:
    """CPU workaround: host memory is the device's memory, so swapped tensors go to disk."""
    return device == "CPU"


class ActivationSwap:
    """``with swap.step(): loss, grads = grad_fn(...)``: saved tensors swapped out during that call.
    ``swapped_bytes``: what the last call moved."""

    def __init__(self, directory: str | Path, device: str, min_bytes: int = 1 << 16):
        self.dir, self.disk, self.min_bytes = Path(directory), _disk_tier(device), min_bytes
        self.count = 0
        self.swapped_bytes = 0

    def _pack(self, t: Tensor):
        if not isinstance(t, Tensor) or t.nbytes < self.min_bytes:
            return t
        self.count += 1
        self.swapped_bytes += t.nbytes
        array = t.asnumpy()
        if not self.disk:
            return array
        path = self.dir / f"{self.count}.npy"
        np.save(path, array)
        return path

    def _unpack(self, packed):
        if isinstance(packed, Tensor):
            return packed
        return Tensor(np.load(packed) if isinstance(packed, Path) else packed)

    @contextmanager
    def step(self):
        """The hooks for one forward+backward; its files are removed when it ends."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.swapped_bytes = 0
        try:
            with ms.saved_tensors_hooks(self._pack, self._unpack):
                yield
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
