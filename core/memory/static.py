"""Static memory of a training step on one rank, and the published activation formula.

All figures are bytes (ints) on one data-parallel rank. Activations of the
model the agent trains come from the per-tensor ledger (core/memory/ledger.py); the
formula of Korthikanti et al. is kept here as the published reference the
ledger is compared with.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import NamedTuple

from headroom.core.errors import ConfigError
from headroom.core.memory.pipeline import RankKind, first_rank
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.float8 import mx_scale_bytes, scaling_state_bytes
from headroom.core.specs.layout import Layout
from headroom.core.specs.model import BlockTensor, ModelSpec
from headroom.core.specs.precision import get_precision, optimizer_state_bytes
from headroom.core.specs.stack import DEEPSPEED_BUCKET_ELEMENTS, get_stack


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
    the default: its PyTorch documentation says the view saves "the total gradients size"); or DeepSpeed's
    ZeRO-1 and 2 reduction buffers (headroom.core.specs.stack.Stack.deepspeed_zero), held through backward."""
    fp8_weights: int = 0
    """Transformer Engine's cached fp8 copies of the blocks' weights, row- and column-wise, and its delayed
    scaling state (headroom.core.specs.float8): made on a step's first micro-batch, kept on the modules."""

    @property
    def total(self) -> int:
        return (self.parameters + self.gradients + self.master_weights + self.optimizer_states + self.gradient_buckets
                + self.fp8_weights)


def static_bytes_per_parameter(precision: str, optimizer: str) -> int:
    """Unsharded param + grad + master + optimizer bytes per parameter (no weight copies)."""
    recipe = get_precision(precision)
    return recipe.param_bytes + recipe.grad_bytes + recipe.master_bytes + optimizer_state_bytes(optimizer)


def rank_blocks(spec: ModelSpec, rank: RankKind) -> dict[bool, int]:
    """The rank's blocks by kind: {False: dense blocks, True: mixture-of-experts blocks}. A mixture of
    experts is planned without a pipeline (headroom.core.specs.config.TrainConfig.check_model): its rank holds every block."""
    if not spec.is_moe:
        return {False: rank.layers}
    if rank.layers != spec.n_layers:
        raise ConfigError(f"{spec.name}: a pipeline stage of {rank.layers} of its {spec.n_layers} blocks is not "
                          "modelled for a mixture of experts")
    return {False: spec.n_layers - spec.moe_layers, True: spec.moe_layers}


@functools.lru_cache(maxsize=256)
def _layer_split(spec: ModelSpec, moe: bool = False) -> tuple[int, int]:
    """One block's parameters as (split by tensor parallelism, replicated on every tp rank), tensor by tensor as
    `ModelSpec.block_tensors` splits them: the matrices and column-parallel biases, against the norms and the
    row-parallel biases. ``moe``: a mixture-of-experts block."""
    split = replicated = 0
    for tensor in spec.block_tensors(moe):
        if tensor.split:
            split += math.prod(tensor.shape)
        else:
            replicated += math.prod(tensor.shape)
    return split, replicated


def _rank_block(spec: ModelSpec, layout: Layout, moe: bool) -> int:
    """Parameters of one block on one rank: its tensor-parallel part / tp, its replicated part, and of a
    mixture of experts' routed experts the 1/ep on this expert-parallel rank."""
    split, replicated = _layer_split(spec, moe)
    if moe:
        split -= _experts_elsewhere(spec, layout)
    return -(-split // layout.tp) + replicated


def _experts_elsewhere(spec: ModelSpec, layout: Layout) -> int:
    """Routed-expert parameters of one block that the other ep - 1 expert-parallel ranks hold."""
    routed = spec.routed_expert_parameters()
    return routed - routed // layout.ep


def rank_expert_parameters(spec: ModelSpec, layout: Layout, rank: RankKind | None = None) -> int:
    """The routed-expert parameters one rank holds (its 1/ep of each expert block's), which are sharded and
    reduced over the dp x cp / ep ranks that hold the same experts rather than over all dp x cp."""
    rank = rank or first_rank(layout, spec.n_layers)
    return rank_blocks(spec, rank).get(True, 0) * (spec.routed_expert_parameters() // layout.ep)


def rank_parameters(spec: ModelSpec, layout: Layout, rank: RankKind | None = None) -> int:
    """Parameters one rank holds before data-parallel sharding: its stage's blocks split by tp, the
    vocabulary-parallel embedding on the first stage, the final norm and head on the last.

    With tied embeddings and a pipeline, the last stage keeps its own copy of the embedding matrix
    for the head (Megatron-LM's word-embedding copy, its gradient all-reduced with the first stage's).
    """
    rank = rank or first_rank(layout, spec.n_layers)
    t = layout.tp
    total = sum(n * _rank_block(spec, layout, moe) for moe, n in rank_blocks(spec, rank).items())
    words = -(-spec.vocab_size * spec.hidden // t)
    if rank.first:
        total += words + (spec.embedding_parameters() - spec.vocab_size * spec.hidden)
    if rank.last:
        own_copy = spec.tied_embeddings and not rank.first
        total += spec.norm_parameters() + (words if not spec.tied_embeddings or own_copy else 0)
    return total


def rank_matmul_weights(spec: ModelSpec, layout: Layout, rank: RankKind) -> int:
    """Weights of the matmuls one rank runs (autocast copies these): its blocks' projections / tp (of the
    routed experts its 1/ep) and the head on the last stage."""
    head = spec.vocab_size * spec.hidden if rank.last else 0
    blocks = sum(n * (spec.layer_matmul_weights(moe) - (_experts_elsewhere(spec, layout) if moe else 0))
                 for moe, n in rank_blocks(spec, rank).items())
    return (blocks + head) // layout.tp


def fsdp_units(spec: ModelSpec, layout: Layout, rank: RankKind) -> tuple[tuple[int, int], ...]:
    """The units FSDP gathers on one rank, in forward order, as (parameters of a unit, units of that size in a
    row): the embedding (first stage), the blocks, the final norm and head (last stage), as torchtitan wraps a
    Llama. Runs, not units: a 10,000-block rank is three or four runs, whatever a plan asks of them."""
    return tuple((params, n) for params, n, _ in _fsdp_runs(spec, layout, rank))


def fsdp_sharding_units(spec: ModelSpec, layout: Layout, rank: RankKind) -> tuple[tuple[tuple[int, int], ...],
                                                                                tuple[tuple[int, int], ...]]:
    """`fsdp_units`' runs as FSDP gathers them over their two groups: (the units over dp x cp, each
    mixture-of-experts block without its routed experts; the experts' units over dp x cp / ep, a block's routed
    experts on this rank each, as torchtitan shards them apart). The second is empty without expert
    parallelism."""
    experts = _experts_on_rank(spec, layout)
    dense = tuple((params - (experts if moe else 0), n) for params, n, moe in _fsdp_runs(spec, layout, rank))
    return dense, tuple((experts, n) for _, n, moe in _fsdp_runs(spec, layout, rank) if moe and experts)


def _experts_on_rank(spec: ModelSpec, layout: Layout) -> int:
    """Routed-expert parameters of one block on one expert-parallel rank (0 without expert parallelism)."""
    return spec.routed_expert_parameters() // layout.ep if spec.is_moe and layout.ep > 1 else 0


def _fsdp_runs(spec: ModelSpec, layout: Layout, rank: RankKind) -> list[tuple[int, int, bool]]:
    """`fsdp_units`' runs, each with whether its units are mixture-of-experts blocks."""
    words = -(-spec.vocab_size * spec.hidden // layout.tp)
    runs = [(_rank_block(spec, layout, moe), n, moe) for moe, n in rank_blocks(spec, rank).items() if n]
    if rank.first:
        runs.insert(0, (words + spec.embedding_parameters() - spec.vocab_size * spec.hidden, 1, False))
    if rank.last:
        head = words if not spec.tied_embeddings or not rank.first else 0
        runs.append((spec.norm_parameters() + head, 1, False))
    return runs


def rank_tensors(spec: ModelSpec, layout: Layout, rank: RankKind, experts: bool = False) -> list[int]:
    """Elements of each parameter tensor one rank holds, in parameter order: of a tensor tensor parallelism splits
    (`ModelSpec.block_tensors`: a matrix, a column-parallel bias) its 1/tp, of a norm or a row-parallel bias the
    whole, as `rank_parameters` counts them. ``experts``: the routed experts' tensors alone (1/ep of each block's);
    else everything but them under expert parallelism."""
    return [tensor.elements for tensor in _rank_tensors(spec, layout, rank, experts)]


class RankTensor(NamedTuple):
    """One parameter tensor on a rank (`rank_tensor_kinds`)."""

    elements: int
    matrix: bool
    """Two dimensions or more: not a norm's or a bias's vector."""
    linear: bool
    """A linear layer's weight or bias (``nn.Linear``), not a norm's, an embedding's or a position table's."""


def rank_tensor_kinds(spec: ModelSpec, layout: Layout, rank: RankKind, experts: bool = False) -> list[RankTensor]:
    """`rank_tensors` with what each tensor is."""
    return list(_rank_tensors(spec, layout, rank, experts))


@functools.lru_cache(maxsize=256)
def _rank_tensors(spec: ModelSpec, layout: Layout, rank: RankKind, experts: bool) -> tuple[RankTensor, ...]:
    tp, apart = layout.tp, spec.is_moe and layout.ep > 1

    def on_rank(block: Iterable[BlockTensor]) -> list[RankTensor]:
        return [RankTensor(-(-math.prod(t.shape) // tp) if t.split else math.prod(t.shape), len(t.shape) > 1, t.linear)
                for t in block]

    tensors: list[RankTensor] = []
    for moe, n in rank_blocks(spec, rank).items():
        block = spec.block_tensors(moe)
        routed = _routed(spec, tuple(t.shape for t in block)) if moe and apart else set()
        if experts:
            kept = [tensor for i, tensor in enumerate(block) if i in routed]
            tensors += on_rank(kept[: len(kept) // layout.ep]) * n
        else:
            tensors += on_rank(tensor for i, tensor in enumerate(block) if i not in routed) * n
    if experts:
        return tuple(tensors)
    h, words = spec.hidden, spec.vocab_size * spec.hidden
    table = RankTensor(-(-words // tp), matrix=True, linear=False)  # the embedding, vocabulary-parallel
    first = [table, *([] if spec.rotary else [RankTensor(spec.max_seq_len * h, matrix=True, linear=False)])] \
        if rank.first else []
    norm = [RankTensor(h, matrix=False, linear=False)] * (2 if spec.block == "gpt" else 1)  # LayerNorm's or RMSNorm's
    head = [RankTensor(-(-words // tp), matrix=True, linear=True)] if not spec.tied_embeddings or not rank.first else []
    return (*first, *tensors, *((*norm, *head) if rank.last else ()))


def _routed(spec: ModelSpec, block: tuple[tuple[int, ...], ...]) -> set[int]:
    """Positions of a mixture-of-experts block's routed experts' tensors (each expert's gate, up and down)."""
    start = next(i for i, shape in enumerate(block) if shape == (spec.n_experts, spec.hidden)) + 1
    return set(range(start, start + 3 * spec.n_experts))


def zero_optimizer_share(tensors: Iterable[int], ranks: int) -> int:
    """The most parameters one rank updates under torch's ``ZeroRedundancyOptimizer``, whose partition keeps
    tensors whole: largest first, each to the rank holding the fewest so far, the lowest-numbered of those alike
    (``_partition_parameters``, torch/distributed/optim/zero_redundancy_optimizer.py). A tensor larger than the
    even share (a 128k-token embedding over 64 ranks) is one rank's alone."""
    return _zero_share(tuple(sorted(tensors, reverse=True)), ranks)


@functools.lru_cache(maxsize=256)
def _zero_share(largest_first: tuple[int, ...], ranks: int) -> int:
    held = [(0, rank) for rank in range(min(ranks, len(largest_first)) or 1)]
    for n in largest_first:
        size, rank = heapq.heappop(held)
        heapq.heappush(held, (size + n, rank))
    return max(size for size, _ in held)


def gathered_in_forward(runs: tuple[tuple[int, int], ...], reshard: bool | int) -> int:
    """The most parameters FSDP2 holds gathered at once in a forward, of `fsdp_units`' runs: at each unit, its
    flat all-gather buffer and its unsharded parameters copied out of it (both the unit's size, for a moment),
    and what each earlier unit keeps after its forward (``reshard``, FSDP2's ``reshard_after_forward``): nothing
    (True), all of it (False: kept to backward), or a 1/k shard (an int k). The head's unit, never resharded, is the last, so it keeps
    nothing before anything. Measured on two gloo ranks: twice the largest unit resharded, every unit and
    the last once more kept (tests/test_fsdp_schedule.py)."""
    best, before = 0, 0
    for size, n in runs:
        held = 0 if reshard is True else size if reshard is False else -(-size // reshard)
        best = max(best, before + (n - 1) * held + 2 * size)  # a run's last unit has the most before it
        before += n * held
    return best


@functools.lru_cache(maxsize=64)  # a plan asks once per candidate; the answer is the model's and the ranks'
def fsdp_first_shard_parameters(spec: ModelSpec, ranks: int) -> int:
    """Elements of the first rank's shards under FSDP2 over ``ranks`` ranks: sum of ceil(d0 / W) x rest.

    ``fully_shard`` splits each parameter of shape (d0, *rest) along dim 0 as ``torch.chunk`` does:
    ceil(d0 / W) rows to each rank until the rows run out, so the first rank holds a full chunk of
    every parameter (the last may hold fewer, or none) and is the most loaded. Every rank's storage
    is padded to that chunk, and the gradients of a unit are views of one flat buffer of the padded
    shards. A (509, 64) embedding over 2 ranks: 255 rows, 32 elements more than 509 x 64 / 2.
    """
    return sum(-(-d0 // ranks) * math.prod(rest) for d0, *rest in spec.parameter_shapes())


def static_memory(spec: ModelSpec, config: TrainConfig, rank: RankKind | None = None) -> StaticMemory:
    """Parameters, gradients, master copy, optimizer state, DDP buckets and Transformer Engine's fp8 weight caches
    of one rank.

    Under ZeRO-3 with tp 1 and pp 1 (FSDP alone) this is the first data-parallel rank, the most loaded:
    its padded shard of every parameter (``fsdp_first_shard_parameters``), and the gradients, master
    copy and optimizer state of that shard (Adam's moments take the local shard's shape). With tp or
    pp the plain division of ``static_memory_of`` is kept. Not counted: AdamW's fp32 ``step``, one
    4-byte scalar per parameter tensor, which torch keeps on the host unless the optimizer is fused
    or capturable (torch/optim/adam.py, ``_init_group``): where it lives depends on the optimizer's
    implementation, which the configuration does not name.

    With expert parallelism the rank's routed experts (its 1/ep of them) are sharded over the
    dp x cp / ep ranks that hold the same experts, the rest over dp x cp, each a plain division.
    """
    rank = rank or first_rank(config.layout, spec.n_layers)
    static = _static_memory(spec, config, rank)
    if not config.te_fp8:
        return static
    if config.fp8_params:  # the block weights held in fp8: a byte an element, not the recipe's parameter bytes
        # MXFP8's parameters are its two cached copies (fp8_weight_bytes): no 16-bit parameter is held at all.
        fp8_bytes = 0 if config.float8.block else 1
        held = (config.recipe.param_bytes - fp8_bytes) * te_rank_weights(spec, config, rank)
        static = replace(static, parameters=static.parameters - _shard(held, config.dp * config.layout.cp,
                                                                       config.zero >= 3))
    return replace(static, fp8_weights=fp8_weight_bytes(spec, config, rank))


def te_rank_weights(spec: ModelSpec, config: TrainConfig, rank: RankKind) -> int:
    """Weight elements of the Transformer Engine linears of the rank's blocks under the FP8 recipe (their
    tensor-parallel part)."""
    return sum(te_block_weights(spec, config.layout.tp)) * fp8_rank_blocks(config, rank)


def fp8_rank_blocks(config: TrainConfig, rank: RankKind) -> int:
    """The rank's blocks under the FP8 recipe: all but those `TrainConfig.first_last_bf16` keeps in bf16, whose
    weights are plain parameters with no fp8 copy and no scaling state."""
    return rank.layers - config.bf16_blocks(rank.layers, rank.first, rank.last)


def fp8_weight_bytes(spec: ModelSpec, config: TrainConfig, rank: RankKind) -> int:
    """Transformer Engine's fp8 weight caches on one rank (headroom.core.specs.float8): a row- and a column-wise
    byte for each weight element of the rank's blocks (its tensor-parallel part), or under ``fp8_param_gather``,
    where the fp8 weight is the parameter itself, the column-wise byte alone (MXFP8's parameter keeps both copies
    and their scales, the 16-bit one gathered into the gradient buffer it shares); and each linear's delayed
    scaling state (four Transformer Engine linears a block: q/k/v, the attention's output, fc1, fc2)."""
    if not config.te_fp8:
        return 0
    copies = 1 if config.fp8_params and not config.float8.block else 2
    scales = sum(mx_scale_bytes(out, width) for out, width in te_block_shapes(spec, config.layout.tp)) \
        * fp8_rank_blocks(config, rank) if config.float8.block else 0  # MXFP8: each copy's scales
    return copies * te_rank_weights(spec, config, rank) + scales + scaling_state_bytes(
        config.float8, 4 * fp8_rank_blocks(config, rank))


def te_block_weights(spec: ModelSpec, tp: int) -> tuple[int, int, int, int]:
    """One block's Transformer Engine linears on a tensor-parallel rank, by weight elements: q/k/v (one fused
    projection), the attention's output, fc1 (gate and up as one under a gated MLP) and fc2."""
    h, f = spec.hidden, spec.ffn_hidden
    whole = (h * (spec.q_dim + 2 * spec.kv_dim), spec.q_dim * h, (spec.mlp_projections - 1) * h * f, f * h)
    return tuple(-(-w // tp) for w in whole)


def te_block_shapes(spec: ModelSpec, tp: int) -> tuple[tuple[int, int], ...]:
    """`te_block_weights`' linears as (output rows, input width) on a tensor-parallel rank: the column-parallel
    ones split their outputs, the row-parallel ones (the attention's output, fc2) their inputs."""
    h, f = spec.hidden, spec.ffn_hidden
    return (((spec.q_dim + 2 * spec.kv_dim) // tp, h), (h, spec.q_dim // tp),
            ((spec.mlp_projections - 1) * f // tp, h), (h, f // tp))


def _static_memory(spec: ModelSpec, config: TrainConfig, rank: RankKind) -> StaticMemory:
    layout = config.layout
    if config.zero == 3 and layout.tp == 1 and layout.pp == 1 and layout.ep == 1:
        return _unsharded(fsdp_first_shard_parameters(spec, config.dp * layout.cp), config)
    experts = rank_expert_parameters(spec, layout, rank) if layout.ep > 1 else 0
    static = static_memory_of(rank_parameters(spec, layout, rank) - experts, config)
    if experts:
        static = _sum(static, static_memory_of(experts, config, ranks=layout.expert_data_parallel))
    stack = get_stack(config.stack)
    if config.dp * layout.cp > 1 and config.zero == 0 and not stack.replicates_through_fsdp:
        return replace(static, gradient_buckets=static.gradients)  # DDP's buckets copy the gradients
    if config.dp * layout.cp > 1 and config.zero == 1 and stack.zero_optimizer:
        # DDP, whose buckets copy the gradients, under ZeroRedundancyOptimizer, whose shards are whole tensors
        # (the routed experts' over the ranks that hold the same ones)
        share = zero_optimizer_share(rank_tensors(spec, layout, rank), config.dp * layout.cp)
        if experts:
            share += zero_optimizer_share(rank_tensors(spec, layout, rank, experts=True), layout.expert_data_parallel)
        held = _unsharded(share, config)
        return replace(static, master_weights=held.master_weights, optimizer_states=held.optimizer_states,
                       gradient_buckets=static.gradients)
    if config.dp * layout.cp > 1 and config.zero in (1, 2) and stack.deepspeed_zero:
        return replace(static, gradient_buckets=deepspeed_buffer_bytes(config))
    return static


def deepspeed_buffer_bytes(config: TrainConfig) -> int:
    """DeepSpeed's ZeRO-1 and 2 reduction buffers (deepspeed/runtime/zero/stage_1_and_2.py ``setup_buckets``,
    under ``contiguous_gradients``, its default): ``reduce_bucket_size`` elements of the parameters' dtype for each
    communication dtype (two under ``torch_autocast``: the linears' and the rest's), doubled under ``overlap_comm``,
    allocated whole at each backward's start whatever the model's size."""
    dtypes = 2 if config.recipe.autocast else 1
    buffers = 2 if config.data_parallel.overlap_grad_reduce else 1
    return dtypes * buffers * DEEPSPEED_BUCKET_ELEMENTS * config.recipe.param_bytes


def _unsharded(parameters: int, config: TrainConfig) -> StaticMemory:
    """Static bytes of ``parameters`` elements held whole: parameter, gradient, master and state bytes each."""
    recipe = get_precision(config.precision)
    return StaticMemory(
        parameters=parameters * recipe.param_bytes,
        gradients=parameters * recipe.grad_bytes,
        master_weights=parameters * recipe.master_bytes,
        optimizer_states=parameters * optimizer_state_bytes(config.optimizer),
    )


def _sum(a: StaticMemory, b: StaticMemory) -> StaticMemory:
    return StaticMemory(a.parameters + b.parameters, a.gradients + b.gradients, a.master_weights + b.master_weights,
                        a.optimizer_states + b.optimizer_states, a.gradient_buckets + b.gradient_buckets,
                        a.fp8_weights + b.fp8_weights)


def static_memory_of(parameters: int, config: TrainConfig, ranks: int | None = None) -> StaticMemory:
    """Static bytes per rank for a parameter count, sharded by ZeRO stage.

    Stage 1 shards optimizer state and the master copy over the data-parallel
    (times context-parallel) ranks, stage 2 also gradients, stage 3 (FSDP) also parameters (Rajbhandari
    et al., "ZeRO", 2020, Fig. 1): ceil(N x bytes / W), a flat split of the whole. FSDP2 splits each
    parameter instead; ``static_memory`` counts its padding from the model's shapes. ``ranks``: the
    ranks sharing these parameters, by default dp x cp.
    """
    # Context-parallel ranks hold the same weights as data-parallel ones: sharding spans both.
    whole, stage = _unsharded(parameters, config), config.zero
    ranks = config.dp * config.layout.cp if ranks is None else ranks
    return StaticMemory(
        parameters=_shard(whole.parameters, ranks, stage >= 3),
        gradients=_shard(whole.gradients, ranks, stage >= 2),
        master_weights=_shard(whole.master_weights, ranks, stage >= 1),
        optimizer_states=_shard(whole.optimizer_states, ranks, stage >= 1),
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
