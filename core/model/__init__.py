"""The model: a Llama-style GPT with optional mixture-of-experts blocks, and its fused loss. It knows nothing of
parallelism: ``core.training.parallelize`` shards and wraps its cells from outside, through the seams each layer
documents.

    gpt.py      GPT(cfg, seed): embedding, blocks, final norm; returns hidden states (the loss applies the head)
    block.py    Block: pre-norm attention and MLP or MoE, with residuals
    layers.py   Linear, Embedding, RMSNorm, RoPE, GQA attention, SwiGLU MLP
    mla.py      multi-head latent attention (DeepSeek-V2/V3)
    mtp.py      multi-token prediction modules (DeepSeek-V3) and their loss
    moe.py      a top-k router over grouped experts, capacity-bounded or dropless
    loss.py     fused linear + cross-entropy with a hand-written backward (the logits never held whole)
    precision.py  mixed precision: where values leave fp32 (bf16 on accelerators, emulated on CPU)
    flops.py    parameter shapes, FLOPs per token, expert capacity: counted from the config (no MindSpore)

Names are imported on first use (``lazy_loader``): the memory estimate reads ``flops`` without loading MindSpore.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "block": ["Block"],
        "flops": [
            "attention_matrices",
            "flops_per_token",
            "matmul_params",
            "moe_capacity",
            "param_groups",
            "param_shapes",
        ],
        "gpt": ["GPT", "count_params", "transformer_blocks"],
        "loss": ["IGNORE_INDEX", "LinearCrossEntropyLoss", "cross_entropy", "linear_cross_entropy"],
        "moe": ["MoE", "moe_layers"],
        "mtp": ["MTPLayer", "MTPLoss", "mtp_targets"],
    },
)
