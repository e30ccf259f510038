"""How DDP, Megatron-LM and DeepSpeed cut a rank's gradients into buckets, each reduced by one collective call.

Both walk the parameters backwards (the order backward makes their gradients), add each tensor to the open
bucket, and close it as soon as it holds at least its limit, so a tensor larger than the limit is a bucket of
its own:

- **torch's DDP** (``DistributedDataParallel``; the ``reference``, ``hf`` and ``hf-liger`` stacks): from its
  second step on, the reducer's rebuilt buckets, in the order gradients became ready: the first up to
  ``DDP_FIRST_BUCKET_BYTES`` (``dist._DEFAULT_FIRST_BUCKET_BYTES``), the rest ``DDP_BUCKET_BYTES``
  (``bucket_cap_mb``'s default, torch/nn/parallel/distributed.py), in bytes of the gradients' dtype. Its
  first step reduces every gradient in one bucket (``compute_bucket_size_limits``: ``sys.maxsize`` without
  ``find_unused_parameters``); a plan prices the steady state. Checked bucket for bucket on two gloo ranks
  (tests/test_distributed_memory.py).
- **Megatron-LM** (megatron/training/training.py, the bucket sizes it resolves for each model chunk's
  ``DistributedDataParallel``): ``max(40,000,000, 1,000,000 x dp x cp)`` parameters unless
  ``--ddp-bucket-size`` says otherwise, on the first pipeline stage's first chunk only; every other chunk, and
  every chunk without ``overlap_grad_reduce``, one bucket a buffer (a chunk's parameters by dtype, its fp8 weights
  apart). Its distributed optimizer reduce-scatters and all-gathers bucket by bucket (megatron/core/distributed/
  param_and_grad_buffer.py, ``_compute_default_per_buffer_param_layout``). Its tensors are Transformer Engine's
  (`megatron_tensors`).

- **DeepSpeed's ZeRO-1 and 2** (the ``hf`` and ``hf-liger`` stacks' sharding; deepspeed/runtime/zero/
  stage_1_and_2.py, ``reduce_independent_p_g_buckets_and_remove_grads``): a bucket of at most
  ``reduce_bucket_size`` elements (headroom.core.specs.stack.DEEPSPEED_BUCKET_ELEMENTS unless the config says otherwise), reduced
  *before* a tensor that would overfill it joins (`deepspeed_buckets`), so only a tensor larger than the limit
  makes a bucket larger than it. In the order gradients become ready, backwards, where its hooks reduce them
  (ZeRO-2, and ZeRO-1 under ``overlap_comm``); at the step's last backward otherwise, in the optimizer's order:
  its parameter groups one after the other (the HF Trainer's two: the matrices, then the norms and biases).
  Each communication dtype has buckets of its own: under ``torch_autocast`` the linears' gradients go in the
  autocast dtype, the rest's in theirs (deepspeed/runtime/torch_autocast.py). headroom.core.timing.comm prices
  them; checked bucket for bucket on two gloo ranks (tests/test_deepspeed_zero.py).

A rank's tensors are its stage's (headroom.core.memory.pipeline.RankKind): the embedding on the first, its
blocks, the final norm and head on the last; a weight matrix split over the tp ranks, a vector whole; under
expert parallelism the routed experts apart (``experts``), as their own group reduces them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from headroom.core.memory.pipeline import RankKind
from headroom.core.memory.static import RankTensor, rank_tensors, te_block_weights
from headroom.core.specs.layout import Layout
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.stack import get_stack

DDP_FIRST_BUCKET_BYTES = 2**20
"""torch's ``dist._DEFAULT_FIRST_BUCKET_BYTES``: the first bucket DDP's reducer fills, 1 MiB."""
DDP_BUCKET_BYTES = 25 * 2**20
"""DDP's ``bucket_cap_mb`` default, 25 MiB."""
DDP_STACKS = ("reference", "hf", "hf-liger")
"""The stacks whose data parallelism without sharding is torch's DDP."""


def megatron_bucket_parameters(data_parallel_ranks: int) -> int:
    """Megatron-LM's default bucket over ``data_parallel_ranks`` = dp x cp: ``max(40000000, 1000000 *
    dp_cp_size)`` parameters."""
    return max(40_000_000, 1_000_000 * data_parallel_ranks)


def gradient_buckets(spec: ModelSpec, layout: Layout, rank: RankKind, stack: str, overlap_grad_reduce: bool,
                     grad_bytes: int, experts: bool = False, fp8_params: bool = False) -> tuple[int, str] | None:
    """(buckets, whose rule) one reduction of the rank's gradients runs in, one collective call each: DDP's
    without sharding and under torch's ZeroRedundancyOptimizer (the reference stack's zero 1), Megatron-LM's
    without sharding and under its distributed optimizer (zero 1); None where the stack's calls are counted
    otherwise (FSDP's a unit) or as one. ``grad_bytes``: a gradient's element size; ``experts``: the routed
    experts' group; ``fp8_params``: Megatron-LM's fp8 weights, a buffer apart from the 16-bit parameters (not
    MXFP8's, whose parameters share the 16-bit buffer)."""
    if (stack in DDP_STACKS and layout.zero == 0) or (layout.zero == 1 and get_stack(stack).zero_optimizer):
        ready = list(reversed(rank_tensors(spec, layout, rank, experts)))
        if not ready:
            return None
        buckets = greedy_buckets((n * grad_bytes for n in ready), (DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES))
        return len(buckets), "DDP's buckets of 25 MiB, the first 1 MiB"
    if stack == "megatron" and layout.zero in (0, 1):
        return _megatron_buckets(spec, layout, rank, overlap_grad_reduce, experts, fp8_params)
    return None


def deepspeed_order(tensors: list[RankTensor], hooked: bool) -> list[RankTensor]:
    """The order DeepSpeed's ZeRO-1 and 2 reduce a rank's gradients in: backwards, as backward makes them, where
    hooks reduce them (``hooked``); otherwise the optimizer's parameter groups in turn, the HF Trainer's two (the
    matrices, weight-decayed, then the norms and biases), each in parameter order."""
    if hooked:
        return list(reversed(tensors))
    return [t for t in tensors if t.matrix] + [t for t in tensors if not t.matrix]


def deepspeed_buckets(sizes: Iterable[int], limit: int) -> list[int]:
    """DeepSpeed's buckets of tensors of ``sizes`` elements (in the order they are added): the open bucket is
    reduced before a tensor that would take it past ``limit`` joins, so a bucket holds at most ``limit`` unless a
    single tensor does; the last, partly filled, too."""
    buckets, open_bucket = [], 0
    for size in sizes:
        if open_bucket and open_bucket + size > limit:
            buckets.append(open_bucket)
            open_bucket = 0
        open_bucket += size
    if open_bucket:
        buckets.append(open_bucket)
    return buckets


def _megatron_buckets(spec: ModelSpec, layout: Layout, rank: RankKind, overlap_grad_reduce: bool, experts: bool,
                      fp8_params: bool) -> tuple[int, str]:
    """Megatron-LM's buckets on ``rank``: one DDP a model chunk, each a buffer of its parameters by dtype (the
    routed experts' apart), bucketed by size on the first pipeline stage's first chunk only; every other chunk's
    buffer one bucket ("Bucketing is disabled for non-first chunks ... or for non-zero pipeline-parallel ranks",
    megatron/training/training.py), and every chunk's without ``overlap_grad_reduce``."""
    chunks = len(rank.chunk_layers)
    buffers = 2 if fp8_params and not experts else 1  # the fp8 weights, and the 16-bit rest
    if not overlap_grad_reduce:
        return chunks * buffers, "one bucket a buffer and model chunk: Megatron-LM without overlap"
    if rank.stage > 0:
        return chunks * buffers, "one bucket a buffer and model chunk: Megatron-LM buckets the first stage only"
    limit = megatron_bucket_parameters(layout.dp * layout.cp)
    first_chunk = replace(rank, layers=rank.chunk_layers[0], last=rank.last and chunks == 1, chunks=())
    if experts:
        parts = [rank_tensors(spec, layout, first_chunk, experts=True)]
    else:
        weights, rest = megatron_tensors(spec, layout, first_chunk)
        parts = [weights, rest] if fp8_params else [weights + rest]
    first = sum(len(greedy_buckets(reversed(part), (limit,))) for part in parts if part)
    rule = f"Megatron-LM's buckets of {limit:,} parameters"
    return first + (chunks - 1) * buffers, rule if chunks == 1 else f"{rule} on its first chunk, one a buffer on each other"


def megatron_tensors(spec: ModelSpec, layout: Layout, rank: RankKind) -> tuple[list[int], list[int]]:
    """Elements of each parameter tensor a Megatron-LM rank holds, in its order, as (the Transformer Engine linears'
    weights, the rest: norms, biases, the embedding, the output layer): a block's q, k and v one tensor and
    its gate and up another, each norm folded into the linear after it (``linear_qkv.layer_norm_weight``,
    ``linear_fc1.layer_norm_weight``: headroom.core.memory.static.te_block_weights). A mixture of experts or a
    latent attention keeps the separate tensors of `rank_tensors`."""
    if spec.is_moe or spec.is_mla:
        everything = rank_tensors(spec, layout, rank)
        return [], everything
    tp, h = layout.tp, spec.hidden
    qkv, proj, fc1, fc2 = te_block_weights(spec, tp)
    norm = [h, h] if spec.block == "gpt" else [h]
    biased, all_biases = spec.bias in ("qkv", "all"), spec.bias == "all"
    weights, rest = [], []
    for _ in range(rank.layers):
        rest += norm + ([-(-(spec.q_dim + 2 * spec.kv_dim) // tp)] if biased else [])
        weights += [qkv, proj]
        rest += ([h] if all_biases else []) + norm + ([-(-(spec.mlp_projections - 1) * spec.ffn_hidden // tp)]
                                                        if all_biases else [])
        weights += [fc1, fc2]
        rest += [h] if all_biases else []
    words = -(-spec.vocab_size * h // tp)
    if rank.first:
        rest = [words] + ([] if spec.rotary else [spec.max_seq_len * h]) + rest
    if rank.last:
        rest += norm + ([words] if not spec.tied_embeddings or not rank.first else [])
    return weights, rest


def greedy_buckets(sizes: Iterable[int], limits: tuple[int, ...]) -> list[int]:
    """The buckets of tensors of ``sizes`` (in the order they are added): each closed as soon as it holds at least
    its limit, the first ``limits[0]``, the next ``limits[1]`` and so on, the last limit for the rest; a partly
    filled last bucket too."""
    buckets, open_bucket, which = [], 0, 0
    for size in sizes:
        open_bucket += size
        if open_bucket >= limits[min(which, len(limits) - 1)]:
            buckets.append(open_bucket)
            open_bucket, which = 0, which + 1
    if open_bucket:
        buckets.append(open_bucket)
    return buckets
