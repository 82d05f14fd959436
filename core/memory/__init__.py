"""Memory: what a step holds, and how to hold less.

    estimate.py    a config's per-rank peak before it runs: textbook tensor sizes through a measured runtime
                   profile (no MindSpore: the agent estimates every proposal)
    activations.py the bytes a block saves for backward, by part and recompute policy (the estimate's count)
    breakdown.py   the estimate by component for every pipeline rank (``python -m core.memory``)
    plan.py        the recompute plan: which blocks of each stage recompute, and how (decided once)
    recompute.py   selective recompute's wrappers, and full recompute of whole blocks
    segmented.py   full recompute under jit: the step as a chain of compiled segments
    swap.py        activation SWAP: saved tensors moved to a slower tier until backward reads them
    probe.py       this rank's resident memory and its peak, from the kernel

Names are imported on first use (``lazy_loader``): the estimate and the probe load no MindSpore.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "breakdown": ["breakdown", "format_breakdown"],
        "estimate": [
            "GiB",
            "MiB",
            "MemoryEstimate",
            "RuntimeProfile",
            "Terms",
            "apply_profile",
            "estimate_memory",
            "estimate_memory_bytes",
            "runtime_profile",
            "terms",
        ],
        "plan": ["RecomputePlan", "recompute_plan"],
        "probe": ["current_rss_bytes", "peak_rss_bytes", "reset_peak"],
        "recompute": ["apply_selective", "mark_full"],
        "segmented": ["SegmentedStep"],
        "swap": ["ActivationSwap"],
    },
)
