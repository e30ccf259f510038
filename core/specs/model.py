"""ModelSpec: the shape of a decoder-only transformer, and its exact parameter count.

Two block types cover the models Headroom plans for:

- ``gpt`` (GPT-2/GPT-3): LayerNorm (weight and bias), GELU MLP with one up and
  one down projection, learned absolute positions, biases on every linear
  layer, optional dropout.
- ``llama`` (LLaMA, Mistral, Qwen2, Qwen3, Gemma): RMSNorm (weight only), a
  gated MLP (gate, up, down: SwiGLU; Gemma's GeGLU has the same weights and
  saves the same tensors), rotary positions (no parameters), no biases by
  default (Qwen2 has them on q, k and v), no dropout.

Both use pre-norm residual blocks, a final norm and a language-model head that
is either tied to the token embedding or a separate matrix. Options describe
other models: attention heads wider than ``hidden / n_heads`` (``head_size``:
Gemma, Qwen3's small models), an RMSNorm over each head of q and k
(``qk_norm``: Qwen3, Gemma 3), norms after attention and after the MLP as well
as before (``post_norms``: Gemma 2 and 3), rotary positions on a ``gpt`` block
and on part of each head (``positions``, ``rotary_fraction``: GPT-NeoX), and
attention and MLP side by side on the block's input (``parallel_residual``:
GPT-NeoX, GPT-J), a mixture of experts in place of a llama block's MLP
(``n_experts`` and the fields after it: Mixtral, Qwen-MoE, DeepSeek-V3) and
multi-head latent attention (``kv_lora_rank`` and after: DeepSeek-V2 and V3).
Gemma's norms and embeddings (``norm_offset``, ``scaled_embedding``), Gemma 2's
soft-capping (``attention_softcap``, ``logit_softcap``) and the sliding-window
layers of Mistral 7B v0.1 and Gemma 2 and 3 (``sliding_window_pattern``,
``sliding_window``, ``local_rope``) change no weight: they change what
transformers' modules keep (headroom.core.memory.ledger, the hf stack).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NamedTuple

from headroom.core.divisors import divisors_near
from headroom.core.errors import ConfigError

BlockType = Literal["gpt", "llama"]
BiasMode = Literal["none", "qkv", "all"]
PositionKind = Literal["learned", "rotary"]
ExpertScoring = Literal["softmax", "sigmoid"]
BLOCK_TYPES: tuple[str, ...] = ("gpt", "llama")
BIAS_MODES: tuple[str, ...] = ("none", "qkv", "all")
SIZE_LIMITS = {
    "n_layers": 10_000, "hidden": 2**20, "n_heads": 2**16, "n_kv_heads": 2**16, "ffn_hidden": 2**22,
    "vocab_size": 2**24, "max_seq_len": 2**24,
}
"""Each size's upper bound, far beyond any model trained (the largest published: ~200 layers, hidden
~2e4, vocabularies ~2.6e5, contexts ~1e7), so no real config is refused, while a size that would make
every formula's work or the result meaningless (10**12 layers) is refused before any work."""
MAX_HEAD_SIZE = 2**12
"""Widest attention head accepted (published models use 64-256)."""
MAX_EXPERTS = 2**14
MAX_CAPACITY_FACTOR = 64.0
"""Beyond this an expert's buffer holds more than every token of the batch for any k / E the tools plan."""
"""Most routed experts accepted (published models: up to 384)."""


class BlockTensor(NamedTuple):
    """One parameter tensor of a block (ModelSpec.block_tensors)."""

    shape: tuple[int, ...]
    split: bool
    """Tensor parallelism splits it (a matrix, a column-parallel bias); else every tp rank holds it whole."""
    linear: bool
    """It belongs to a linear layer (``nn.Linear``: a weight or its bias), not to a norm."""


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
    """Context length: the size of the learned position table for learned positions; for rotary positions
    only the window a longer sequence is said to extend (headroom.core.specs.config.TrainConfig.context_note), and for a
    HuggingFace config without ``max_position_embeddings`` the largest size accepted (no window;
    headroom.core.specs.hf_config.NO_CONTEXT_WINDOW)."""
    tied_embeddings: bool
    """The language-model head reuses the token embedding matrix."""
    bias: BiasMode = field(default="none")
    """Linear-layer biases: ``none``, ``qkv`` (Qwen2) or ``all`` (GPT-2/3)."""
    head_size: int | None = None
    """Width of one attention head where it is not hidden / n_heads (Gemma 7B: 16 heads of 256 with hidden
    3,072, so attention is 4,096 wide); None: hidden / n_heads."""
    qk_norm: bool = False
    """An RMSNorm over each head of q and of k, before rotary (Qwen3, Gemma 3): head_dim weights each."""
    post_norms: bool = False
    """The attention's and the MLP's outputs are normalised again before the residual add (Gemma 2 and 3):
    four norms a block."""
    norm_offset: bool = False
    """Each RMSNorm scales by ``1 + weight`` in fp32 and casts back after (Gemma's ``GemmaRMSNorm``): under
    transformers' modules (the hf stack) it keeps its normalised tensor in fp32. The agent's decoder, and so
    the reference stack, normalises as Llama does."""
    scaled_embedding: bool = False
    """The token embeddings are multiplied by sqrt(hidden), a scalar tensor in the compute dtype (Gemma):
    transformers' multiply keeps the scalar (2 bytes)."""
    attention_softcap: float = 0.0
    """Attention scores soft-capped, ``cap x tanh(scores / cap)``, before the softmax (Gemma 2: 50); 0: none.
    Under transformers' eager attention (the hf stack's ``--attention standard``) the tanh keeps its
    (b, heads, s, s) output; SDPA cannot cap, so transformers' flash attention is FlashAttention 2's."""
    logit_softcap: float = 0.0
    """The final logits soft-capped the same way (Gemma 2: 30); 0: none. Under transformers' modules the tanh
    keeps its (tokens, vocabulary) output in the compute dtype."""
    sliding_window_pattern: int = 0
    """Every this-many-th layer attends to the whole sequence and the others within a sliding window
    (transformers' ``layer_types``: Gemma 2 alternates, 2; Gemma 3, 6); 0: no full-attention period, so every
    layer is a sliding-window one when ``sliding_window`` is set (Mistral 7B v0.1) and none is otherwise. Under
    transformers' eager attention each kind of layer reads its own (b, 1, s, s) mask, which checkpointed layers
    keep as an input (``sliding``)."""
    sliding_window: int = 0
    """The sliding window's width in tokens (transformers' ``sliding_window``); 0: none, or not given. Under
    SDPA, transformers hands a sliding-window layer an explicit mask once the sequence is as long as the window
    (``sdpa_mask``). Eager attention computes every score whatever the width, and FLOPs count them all."""
    local_rope: bool = False
    """Sliding-window layers rotate by RoPE tables of their own (Gemma 3's ``rope_local_base_freq``): transformers
    makes a second cos/sin pair each forward."""
    positions: PositionKind | None = None
    """``learned`` (a table of max_seq_len x hidden) or ``rotary`` (no parameters); None: the block's own,
    learned for ``gpt``, rotary for ``llama``."""
    rotary_fraction: float = 1.0
    """The part of each head that rotary rotates (GPT-NeoX: 0.25); the rest passes through."""
    parallel_residual: bool = False
    """Attention and MLP both read the block's input: x + attn(norm(x)) + mlp(norm(x)) (GPT-NeoX)."""
    n_experts: int = 0
    """Routed experts of a mixture-of-experts MLP (Mixtral 8x7B: 8); 0: every MLP is dense."""
    experts_per_token: int = 0
    """Routed experts each token goes through (top-k; Mixtral: 2)."""
    expert_ffn_hidden: int = 0
    """Inner width of each routed expert's gated MLP; 0: ffn_hidden."""
    shared_expert_ffn_hidden: int = 0
    """Inner width of the gated MLP every token goes through beside the routed ones (Qwen2-MoE); 0: none."""
    shared_expert_gate: bool = False
    """A sigmoid gate, one hidden-wide row, scales the shared expert's output (Qwen2-MoE)."""
    dense_layers: int = 0
    """Leading blocks whose MLP is dense and ffn_hidden wide (DeepSeek-V3's first_k_dense_replace)."""
    normalize_expert_weights: bool = False
    """The top-k routing probabilities are divided by their sum (Mixtral; Qwen-MoE's ``norm_topk_prob``)."""
    expert_scoring: ExpertScoring = "softmax"
    """How the router turns logits into expert weights: ``softmax`` (Mixtral, Qwen) or ``sigmoid`` (DeepSeek-V3,
    which also picks its experts within the best groups)."""
    capacity_factor: float = 0.0
    """0: dropless, every expert takes every token routed to it (Mixtral, Qwen, DeepSeek-V3, torchtitan).
    C > 0: each expert takes at most ``expert_capacity`` rows, drops the rest and is padded to that many
    (Megatron-LM's ``--moe-expert-capacity-factor`` with ``--moe-pad-expert-input-to-capacity``)."""
    kv_lora_rank: int = 0
    """Multi-head latent attention (DeepSeek-V2 and V3): keys and values are projected up from a latent of this
    rank (normalised), beside one rotary key head shared by every head; 0: ordinary attention."""
    q_lora_rank: int = 0
    """Multi-head latent attention: queries come up from a latent of this rank (normalised); 0: projected
    directly from the residual stream."""
    rope_head_size: int = 0
    """Multi-head latent attention: the rotary part of each q and k head (qk_rope_head_dim); the rest of
    ``head_size`` is positionless."""
    v_head_size: int = 0
    """Multi-head latent attention: the width of each value head (v_head_dim), which differs from head_size."""
    caveats: tuple[str, ...] = ()
    """What the model's config asks that the accounting does not count, each a sentence every estimate and plan
    of it says (headroom.core.specs.config.TrainConfig.model_notes, which adds what a stack leaves out of soft-capping)."""

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
        if self.head_size is not None and (isinstance(self.head_size, bool) or not isinstance(self.head_size, int)
                                           or not 0 < self.head_size <= MAX_HEAD_SIZE):
            raise ConfigError(f"{self.name}: head_size must be a positive integer up to {MAX_HEAD_SIZE:,} "
                              f"(or None for hidden / n_heads), got {self.head_size!r}")
        if self.positions is not None and self.positions not in ("learned", "rotary"):
            raise ConfigError(f"{self.name}: positions {self.positions!r} is not learned or rotary")
        if isinstance(self.rotary_fraction, bool) or not isinstance(self.rotary_fraction, (int, float)) \
                or not 0 < self.rotary_fraction <= 1:
            raise ConfigError(f"{self.name}: rotary_fraction must be in (0, 1], got {self.rotary_fraction!r}")
        for cap in ("attention_softcap", "logit_softcap"):
            value = getattr(self, cap)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ConfigError(f"{self.name}: {cap} must be a positive number, or 0 for none; got {value!r}")
        pattern = self.sliding_window_pattern
        if isinstance(pattern, bool) or not isinstance(pattern, int) or not 0 <= pattern <= SIZE_LIMITS["n_layers"]:
            raise ConfigError(f"{self.name}: sliding_window_pattern must be 0 (no full-attention period) or a "
                              f"period from 1 to {SIZE_LIMITS['n_layers']:,}, got {pattern!r}")
        window = self.sliding_window
        if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= SIZE_LIMITS["max_seq_len"]:
            raise ConfigError(f"{self.name}: sliding_window must be a width in tokens from 1 to "
                              f"{SIZE_LIMITS['max_seq_len']:,}, or 0 for none; got {window!r}")
        if not isinstance(self.local_rope, bool):
            raise ConfigError(f"{self.name}: local_rope must be true or false, got {self.local_rope!r}")
        if isinstance(self.caveats, list):  # read back from JSON (a stored model_spec)
            object.__setattr__(self, "caveats", tuple(self.caveats))
        if not isinstance(self.caveats, tuple) or not all(isinstance(c, str) and c for c in self.caveats):
            raise ConfigError(f"{self.name}: caveats must be a tuple of sentences, got {self.caveats!r}")
        self._check_experts()
        self._check_latent_attention()
        if self.head_size is None and self.hidden % self.n_heads:
            raise ConfigError(
                f"{self.name}: hidden {self.hidden} is not divisible by n_heads {self.n_heads}; "
                f"choose n_heads among {divisors_near(self.hidden, self.n_heads)}"
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"{self.name}: n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}; "
                f"choose n_kv_heads among {divisors_near(self.n_heads, self.n_kv_heads)}"
            )
        if self.rotary and (self.rotary_dim < 2 or self.rotary_dim % 2):
            raise ConfigError(f"{self.name}: rotary over {self.rotary_fraction:g} of a {self.head_dim}-wide head "
                              f"is {self.rotary_dim} dimensions; rotary needs an even number, 2 or more")

    def _check_experts(self) -> None:
        sizes = {"n_experts": (self.n_experts, MAX_EXPERTS), "experts_per_token": (self.experts_per_token, MAX_EXPERTS),
                 "expert_ffn_hidden": (self.expert_ffn_hidden, SIZE_LIMITS["ffn_hidden"]),
                 "shared_expert_ffn_hidden": (self.shared_expert_ffn_hidden, SIZE_LIMITS["ffn_hidden"]),
                 "dense_layers": (self.dense_layers, SIZE_LIMITS["n_layers"])}
        for size, (value, limit) in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
                raise ConfigError(f"{self.name}: {size} must be an integer from 0 to {limit:,}, got {value!r}")
        if not self.is_moe:
            if self.experts_per_token or self.expert_ffn_hidden or self.shared_expert_ffn_hidden \
                    or self.shared_expert_gate or self.dense_layers or self.normalize_expert_weights \
                    or self.capacity_factor:
                raise ConfigError(f"{self.name}: expert sizes are given but n_experts is 0 (a dense model)")
            return
        if self.block != "llama":
            raise ConfigError(f"{self.name}: experts are gated MLPs of a llama block, not of a {self.block} block")
        if not 1 <= self.experts_per_token <= self.n_experts:
            raise ConfigError(f"{self.name}: experts_per_token {self.experts_per_token} must be 1 to n_experts "
                              f"{self.n_experts}")
        if self.dense_layers >= self.n_layers:
            raise ConfigError(f"{self.name}: dense_layers {self.dense_layers} leaves none of its {self.n_layers} "
                              "layers with experts")
        if self.shared_expert_gate and not self.shared_expert_ffn_hidden:
            raise ConfigError(f"{self.name}: a shared expert gate needs a shared expert (shared_expert_ffn_hidden)")
        c = self.capacity_factor
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c <= MAX_CAPACITY_FACTOR:
            raise ConfigError(f"{self.name}: capacity factor must be 0 (dropless) or a number up to "
                              f"{MAX_CAPACITY_FACTOR:g} (1.0 to 1.5 is usual), got {c!r}")

    def _check_latent_attention(self) -> None:
        sizes = {"kv_lora_rank": self.kv_lora_rank, "q_lora_rank": self.q_lora_rank,
                 "rope_head_size": self.rope_head_size, "v_head_size": self.v_head_size}
        for size, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SIZE_LIMITS["hidden"]:
                raise ConfigError(f"{self.name}: {size} must be an integer from 0 to {SIZE_LIMITS['hidden']:,}, "
                                  f"got {value!r}")
        if self.expert_scoring not in ("softmax", "sigmoid"):
            raise ConfigError(f"{self.name}: expert_scoring {self.expert_scoring!r} is not softmax or sigmoid")
        if not self.is_mla:
            if self.q_lora_rank or self.rope_head_size or self.v_head_size:
                raise ConfigError(f"{self.name}: q_lora_rank, rope_head_size and v_head_size describe latent "
                                  "attention, which needs kv_lora_rank")
            return
        if self.block != "llama" or self.bias != "none" or self.qk_norm or self.n_kv_heads != self.n_heads:
            raise ConfigError(f"{self.name}: latent attention is a llama block's, without biases or q/k norms, "
                              "with as many key/value heads as query heads")
        if self.head_size is None or not 0 < self.rope_head_size < self.head_size or self.rope_head_size % 2 \
                or not self.v_head_size:
            raise ConfigError(f"{self.name}: latent attention needs head_size (q and k), an even rope_head_size "
                              f"below it and v_head_size; got {self.head_size!r}, {self.rope_head_size}, "
                              f"{self.v_head_size}")

    # ---- derived sizes -------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON holds it (``caveats`` a list): what a stored training step keeps, and
        ``ModelSpec(**d)`` reads back."""
        return asdict(self) | {"caveats": list(self.caveats)}

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2 and V3): kv_lora_rank is set."""
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        """A mixture of experts: some blocks route each token through experts_per_token of n_experts MLPs."""
        return self.n_experts > 0

    @property
    def moe_layers(self) -> int:
        """Blocks whose MLP is a mixture of experts."""
        return self.n_layers - self.dense_layers if self.is_moe else 0

    @property
    def expert_ffn(self) -> int:
        """Inner width of one routed expert: expert_ffn_hidden, else ffn_hidden."""
        return self.expert_ffn_hidden or self.ffn_hidden

    def is_moe_layer(self, layer: int) -> bool:
        """Block ``layer`` (from 0) routes its tokens through experts: a mixture of experts past its dense layers."""
        return self.is_moe and layer >= self.dense_layers

    @property
    def head_dim(self) -> int:
        """Width of one attention head: ``head_size``, else hidden / n_heads."""
        return self.head_size or self.hidden // self.n_heads

    def sliding(self, layer: int) -> bool:
        """Does decoder layer ``layer`` (from 0) attend within a sliding window (``sliding_window_pattern``)?"""
        if self.sliding_window_pattern:
            return self.sliding_window_pattern > 1 and (layer + 1) % self.sliding_window_pattern != 0
        return self.sliding_window > 0

    def sdpa_mask(self, seq_len: int, layer: int) -> bool:
        """Does transformers hand SDPA an explicit mask in ``layer`` at ``seq_len`` tokens? A sliding-window layer's
        once the sequence is as long as its window (or the width is not given); a causal one's never: SDPA's
        is_causal does it (transformers' ``_ignore_causal_mask_sdpa``)."""
        return self.sliding(layer) and (not self.sliding_window or seq_len >= self.sliding_window)

    @property
    def rotary(self) -> bool:
        """Positions are rotary (applied to q and k), not a learned table."""
        return (self.positions or ("learned" if self.block == "gpt" else "rotary")) == "rotary"

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head that rotary rotates: head_dim x rotary_fraction (as transformers rounds)."""
        return int(self.head_dim * self.rotary_fraction)

    @property
    def q_dim(self) -> int:
        """Width of the query projection (and of the output projection's input): n_heads x head_dim."""
        return self.n_heads * self.head_dim

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
        """q, k, v and output projections with their biases, and the per-head q and k norms; for latent
        attention its projections and the norms of its latents (``latent_attention_shapes``)."""
        if self.is_mla:
            return sum(math.prod(shape) for shape in self.latent_attention_shapes())
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        weights = h * q + 2 * h * kv + q * h
        qk_norms = self.qk_norm_parameters()
        if self.bias == "all":
            return weights + (q + 2 * kv) + h + qk_norms
        if self.bias == "qkv":
            return weights + (q + 2 * kv) + qk_norms
        return weights + qk_norms

    def latent_attention_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Multi-head latent attention's parameters, as transformers' DeepseekV3Attention registers them:
        q_a (q_lora_rank, h) and its norm, q_b (a x head_size, q_lora_rank), or one q (a x head_size, h);
        kv_a (kv_lora_rank + rope_head_size, h) and its norm (kv_lora_rank,); kv_b (a x (head_size -
        rope_head_size + v_head_size), kv_lora_rank); o (h, a x v_head_size)."""
        h, a, qr, kvr = self.hidden, self.n_heads, self.q_lora_rank, self.kv_lora_rank
        q = ((qr, h), (qr,), (a * self.head_dim, qr)) if qr else ((a * self.head_dim, h),)
        nope = self.head_dim - self.rope_head_size
        return (*q, (kvr + self.rope_head_size, h), (kvr,), (a * (nope + self.v_head_size), kvr),
                (h, a * self.v_head_size))

    def mlp_parameters(self) -> int:
        h, f = self.hidden, self.ffn_hidden
        weights = self.mlp_projections * h * f
        if self.bias == "all":
            return weights + (self.mlp_projections - 1) * f + h
        return weights

    def qk_norm_parameters(self) -> int:
        """The q and k norms of one block: head_dim weights each with ``qk_norm``, else none."""
        return 2 * self.head_dim if self.qk_norm else 0

    def moe_parameters(self, active: bool = False) -> int:
        """One mixture-of-experts MLP: the router (hidden x n_experts), every routed expert (or, ``active``,
        the experts_per_token a token uses), the shared expert and its gate. No biases."""
        h = self.hidden
        routed = self.routed_expert_parameters(self.experts_per_token if active else self.n_experts)
        shared = 3 * h * self.shared_expert_ffn_hidden + (h if self.shared_expert_gate else 0)
        return h * self.n_experts + routed + shared

    def expert_capacity(self, tokens: int) -> int:
        """Rows one expert takes from ``tokens`` tokens at the capacity factor C: ceil(t k / E x C), Megatron-LM's
        ``get_capacity(num_tokens * topk, num_experts, capacity_factor)`` (megatron/core/transformer/moe/moe_utils.py).
        Mixtral's 4,096 tokens, k 2, 8 experts, C 1.25: 1,280."""
        return math.ceil(tokens * self.experts_per_token / self.n_experts * self.capacity_factor)

    def expert_rows(self, tokens: int) -> int:
        """Rows the routed experts run on together for ``tokens`` tokens: t x k dropless (however the router
        spreads them), else every expert's capacity, padded."""
        if not self.capacity_factor:
            return tokens * self.experts_per_token
        return self.n_experts * self.expert_capacity(tokens)

    def routed_expert_parameters(self, experts: int | None = None) -> int:
        """The gate, up and down projections of ``experts`` routed experts (default all) of one block:
        what expert parallelism splits between ranks."""
        return (self.n_experts if experts is None else experts) * 3 * self.hidden * self.expert_ffn

    def norm_parameters(self) -> int:
        """One norm: LayerNorm has weight and bias, RMSNorm only a weight."""
        return 2 * self.hidden if self.block == "gpt" else self.hidden

    def layer_parameters(self, moe: bool = False, active: bool = False) -> int:
        """One transformer block: attention, its MLP (``moe``: a mixture of experts, of which ``active``
        counts the experts one token uses) and its two norms (four with ``post_norms``)."""
        mlp = self.moe_parameters(active) if moe else self.mlp_parameters()
        return self.attention_parameters() + mlp + self.norms_per_block * self.norm_parameters()

    def blocks_parameters(self, active: bool = False) -> int:
        """Every block: dense ones and, for a mixture of experts, the expert blocks (``active``: the
        parameters one token uses)."""
        dense = self.n_layers - self.moe_layers
        return dense * self.layer_parameters() + self.moe_layers * self.layer_parameters(moe=True, active=active)

    @property
    def norms_per_block(self) -> int:
        """Norms over the residual stream's width in one block: before attention and MLP, and after with
        ``post_norms``."""
        return 4 if self.post_norms else 2

    def embedding_parameters(self) -> int:
        """Token embedding, plus the learned position table (``gpt``, unless rotary)."""
        positions = 0 if self.rotary else self.max_seq_len * self.hidden
        return self.vocab_size * self.hidden + positions

    def head_parameters(self) -> int:
        """The language-model head's own matrix: 0 when tied to the embedding."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden

    def matmul_weight_parameters(self) -> int:
        """Parameters that enter a matmul as a weight: every projection and the head.

        These are what autocast copies to 16 bits during the forward pass. With
        tied embeddings the head's matmul uses the embedding matrix.
        """
        dense = self.n_layers - self.moe_layers
        return (dense * self.layer_matmul_weights() + self.moe_layers * self.layer_matmul_weights(moe=True)
                + self.vocab_size * self.hidden)

    def layer_matmul_weights(self, moe: bool = False) -> int:
        """One block's projection weights: q, k, v, output and the MLP's; ``moe``: a mixture-of-experts block's,
        whose MLP weights are the router's, every expert's, the shared expert's and its gate's."""
        h, q, kv, f = self.hidden, self.q_dim, self.kv_dim, self.ffn_hidden
        mlp = self.moe_parameters() if moe else self.mlp_projections * h * f
        if self.is_mla:
            return sum(math.prod(shape) for shape in self.latent_attention_shapes() if len(shape) == 2) + mlp
        return 2 * h * q + 2 * h * kv + mlp

    def parameter_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shape of every parameter tensor, in the order of the agent's ``Decoder.parameters()``.

        Token embedding (V, h); learned positions (max_seq_len, h) for ``gpt``; per block the
        attention norm, q (q_dim, h), k and v (kv_dim, h), o (h, q_dim), each linear's bias (out,)
        per ``bias``, the q and k norms (head_dim,) with ``qk_norm``, the post-attention norm with
        ``post_norms``, the MLP norm, gate (``llama``) and up (f, h), down (h, f), the post-MLP norm
        with ``post_norms``; the final norm; the head (V, h) unless tied. A norm is a weight (h,), plus a bias (h,) for ``gpt``'s LayerNorm.
        A mixture-of-experts block's MLP: the router (n_experts, h), each expert's gate, up and down, the
        shared expert's, and the shared expert's gate (1, h).
        Linear weights are (out, in) as ``nn.Linear`` stores them: FSDP shards them along dim 0.
        """
        h, v = self.hidden, self.vocab_size
        norm = ((h,), (h,)) if self.block == "gpt" else ((h,),)
        blocks = (*self.block_parameter_shapes(moe=False) * (self.n_layers - self.moe_layers),
                  *self.block_parameter_shapes(moe=True) * self.moe_layers)
        positions = () if self.rotary else ((self.max_seq_len, h),)
        head = () if self.tied_embeddings else ((v, h),)
        return ((v, h), *positions, *blocks, *norm, *head)

    def block_parameter_shapes(self, moe: bool = False) -> tuple[tuple[int, ...], ...]:
        """One block's parameter tensors, in `parameter_shapes`' order (``moe``: a mixture-of-experts block's)."""
        return tuple(tensor.shape for tensor in self.block_tensors(moe))

    def block_tensors(self, moe: bool = False) -> tuple[BlockTensor, ...]:
        """One block's parameter tensors (`BlockTensor`), in `parameter_shapes`' order. Split by tensor
        parallelism: every matrix and the bias of a column-parallel linear (q, k, v, the MLP's gate and up). Whole
        on every tp rank: the norms (a q or k norm is over one head, which every rank has whole) and the bias of a
        row-parallel linear (the attention's output, the MLP's down), added after the all-reduce (Megatron-LM's
        ColumnParallelLinear and RowParallelLinear): headroom.core.memory.static's split of a block's count."""
        h, q, kv, f = self.hidden, self.q_dim, self.kv_dim, self.ffn_hidden

        def norms(*widths: int) -> tuple[BlockTensor, ...]:
            return tuple(BlockTensor((width,), split=False, linear=False) for width in widths)

        norm = norms(h, h) if self.block == "gpt" else norms(h)

        def column(out: int, into: int, bias: bool) -> tuple[BlockTensor, ...]:
            weight = BlockTensor((out, into), split=True, linear=True)
            return (weight, BlockTensor((out,), split=True, linear=True)) if bias else (weight,)

        def row(out: int, into: int, bias: bool) -> tuple[BlockTensor, ...]:
            weight = BlockTensor((out, into), split=True, linear=True)
            return (weight, BlockTensor((out,), split=False, linear=True)) if bias else (weight,)

        qkv_bias, other_bias = self.bias in ("qkv", "all"), self.bias == "all"
        qk_norms = norms(self.head_dim, self.head_dim) if self.qk_norm else ()
        attention = tuple(BlockTensor(shape, split=True, linear=len(shape) > 1)  # its latent norms are vectors
                          for shape in self.latent_attention_shapes()) if self.is_mla else (
            *column(q, h, qkv_bias), *column(kv, h, qkv_bias), *column(kv, h, qkv_bias), *row(h, q, other_bias),
            *qk_norms)
        gate = column(f, h, other_bias) if self.block == "llama" else ()
        mlp = (*gate, *column(f, h, other_bias), *row(h, f, other_bias))

        def gated(width: int) -> tuple[BlockTensor, ...]:
            return (*column(width, h, False), *column(width, h, False), *row(h, width, False))

        shared = (*gated(self.shared_expert_ffn_hidden),) if self.shared_expert_ffn_hidden else ()
        experts = (*column(self.n_experts, h, False), *gated(self.expert_ffn) * self.n_experts, *shared,
                   *(column(1, h, False) if self.shared_expert_gate else ()))
        post = norm if self.post_norms else ()
        return (*norm, *attention, *post, *norm, *(experts if moe else mlp), *post)

    @property
    def parameters(self) -> int:
        """Exact parameter count (tied embeddings counted once)."""
        return self.embedding_parameters() + self.blocks_parameters() + self.norm_parameters() + self.head_parameters()

    @property
    def active_parameters(self) -> int:
        """Parameters one token uses: all of a dense model's; a mixture of experts' without the experts the
        router did not choose (Mixtral 8x7B: 12.9B of 46.7B)."""
        return (self.embedding_parameters() + self.blocks_parameters(active=True) + self.norm_parameters()
                + self.head_parameters())
