"""How DDP and Megatron-LM cut a rank's gradients into buckets, each reduced by one collective call.

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
- **Megatron-LM** (megatron/training/training.py, the bucket size it resolves for its
  ``DistributedDataParallel``): ``max(40,000,000, 1,000,000 x dp x cp)`` parameters unless
  ``--ddp-bucket-size`` says otherwise, and a single bucket when ``overlap_grad_reduce`` is off; the
  distributed optimizer reduce-scatters and all-gathers bucket by bucket (megatron/core/distributed/
  param_and_grad_buffer.py, ``_compute_default_per_buffer_param_layout``).
  Megatron fuses q, k and v into one tensor and the gate with the up projection; the walk here takes the
  agent's separate tensors, which can move a boundary by a tensor.

A rank's tensors are its stage's (headroom.core.memory.pipeline.RankKind): the embedding on the first, its
blocks, the final norm and head on the last; a weight matrix split over the tp ranks, a vector whole; under
expert parallelism the routed experts apart (``experts``), as their own group reduces them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

from headroom.core.memory.pipeline import RankKind
from headroom.core.memory.static import rank_blocks
from headroom.core.specs.layout import Layout
from headroom.core.specs.model import ModelSpec

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
                     grad_bytes: int, experts: bool = False) -> tuple[int, str] | None:
    """(buckets, whose rule) one reduction of the rank's gradients runs in, one collective call each: DDP's
    without sharding, Megatron-LM's without sharding and under its distributed optimizer (zero 1); None where
    the stack's calls are counted otherwise (FSDP's a unit) or as one. ``grad_bytes``: a gradient's element
    size; ``experts``: the routed experts' group."""
    ready = list(reversed(rank_tensors(spec, layout, rank, experts)))
    if not ready:
        return None
    if stack in DDP_STACKS and layout.zero == 0:
        buckets = greedy_buckets((n * grad_bytes for n in ready), (DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES))
        return len(buckets), "DDP's buckets of 25 MiB, the first 1 MiB"
    if stack == "megatron" and layout.zero in (0, 1):
        if not overlap_grad_reduce:
            return 1, "one bucket (Megatron-LM's without overlap)"
        limit = megatron_bucket_parameters(layout.dp * layout.cp)
        return len(greedy_buckets(ready, (limit,))), f"Megatron-LM's buckets of {limit:,} parameters"
    return None


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


def rank_tensors(spec: ModelSpec, layout: Layout, rank: RankKind, experts: bool = False) -> list[int]:
    """Elements of each parameter tensor one rank holds, in parameter order: a matrix's 1/tp, a vector whole.
    ``experts``: the routed experts' tensors alone (1/ep of each block's); else everything but them under
    expert parallelism."""
    return list(_rank_tensors(spec, layout, rank, experts))


@functools.lru_cache(maxsize=256)
def _rank_tensors(spec: ModelSpec, layout: Layout, rank: RankKind, experts: bool) -> tuple[int, ...]:
    tp, apart = layout.tp, spec.is_moe and layout.ep > 1

    def on_rank(shapes: Iterable[tuple[int, ...]]) -> list[int]:
        return [-(-math.prod(shape) // tp) if len(shape) == 2 else math.prod(shape) for shape in shapes]

    tensors: list[int] = []
    for moe, n in rank_blocks(spec, rank).items():
        block = spec.block_parameter_shapes(moe)
        routed = _routed(spec, block) if moe and apart else set()
        if experts:
            kept = [shape for i, shape in enumerate(block) if i in routed]
            tensors += on_rank(kept[: len(kept) // layout.ep]) * n
        else:
            tensors += on_rank(shape for i, shape in enumerate(block) if i not in routed) * n
    if experts:
        return tuple(tensors)
    h, words = spec.hidden, spec.vocab_size * spec.hidden
    first = ([-(-words // tp)] + ([] if spec.rotary else [spec.max_seq_len * h])) if rank.first else []
    norm = [h, h] if spec.block == "gpt" else [h]  # LayerNorm's weight and bias, or RMSNorm's weight
    head = [-(-words // tp)] if not spec.tied_embeddings or not rank.first else []
    return (*first, *tensors, *((*norm, *head) if rank.last else ()))


def _routed(spec: ModelSpec, block: tuple[tuple[int, ...], ...]) -> set[int]:
    """Positions of a mixture-of-experts block's routed experts' tensors (each expert's gate, up and down)."""
    start = next(i for i, shape in enumerate(block) if shape == (spec.n_experts, spec.hidden)) + 1
    return set(range(start, start + 3 * spec.n_experts))
