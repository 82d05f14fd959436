"""The GPT model: `GPT(cfg, dtype, seed)`, and the counts used for reporting and MFU."""

from core.model.gpt import GPT, count_params, flops_per_token, matmul_params

__all__ = ["GPT", "count_params", "flops_per_token", "matmul_params"]
