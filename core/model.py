"""ModelSpec: the shape of a decoder-only transformer, and its exact parameter count.

Two block types cover the models Headroom plans for:

- ``gpt`` (GPT-2/GPT-3): LayerNorm (weight and bias), GELU MLP with one up and
  one down projection, learned absolute positions, biases on every linear
  layer, optional dropout.
- ``llama`` (LLaMA, Mistral, Qwen2): RMSNorm (weight only), SwiGLU MLP (gate,
  up, down), rotary positions (no parameters), no biases by default (Qwen2 has
  them on q, k and v), no dropout.

Both use pre-norm residual blocks, a final norm and a language-model head that
is either tied to the token embedding or a separate matrix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from core.divisors import divisors_near
from core.errors import ConfigError

BlockType = Literal["gpt", "llama"]
BiasMode = Literal["none", "qkv", "all"]
BLOCK_TYPES: tuple[str, ...] = ("gpt", "llama")
BIAS_MODES: tuple[str, ...] = ("none", "qkv", "all")
SIZE_LIMITS = {
    "n_layers": 10_000, "hidden": 2**20, "n_heads": 2**16, "n_kv_heads": 2**16, "ffn_hidden": 2**22,
    "vocab_size": 2**24, "max_seq_len": 2**24,
}
"""Each size's upper bound, far beyond any model trained (the largest published: ~200 layers, hidden
~2e4, vocabularies ~2.6e5, contexts ~1e7), so no real config is refused, while a size that would make
every formula's work or the result meaningless (10**12 layers) is refused before any work."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """A decoder-only transformer, sized."""

    name: str
    """Preset name or where the spec came from (a config.json path)."""
    block: BlockType
    """``gpt`` (LayerNorm, GELU, learned positions) or ``llama`` (RMSNorm, SwiGLU, RoPE)."""
    n_layers: int
    """Number of transformer blocks."""
    hidden: int
    """Model width h (residual stream size)."""
    n_heads: int
    """Query heads a; head size is hidden / n_heads."""
    n_kv_heads: int
    """Key/value heads (grouped-query attention); equal to n_heads for multi-head attention."""
    ffn_hidden: int
    """Inner width f of the MLP (per projection for SwiGLU)."""
    vocab_size: int
    """Vocabulary size V (rows of the embedding, columns of the logits)."""
    max_seq_len: int
    """Context length: the size of the learned position table for ``gpt``."""
    tied_embeddings: bool
    """The language-model head reuses the token embedding matrix."""
    bias: BiasMode = field(default="none")
    """Linear-layer biases: ``none``, ``qkv`` (Qwen2) or ``all`` (GPT-2/3)."""

    def __post_init__(self) -> None:
        if self.block not in BLOCK_TYPES:
            raise ConfigError(f"{self.name}: block {self.block!r} is not one of {', '.join(BLOCK_TYPES)}")
        if self.bias not in BIAS_MODES:
            raise ConfigError(f"{self.name}: bias {self.bias!r} is not one of {', '.join(BIAS_MODES)}")
        for size, limit in SIZE_LIMITS.items():
            value = getattr(self, size)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{self.name}: {size} must be a positive integer, got {value!r}")
            if value > limit:
                raise ConfigError(f"{self.name}: {size} {value:,} is beyond any trainable model (at most {limit:,})")
        if self.hidden % self.n_heads:
            raise ConfigError(
                f"{self.name}: hidden {self.hidden} is not divisible by n_heads {self.n_heads}; "
                f"choose n_heads among {divisors_near(self.hidden, self.n_heads)}"
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"{self.name}: n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}; "
                f"choose n_kv_heads among {divisors_near(self.n_heads, self.n_kv_heads)}"
            )

    # ---- derived sizes -------------------------------------------------------

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: n_kv_heads x head_dim."""
        return self.n_kv_heads * self.head_dim

    @property
    def mlp_projections(self) -> int:
        """Matrices of size hidden x ffn_hidden in one MLP: 2 (GELU) or 3 (SwiGLU)."""
        return 3 if self.block == "llama" else 2

    # ---- parameter counts (exact) -----------------------------------------------

    def attention_parameters(self) -> int:
        """q, k, v and output projections, with their biases."""
        h, kv = self.hidden, self.kv_dim
        weights = h * h + 2 * h * kv + h * h
        if self.bias == "all":
            return weights + (h + 2 * kv) + h
        if self.bias == "qkv":
            return weights + (h + 2 * kv)
        return weights

    def mlp_parameters(self) -> int:
        h, f = self.hidden, self.ffn_hidden
        weights = self.mlp_projections * h * f
        if self.bias == "all":
            return weights + (self.mlp_projections - 1) * f + h
        return weights

    def norm_parameters(self) -> int:
        """One norm: LayerNorm has weight and bias, RMSNorm only a weight."""
        return 2 * self.hidden if self.block == "gpt" else self.hidden

    def layer_parameters(self) -> int:
        """One transformer block: attention, MLP and its two norms."""
        return self.attention_parameters() + self.mlp_parameters() + 2 * self.norm_parameters()

    def embedding_parameters(self) -> int:
        """Token embedding, plus learned positions for ``gpt``."""
        positions = self.max_seq_len * self.hidden if self.block == "gpt" else 0
        return self.vocab_size * self.hidden + positions

    def head_parameters(self) -> int:
        """The language-model head's own matrix: 0 when tied to the embedding."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden

    def matmul_weight_parameters(self) -> int:
        """Parameters that enter a matmul as a weight: every projection and the head.

        These are what autocast copies to 16 bits during the forward pass. With
        tied embeddings the head's matmul uses the embedding matrix.
        """
        h, kv, f = self.hidden, self.kv_dim, self.ffn_hidden
        per_layer = 2 * h * h + 2 * h * kv + self.mlp_projections * h * f
        return self.n_layers * per_layer + self.vocab_size * h

    def parameter_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shape of every parameter tensor, in the order of the agent's ``Decoder.parameters()``.

        Token embedding (V, h); learned positions (max_seq_len, h) for ``gpt``; per block the
        attention norm, q (h, h), k and v (kv_dim, h), o (h, h), the MLP norm, gate (``llama``) and
        up (f, h), down (h, f), each linear's bias (out,) per ``bias``; the final norm; the head
        (V, h) unless tied. A norm is a weight (h,), plus a bias (h,) for ``gpt``'s LayerNorm.
        Linear weights are (out, in) as ``nn.Linear`` stores them: FSDP shards them along dim 0.
        """
        h, kv, f, v = self.hidden, self.kv_dim, self.ffn_hidden, self.vocab_size
        norm = ((h,), (h,)) if self.block == "gpt" else ((h,),)

        def linear(out: int, into: int, bias: bool) -> tuple[tuple[int, ...], ...]:
            return ((out, into), (out,)) if bias else ((out, into),)

        qkv_bias, other_bias = self.bias in ("qkv", "all"), self.bias == "all"
        attention = (*linear(h, h, qkv_bias), *linear(kv, h, qkv_bias), *linear(kv, h, qkv_bias),
                     *linear(h, h, other_bias))
        gate = linear(f, h, other_bias) if self.block == "llama" else ()
        mlp = (*gate, *linear(f, h, other_bias), *linear(h, f, other_bias))
        block = (*norm, *attention, *norm, *mlp)
        positions = ((self.max_seq_len, h),) if self.block == "gpt" else ()
        head = () if self.tied_embeddings else ((v, h),)
        return ((v, h), *positions, *block * self.n_layers, *norm, *head)

    @property
    def parameters(self) -> int:
        """Exact parameter count (tied embeddings counted once)."""
        return (
            self.embedding_parameters()
            + self.n_layers * self.layer_parameters()
            + self.norm_parameters()
            + self.head_parameters()
        )
