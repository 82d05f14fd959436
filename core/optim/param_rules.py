"""Which update rule each parameter takes, by name and full (1-process) shape: a leaf module without MindSpore,
shared by the optimizer and by the memory estimate that the agent runs on proposals.

Muon (Jordan et al. 2024; Liu et al. 2025) is only for hidden matrices. Embeddings and the output head are not
"hidden" (their rows are looked up / read out one token at a time, and Jordan et al. keep them on AdamW), and
vectors have nothing to orthogonalise.
"""

from __future__ import annotations

# Parameters whose name contains one of these go to AdamW even when they are 2-D: the token embedding and the
# output head. Names are the model's Parameter names, e.g. ``embed.weight``, ``lm_head.weight``.
# MoE routers too: each row scores one expert, like a head row scores a token. (3-D expert stacks are not
# matrices to Muon here: AdamW.)
ADAMW_NAME_PATTERNS = ("embed", "lm_head", "router")


def uses_muon(name: str, shape: tuple[int, ...]) -> bool:
    """True for hidden 2-D weight matrices; False (-> AdamW) for 1-D params and names in ADAMW_NAME_PATTERNS.
    ``shape`` is the parameter's full shape, not that of a shard."""
    return len(shape) == 2 and not any(pattern in name for pattern in ADAMW_NAME_PATTERNS)
