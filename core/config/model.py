"""The model section of a trial's config: the shape of the GPT. The presets in ``configs/model/`` fill it; the
rest of the schema (``core.config.schema``) holds it as ``TrainConfig.model``. Kept apart because it is the section
that grows with every architecture the core learns. No MindSpore here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.config.rules import positive, require


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's temperature term 0.1 mscale ln(factor) + 1 (Peng et al. 2023, section 3.4; DeepSeek's mscale form),
    1 without scaling (factor <= 1)."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


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
    """Key/value heads (grouped-query attention); must divide ``n_heads`` (equal it with MLA)."""
    attention: str = "gqa"
    """gqa: grouped-query attention (Llama, Qwen, Mistral); mla: multi-head latent attention (DeepSeek-V2/V3: q and
    kv through low-rank latents, the keys' RoPE part decoupled and shared by the heads; ``core.model.mla``)."""
    q_lora_rank: int | None = None
    """mla: q's latent width (DeepSeek-V3: 1536); null: q projected from the hidden state directly (V2-Lite)."""
    kv_lora_rank: int = 64
    """mla: the latent width of k and v, what an inference cache holds per token (DeepSeek-V3: 512)."""
    qk_nope_head_dim: int = 32
    """mla: each head's q and k width without RoPE (DeepSeek-V3: 128)."""
    qk_rope_head_dim: int = 16
    """mla: each head's q and k width that RoPE rotates, the keys' part shared by the heads (DeepSeek-V3: 64)."""
    v_head_dim: int = 32
    """mla: each head's value width (DeepSeek-V3: 128)."""
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
    rope_mscale_all_dim: float = 0.0
    """yarn with MLA (DeepSeek): the softmax scale times (0.1 rope_mscale_all_dim ln rope_factor + 1)^2; 0: not
    scaled."""
    rope_interleave: bool = False
    """The checkpoint's RoPE pairs are interleaved (x_2i, x_2i+1), DeepSeek's layout, where the core rotates halves:
    the rotary rows of q and of the shared key are permuted as Hugging Face weights are read and written
    (``core.ckpt.hf``); the model computes the same either way."""
    rope_truncate: bool = True
    """yarn: the interpolation ramp's ends rounded to whole dimensions (transformers' default)."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    attn_bias: bool = False
    """Biases on the q, k and v projections (Qwen2)."""
    qk_norm: bool = False
    """RMSNorm over each head's q and k before RoPE, one gain per head dimension shared by the heads (Qwen3)."""
    mtp_layers: int = 0
    """DeepSeek-V3's multi-token prediction depth D: modules after the main model predicting the tokens 2 .. D + 1
    places ahead (``core.model.mtp``); 0: none."""
    mtp_loss_weight: float = 0.3
    """lambda: the modules' mean loss is added to the main loss times this (DeepSeek-V3: 0.3, later 0.1)."""
    tie_embeddings: bool = True
    """The output head shares the token embedding's table."""
    freeze_embedding: bool = False
    """Keep the token embedding as it starts (loaded or initialised): no gradient, no optimizer state
    (MindSpore's ``requires_grad=False``). Needs an untied head, which would train the table."""
    freeze_layers: int = 0
    """Keep the first this many blocks as they start, like ``freeze_embedding`` (e.g. a pretrained tower)."""
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
    moe_score_bias: bool = False
    """A per-expert bias added to the scores to choose experts, not to the gates, and not trained by gradient
    (DeepSeek-V3's auxiliary-loss-free balancing; its checkpoints' ``e_score_correction_bias``)."""
    moe_bias_update_rate: float = 0.0
    """With moe_score_bias: after each step every expert's bias moves by this toward balance, up where its load
    over the step's global batch is below the mean, down where above (DeepSeek-V3's gamma, 0.001); 0: fixed."""
    moe_groups: int = 1
    """Group-limited routing (DeepSeek-V3): the experts in this many equal groups, a token's groups ranked by the
    sum of their two best scores (biased), its experts chosen among the best moe_topk_groups groups only."""
    moe_topk_groups: int = 1
    """Groups a token's experts may come from (with moe_groups > 1)."""
    moe_routed_scale: float = 1.0
    """The routed experts' gates multiplied by this (DeepSeek-V3's routed_scaling_factor, 2.5)."""
    moe_capacity_factor: float | None = None
    """Slots per expert as a multiple of its fair share of the tokens; null: dropless routing."""
    moe_aux_loss_weight: float = 0.01
    """Weight of the load-balance loss (Switch Transformer)."""
    moe_aux_per_sequence: bool = False
    """The balance loss per sequence, with each token's scores normalised to sum to 1, averaged over the sequences
    (DeepSeek-V3's complementary sequence-wise loss); false: over the micro-batch's tokens (Switch)."""
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
        require(self.mtp_layers >= 0, "model.mtp_layers", f"must be >= 0 (got {self.mtp_layers})")
        require(
            0 <= self.freeze_layers < self.n_layers,
            "model.freeze_layers",
            f"must be >= 0 and leave a block that trains, below model.n_layers={self.n_layers} (got "
            f"{self.freeze_layers})",
        )
        require(
            not (self.freeze_embedding and self.tie_embeddings),
            "model.freeze_embedding",
            "the tied head shares the embedding's table and its optimizer would update it; set "
            "model.tie_embeddings=false to freeze the embedding alone",
        )
        require(self.mtp_loss_weight >= 0, "model.mtp_loss_weight", f"must be >= 0 (got {self.mtp_loss_weight})")
        require(self.attention in ("gqa", "mla"), "model.attention", f"must be gqa or mla (got {self.attention!r})")
        if self.mla:
            positive("model", self, "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
            require(self.q_lora_rank is None or self.q_lora_rank > 0, "model.q_lora_rank", "must be > 0 or null")
            require(self.qk_rope_head_dim % 2 == 0, "model.qk_rope_head_dim", "must be even (RoPE rotates pairs)")
            require(
                self.n_kv_heads == self.n_heads,
                "model.n_kv_heads",
                f"must equal model.n_heads={self.n_heads} with model.attention=mla (every head has its keys)",
            )
            require(
                not (self.attn_bias or self.qk_norm),
                "model.attention",
                "mla has no q/k/v biases or QK-norm (set model.attn_bias=false model.qk_norm=false)",
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
            require(self.moe_routed_scale > 0, "model.moe_routed_scale", "must be > 0")
            require(
                self.moe_bias_update_rate >= 0 and (self.moe_score_bias or not self.moe_bias_update_rate),
                "model.moe_bias_update_rate",
                "must be >= 0, and 0 unless model.moe_score_bias=true (it moves that bias)",
            )
            require(
                self.moe_groups >= 1 and self.n_experts % self.moe_groups == 0,
                "model.moe_groups",
                f"must be >= 1 and divide model.n_experts={self.n_experts} (got {self.moe_groups})",
            )
            if self.moe_groups > 1:
                require(
                    1 <= self.moe_topk_groups <= self.moe_groups
                    and self.moe_topk_groups * (self.n_experts // self.moe_groups) >= self.moe_top_k
                    and self.n_experts // self.moe_groups >= 2,
                    "model.moe_topk_groups",
                    f"must be between 1 and model.moe_groups={self.moe_groups}, its groups holding at least "
                    f"model.moe_top_k={self.moe_top_k} experts (and each group at least 2, whose best two rank it)",
                )
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
    def mla(self) -> bool:
        return self.attention == "mla"

    @property
    def qk_head_size(self) -> int:
        """Each head's q and k width: E, or with MLA qk_nope_head_dim + qk_rope_head_dim."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.mla else self.head_size

    @property
    def v_head_size(self) -> int:
        """Each head's value width: E, or with MLA v_head_dim."""
        return self.v_head_dim if self.mla else self.head_size

    @property
    def rope_dim(self) -> int:
        """The width RoPE rotates in each head: E, or with MLA qk_rope_head_dim."""
        return self.qk_rope_head_dim if self.mla else self.head_size

    @property
    def attn_width(self) -> int:
        """H * E_v: the width of the attention's output, wo's input (d_model unless ``head_dim`` or MLA says)."""
        return self.n_heads * self.v_head_size

    @property
    def q_width(self) -> int:
        """H * E_qk: the width of q (the same as ``attn_width`` without MLA)."""
        return self.n_heads * self.qk_head_size

    @property
    def kv_width(self) -> int:
        """A token's keys and values together as attention reads them: 2 K E, or with MLA the heads' H (E_qk +
        E_v) (materialised from the latent in training)."""
        return (
            self.n_heads * (self.qk_head_size + self.v_head_size) if self.mla else 2 * self.n_kv_heads * self.head_size
        )

    @property
    def latent_width(self) -> int:
        """MLA's per-token tensors before the heads (the q and kv latents, each before and after its norm, and the
        shared RoPE key); 0 without MLA."""
        return 2 * (self.q_lora_rank or 0) + 2 * self.kv_lora_rank + self.qk_rope_head_dim if self.mla else 0

    @property
    def softmax_scale(self) -> float:
        """The scale on q k^T: 1 / sqrt(E_qk), times YaRN's mscale squared when ``rope_mscale_all_dim`` says."""
        scale = self.qk_head_size**-0.5
        if self.mla and self.rope_scaling == "yarn" and self.rope_mscale_all_dim:
            scale *= yarn_mscale(self.rope_factor, self.rope_mscale_all_dim) ** 2
        return scale

    @property
    def expert_width(self) -> int:
        """Each routed expert's hidden width."""
        return self.moe_ffn_hidden or self.ffn_hidden
