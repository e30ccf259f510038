"""Static memory of a training step on one rank, and the published activation formula.

All figures are bytes (ints) on one data-parallel rank. Activations of the
model the agent trains come from the per-tensor ledger (core/ledger.py); the
formula of Korthikanti et al. is kept here as the published reference the
ledger is compared with.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from core.config import TrainConfig
from core.layout import Layout
from core.model import ModelSpec
from core.pipeline import RankKind, rank_kinds
from core.precision import get_precision, optimizer_state_bytes


def _shard(total: int, ranks: int, sharded: bool) -> int:
    return -(-total // ranks) if sharded else total


@dataclass(frozen=True, slots=True)
class StaticMemory:
    """Bytes that live for the whole step, per rank."""

    parameters: int
    gradients: int
    master_weights: int
    optimizer_states: int
    gradient_buckets: int = 0
    """DDP's flat gradient buckets, a second copy of the gradients (``gradient_as_bucket_view=False``,
    the default: its PyTorch documentation says the view saves "the total gradients size")."""

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.master_weights + self.optimizer_states + self.gradient_buckets


def static_bytes_per_parameter(precision: str, optimizer: str) -> int:
    """Unsharded param + grad + master + optimizer bytes per parameter (no weight copies)."""
    recipe = get_precision(precision)
    return recipe.param_bytes + recipe.grad_bytes + recipe.master_bytes + optimizer_state_bytes(optimizer)


def _layer_split(spec: ModelSpec) -> tuple[int, int]:
    """One block's parameters as (split by tensor parallelism, replicated on every tp rank).

    Split: the q, k, v, output and MLP weights, and the biases of column-parallel layers (q, k, v,
    MLP up/gate). Replicated: the norms and the biases of row-parallel layers (output, MLP down),
    which are added after the all-reduce (Megatron-LM's ColumnParallelLinear/RowParallelLinear).
    """
    replicated = 2 * spec.norm_parameters() + (2 * spec.hidden if spec.bias == "all" else 0)
    return spec.layer_parameters() - replicated, replicated


def rank_parameters(spec: ModelSpec, layout: Layout, rank: RankKind | None = None) -> int:
    """Parameters one rank holds before data-parallel sharding: its stage's blocks split by tp, the
    vocabulary-parallel embedding on the first stage, the final norm and head on the last.

    With tied embeddings and a pipeline, the last stage keeps its own copy of the embedding matrix
    for the head (Megatron-LM's word-embedding copy, its gradient all-reduced with the first stage's).
    """
    rank = rank or rank_kinds(layout, spec.n_layers, 1)[0]
    t = layout.tp
    split, replicated = _layer_split(spec)
    total = rank.layers * (-(-split // t) + replicated)
    words = -(-spec.vocab_size * spec.hidden // t)
    if rank.first:
        total += words + (spec.embedding_parameters() - spec.vocab_size * spec.hidden)
    if rank.last:
        own_copy = spec.tied_embeddings and not rank.first
        total += spec.norm_parameters() + (words if not spec.tied_embeddings or own_copy else 0)
    return total


def rank_matmul_weights(spec: ModelSpec, layout: Layout, rank: RankKind) -> int:
    """Weights of the matmuls one rank runs (autocast copies these): its blocks' projections / tp and
    the head on the last stage."""
    h, kv, f = spec.hidden, spec.kv_dim, spec.ffn_hidden
    per_layer = 2 * h * h + 2 * h * kv + spec.mlp_projections * h * f
    return (rank.layers * per_layer + (spec.vocab_size * h if rank.last else 0)) // layout.tp


def fsdp_units(spec: ModelSpec, layout: Layout, rank: RankKind) -> tuple[int, ...]:
    """Parameters of each unit FSDP gathers on one rank, in forward order: the embedding (first
    stage), each block, the final norm and head (last stage), as torchtitan wraps a Llama."""
    split, replicated = _layer_split(spec)
    words = -(-spec.vocab_size * spec.hidden // layout.tp)
    units = [-(-split // layout.tp) + replicated] * rank.layers
    if rank.first:
        units.insert(0, words + spec.embedding_parameters() - spec.vocab_size * spec.hidden)
    if rank.last:
        head = words if not spec.tied_embeddings or not rank.first else 0
        units.append(spec.norm_parameters() + head)
    return tuple(units)


def static_memory(spec: ModelSpec, config: TrainConfig, rank: RankKind | None = None) -> StaticMemory:
    """Parameters, gradients, master copy, optimizer state and DDP buckets of one rank."""
    static = static_memory_of(rank_parameters(spec, config.layout, rank), config)
    if config.dp * config.layout.cp > 1 and config.zero == 0:
        return replace(static, gradient_buckets=static.gradients)
    return static


def static_memory_of(parameters: int, config: TrainConfig) -> StaticMemory:
    """Static bytes per rank for a parameter count, sharded by ZeRO stage.

    Stage 1 shards optimizer state and the master copy over the data-parallel
    (times context-parallel) ranks, stage 2 also gradients, stage 3 (FSDP) also parameters (Rajbhandari
    et al., "ZeRO", 2020, Fig. 1).
    """
    recipe = get_precision(config.precision)
    # Context-parallel ranks hold the same weights as data-parallel ones: sharding spans both.
    n, ranks, stage = parameters, config.dp * config.layout.cp, config.zero
    return StaticMemory(
        parameters=_shard(n * recipe.param_bytes, ranks, stage >= 3),
        gradients=_shard(n * recipe.grad_bytes, ranks, stage >= 2),
        master_weights=_shard(n * recipe.master_bytes, ranks, stage >= 1),
        optimizer_states=_shard(n * optimizer_state_bytes(config.optimizer), ranks, stage >= 1),
    )


@dataclass(frozen=True, slots=True)
class LayerActivations:
    """Bytes one block keeps for backward, split by how they scale."""

    linear: int
    """Terms linear in s (the 34 sbh of the formula)."""
    quadratic: int
    """Terms in s^2 (the 5 a s^2 b of the formula): scores, softmax, dropout."""

    @property
    def total(self) -> int:
        return self.linear + self.quadratic


def korthikanti_layer_activations(
    seq_len: int, micro_batch: int, hidden: int, heads: int, *,
    element_bytes: int = 2, dropout: bool = True, flash: bool = False,
    tp: int = 1, sp: bool = False, selective: bool = False,
) -> LayerActivations:
    """Published per-layer activations of one tensor-parallel rank: Korthikanti et al., "Reducing
    Activation Recomputation in Large Transformer Models" (2022), Sec. 4, tensor by tensor.

    16-bit elements (e) and 1-byte dropout masks (m); sbh = s*b*h, as2b = a*s^2*b:
      attention: QKV input e, Q and K 2e, V e, output-projection input e,
                 output dropout mask m                       -> 5e sbh + m sbh
                 softmax output e, attention-dropout mask m and output e  -> (2e + m) as2b
      MLP:       up input e, GELU input 4e, down input 4e, dropout mask m -> 9e sbh + m sbh
      norms:     two LayerNorm inputs                        -> 2e sbh
    With e = 2, m = 1: sbh(34 + 5as/h). Without dropout the masks and the
    dropout output go: 32 sbh + 2 as2b. Flash attention keeps no s x s tensor.

    Tensor parallelism over t ranks (Table 2) splits what lies between the column- and
    row-parallel linears, 24 sbh and every s x s term: sbh(10 + 24/t + 5as/(ht)); sequence
    parallelism splits the other 10 too: sbh/t (34 + 5as/h). Selective recomputation drops the
    s x s terms: sbh(10 + 24/t), or 34 sbh/t with sequence parallelism.
    """
    sbh = seq_len * micro_batch * hidden
    as2b = heads * seq_len * seq_len * micro_batch
    mask = 1 if dropout else 0
    # Split by tp: Q, K, V, the output-projection input, GELU input and down-projection input.
    split = sbh * 12 * element_bytes
    # The rest: both LayerNorm inputs, the QKV and MLP inputs, two dropout masks.
    rest = sbh * (4 * element_bytes + 2 * mask)
    linear = split // tp + (rest // tp if sp else rest)
    quadratic = 0 if flash or selective else as2b * ((2 * element_bytes + mask) if dropout else element_bytes) // tp
    return LayerActivations(linear=linear, quadratic=quadratic)
