"""The model section of a trial's config: the shape of the GPT. The presets in ``configs/model/`` fill it; the
rest of the schema (``core.config.schema``) holds it as ``TrainConfig.model``. Kept apart because it is the section
that grows with every architecture the core learns. No MindSpore here.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config.rules import positive, require


@dataclass
class ModelConfig:
    """A GPT (Llama-style block: RMSNorm, RoPE, GQA attention, SwiGLU MLP), optionally with mixture-of-experts
    blocks. The presets are the files in ``configs/model/``."""

    name: str = "tiny"
    """The preset's name (``configs/model/<name>.yaml``)."""
    vocab_size: int = 256
    """Token ids the embedding and the head cover (256: the byte-level tokenizer)."""
    n_layers: int = 2
    """Transformer blocks."""
    d_model: int = 128
    """Hidden width."""
    n_heads: int = 4
    """Query heads; ``d_model / n_heads`` is the head dimension (even, for RoPE) unless ``head_dim`` says."""
    head_dim: int | None = None
    """Each head's width (even, for RoPE); null: d_model / n_heads. Set when the heads' total width differs from
    d_model (Qwen3's small models, Mistral NeMo): q maps d_model to n_heads * head_dim and o back."""
    n_kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide ``n_heads``."""
    ffn_hidden: int = 384
    """SwiGLU hidden width of a dense block."""
    max_seq_len: int = 256
    """Length of the RoPE tables; ``training.seq_len`` must not exceed it."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    rope_scaling: str = "none"
    """RoPE's frequencies for a longer context: none; llama3 (Llama 3.1: wavelengths longer than
    rope_original_max_len / rope_low_freq_factor divided by rope_factor, those shorter than rope_original_max_len /
    rope_high_freq_factor kept, a smooth ramp between); yarn (Peng et al. 2023: NTK-by-parts interpolation between
    rope_beta_fast and rope_beta_slow rotations, cos and sin scaled by rope_attention_factor)."""
    rope_factor: float = 1.0
    """How much longer the context is than the one the frequencies were trained at (llama3, yarn)."""
    rope_original_max_len: int | None = None
    """The context length the frequencies were trained at (llama3, yarn)."""
    rope_low_freq_factor: float = 1.0
    """llama3: wavelengths past rope_original_max_len / this are divided by rope_factor."""
    rope_high_freq_factor: float = 4.0
    """llama3: wavelengths below rope_original_max_len / this are kept."""
    rope_beta_fast: float = 32.0
    """yarn: dimensions rotating more often than this over the original context keep their frequency."""
    rope_beta_slow: float = 1.0
    """yarn: dimensions rotating less often than this are interpolated fully."""
    rope_attention_factor: float | None = None
    """yarn: cos and sin scaled by this; null: 0.1 ln(rope_factor) + 1 (the paper's temperature)."""
    rope_truncate: bool = True
    """yarn: the interpolation ramp's ends rounded to whole dimensions (transformers' default)."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    attn_bias: bool = False
    """Biases on the q, k and v projections (Qwen2)."""
    qk_norm: bool = False
    """RMSNorm over each head's q and k before RoPE, one gain per head dimension shared by the heads (Qwen3)."""
    tie_embeddings: bool = True
    """The output head shares the token embedding's table."""
    init_std: float = 0.02
    """Weights start N(0, init_std); residual projections N(0, init_std / sqrt(2 n_layers)) (GPT-2)."""
    n_experts: int = 0
    """Routed experts of every block after the dense ones (``core.model.moe``); 0: a dense model."""
    moe_top_k: int = 2
    """Experts each token is routed to."""
    moe_router: str = "softmax"
    """Router scores: softmax (Mixtral) or sigmoid (DeepSeek-V3)."""
    moe_norm_topk: bool = True
    """Each token's k chosen scores renormalised to sum to 1 as its gates (Mixtral, Qwen3-MoE's checkpoints); false:
    the scores themselves."""
    moe_capacity_factor: float | None = None
    """Slots per expert as a multiple of its fair share of the tokens; null: dropless routing."""
    moe_aux_loss_weight: float = 0.01
    """Weight of the load-balance loss (Switch Transformer)."""
    moe_shared_experts: int = 0
    """Experts every token uses (DeepSeek-MoE), run as one MLP of that many widths."""
    moe_dense_layers: int = 0
    """The first blocks that keep a dense MLP."""
    moe_ffn_hidden: int | None = None
    """Each expert's width; null: ``ffn_hidden``."""

    def __post_init__(self):
        positive(
            "model",
            self,
            "vocab_size",
            "n_layers",
            "d_model",
            "n_heads",
            "n_kv_heads",
            "ffn_hidden",
            "max_seq_len",
            "rope_theta",
            "norm_eps",
            "init_std",
        )
        require(
            self.head_dim is None or self.head_dim > 0,
            "model.head_dim",
            f"must be even and > 0, or null for d_model / n_heads (got {self.head_dim})",
        )
        require(
            self.head_dim is not None or self.d_model % self.n_heads == 0,
            "model.d_model",
            f"must be divisible by model.n_heads={self.n_heads} (got {self.d_model})",
        )
        require(
            self.head_size > 0 and self.head_size % 2 == 0,
            "model.head_dim" if self.head_dim is not None else "model.d_model",
            f"the head dim ({'model.head_dim' if self.head_dim is not None else 'd_model / n_heads'}) must be even and > 0 for "
            f"RoPE (got {self.head_size})",
        )
        require(
            self.n_heads % self.n_kv_heads == 0,
            "model.n_kv_heads",
            f"must divide model.n_heads={self.n_heads} (got {self.n_kv_heads})",
        )
        require(
            self.rope_scaling in ("none", "llama3", "yarn"),
            "model.rope_scaling",
            f"must be none, llama3 or yarn (got {self.rope_scaling!r})",
        )
        if self.rope_scaling != "none":
            require(self.rope_factor >= 1, "model.rope_factor", f"must be >= 1 (got {self.rope_factor})")
            require(
                self.rope_original_max_len is not None and self.rope_original_max_len > 0,
                "model.rope_original_max_len",
                f"must be set (> 0) with model.rope_scaling={self.rope_scaling}",
            )
        if self.rope_scaling == "llama3":
            require(
                0 < self.rope_low_freq_factor < self.rope_high_freq_factor,
                "model.rope_high_freq_factor",
                "must be greater than model.rope_low_freq_factor (> 0)",
            )
        require(self.n_experts >= 0, "model.n_experts", f"must be >= 0 (got {self.n_experts})")
        if self.n_experts:
            require(
                1 <= self.moe_top_k <= self.n_experts,
                "model.moe_top_k",
                f"must be between 1 and model.n_experts={self.n_experts} (got {self.moe_top_k})",
            )
            require(
                self.moe_router in ("softmax", "sigmoid"),
                "model.moe_router",
                f"must be softmax or sigmoid (got {self.moe_router!r})",
            )
            require(
                self.moe_capacity_factor is None or self.moe_capacity_factor > 0,
                "model.moe_capacity_factor",
                f"must be > 0, or null for dropless routing (got {self.moe_capacity_factor})",
            )
            require(self.moe_aux_loss_weight >= 0, "model.moe_aux_loss_weight", "must be >= 0")
            require(self.moe_shared_experts >= 0, "model.moe_shared_experts", "must be >= 0")
            require(
                0 <= self.moe_dense_layers < self.n_layers,
                "model.moe_dense_layers",
                f"must leave at least one MoE block of model.n_layers={self.n_layers}",
            )
            require(self.moe_ffn_hidden is None or self.moe_ffn_hidden > 0, "model.moe_ffn_hidden", "must be > 0")

    def is_moe_layer(self, i: int) -> bool:
        """Whether block ``i`` has a mixture of experts (every block after the dense ones, in an MoE model)."""
        return self.n_experts > 0 and i >= self.moe_dense_layers

    @property
    def head_size(self) -> int:
        """E: each head's width (``head_dim``, or d_model / n_heads)."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def attn_width(self) -> int:
        """H * E: the width of q and of the attention's output (d_model unless ``head_dim`` says otherwise)."""
        return self.n_heads * self.head_size

    @property
    def expert_width(self) -> int:
        """Each routed expert's hidden width."""
        return self.moe_ffn_hidden or self.ffn_hidden
