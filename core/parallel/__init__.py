"""How a step's work is split over ranks. The model knows nothing of this package.

    dims.py               ParallelDims: the mesh (pp, dp_replicate, dp_shard, cp, tp), coordinates, group ranks
    placement.py          how one parameter is split over tp and fsdp (shared by FSDP, optimizer, checkpoints,
                          the memory estimate); pure Python
    comm/                 process groups, collectives paired with their backward, point-to-point messages
    tensor_parallel.py    column/row-parallel linears, vocab-parallel embedding, sequence parallelism
    vocab_parallel_loss.py  the fused linear cross-entropy over a vocabulary split across tp
    context_parallel.py   the sequence over cp ranks (load-balanced chunks), attention over gathered K/V
    expert_parallel.py    MoE blocks on the mesh: experts over the dp_shard ranks, tokens by all-to-all
    fsdp.py               FSDP/HSDP: flat shards gathered per op, gradients reduce-scattered
    zero1.py              ZeRO-1: weights and gradients whole, masters and optimizer states sharded
    pipeline/             pipeline schedules, stages and the pipeline step
    grads.py              GradientSync: the gradient of the global mean loss, clipped by the global norm
    block_norms.py        run health: each block's gradient and parameter norms (training.health_interval)

Each technique has an ``apply_*`` that ``core.training.parallelize`` calls in order. Names are imported on first
use (``lazy_loader``): the memory estimate reads ``placement`` and the pipeline schedules without MindSpore.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=["comm", "pipeline"],
    submod_attrs={
        "context_parallel": ["apply_context_parallel", "chunk_positions"],
        "dims": ["MESH", "ParallelDims"],
        "expert_parallel": ["apply_moe_parallel"],
        "fsdp": ["apply_fsdp"],
        "grads": ["GradientSync"],
        "placement": ["Placement", "is_expert", "layout_placement", "replicated"],
        "tensor_parallel": ["apply_tensor_parallel"],
        "zero1": ["MasterWeights"],
    },
)
