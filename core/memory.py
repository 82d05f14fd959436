"""Memory: measure a rank's peak, enforce a per-rank budget, and estimate a config's needs before it runs.

On Ascend the budget is MindSpore's device-memory cap and its allocator raises "Out of Memory". On CPU the cap
is ignored (MINDSPORE_CPU.md: 7.5 GiB allocated under a "1GB" cap) and MindSpore's memory statistics read 0, so
the kernel's figures are the measurement: VmHWM (the resident high-water mark) and RSS from /proc. A budget
then behaves like a device cap through a watchdog (see ``core.trial.Watchdog``) plus a check of VmHWM after
every step, which catches a peak that came and went between two polls.

Import-light on purpose (no MindSpore): the agent calls ``estimate_memory_bytes`` on proposals.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from core.config import ModelConfig, TrainConfig

GiB = 1024**3
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def current_rss_bytes() -> int | None:
    """Resident set size now, from /proc/self/statm (cheap enough to poll every few ms)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return None


def peak_rss_bytes() -> int | None:
    """Resident high-water mark since start or the last ``reset_peak`` (VmHWM)."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to clear_refs). False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def apply_device_memory_limit(limit_gb: float | None, device: str) -> bool:
    """Give the device allocator its cap where it has one. Returns True if the device enforces it itself.

    CPU workaround: MindSpore's CPU allocator ignores ``max_device_memory``/``set_memory(max_size)``, so on CPU
    this returns False and the caller enforces the budget on RSS (``core.trial.Watchdog``).
    """
    if limit_gb is None or device == "CPU":
        return False
    import mindspore as ms

    ms.runtime.set_memory(max_size=f"{limit_gb}GB")
    return True


# What a rank holds before the model's own tensors: the framework's libraries, kernels, thread pools and graph
# caches. On CPU this is resident host memory, measured 2026-11-29 with MindSpore 2.10: model=tiny peaks at
# 730-790 MiB of which the components below account for ~32 MiB. Unknown for other devices (0): there the agent's
# memory model learns the offset from measured peaks (autoresearch.learn.MemoryModel).
RUNTIME_BASELINE_BYTES = {"CPU": 700 * 2**20}


@dataclass
class MemoryEstimate:
    """Bytes per rank by component (fp32)."""

    params: int
    grads: int
    optimizer: int
    activations: int
    runtime: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.runtime


def _activation_bytes_per_layer(m: ModelConfig, batch: int, seq: int) -> int:
    """Saved-for-backward floats of one Llama block, hand-attention (no flash): a rough, documented count.

    Per token: norm inputs 2D, q/k/v ~ D + 2*kv, attention out D, MLP gate/up/silu/product 4F, residuals 2D;
    per head: scores and probabilities S floats each (the S x S matrices dominate at long sequences).
    """
    kv = m.n_kv_heads * m.head_dim
    per_token = 6 * m.d_model + 2 * kv + 4 * m.ffn_hidden
    attention = 2 * m.n_heads * seq * seq
    return 4 * batch * (seq * per_token + attention)


def estimate_memory(cfg: TrainConfig) -> MemoryEstimate:
    """Analytic per-rank estimate; the agent recalibrates it against measured peaks (autoresearch.learn)."""
    m, t = cfg.model, cfg.training
    n = _param_count(m)
    states = 2 if cfg.optim.name == "adamw" else 1  # Muon keeps one momentum buffer (AdamW for a minority)
    per_layer = _activation_bytes_per_layer(m, t.micro_batch_size, t.seq_len)
    if cfg.memory.recompute == "full":
        # Only each block's input survives; one block's activations are rebuilt at a time in backward.
        layers = t.micro_batch_size * t.seq_len * m.d_model * 4 * m.n_layers + per_layer
    else:
        layers = per_layer * m.n_layers
    return MemoryEstimate(params=4 * n, grads=4 * n, optimizer=4 * n * states, activations=layers,
                          runtime=RUNTIME_BASELINE_BYTES.get(cfg.device, 0))


def estimate_memory_bytes(cfg: TrainConfig) -> int:
    return estimate_memory(cfg).total


def _param_count(m: ModelConfig) -> int:
    """Parameter count without building the model (the Llama block of core.model)."""
    hd = m.head_dim
    attn = 2 * m.d_model * m.n_heads * hd + 2 * m.d_model * m.n_kv_heads * hd
    mlp = 3 * m.d_model * m.ffn_hidden
    per_layer = attn + mlp + 2 * m.d_model  # two RMSNorm weights
    head = 0 if m.tie_embeddings else m.vocab_size * m.d_model
    return m.vocab_size * m.d_model + m.n_layers * per_layer + m.d_model + head
