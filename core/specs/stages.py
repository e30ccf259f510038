"""Pipeline stages: how many blocks each pipeline rank holds.

The first stage also holds the embedding, the last the final norm, the head
and the loss. The split is, in order of precedence:

- **given**: ``Layout.stage_layers``, one count per stage (``--stage-layers
  7,8,...,7``; the 1f1b and gpipe schedules). The first and last stage may
  hold no block at all, a middle one at least one.
- **the stack's**: torchtitan splits every model by its own rule, even where
  the layers divide (torchtitan 0.3, ``_generate_llm_fqn_per_model_part`` in
  torchtitan/distributed/pipeline_parallel.py, called with
  ``pipeline_parallel_first_stage_less_layers`` and
  ``pipeline_parallel_last_stage_less_layers``, 1 each by default): the
  embedding and the head count as one block each, the ``n + 2`` weights are
  dealt out over the ``pp x v`` virtual stages as evenly as they go (the
  first ``(n + 2) mod (pp v)`` one more), and the first and last then hold
  one block fewer. Llama 3 8B over 4 stages: 8, 9, 8, 7. Under a looped
  schedule (interleaved) rank i holds virtual stages i, i + pp, ...; under
  ZB-V (``zbv``) virtual stages i and 2 pp - 1 - i
  (``generate_stage_to_rank_mapping(..., style="v")`` in torch's pipelining,
  as torchtitan's ``pipeline_module_split`` places them).
- **even**: the other stacks put ``n / (pp v)`` blocks in each chunk
  (Megatron-LM by default; the agent's pipeline, as torchtitan's manual
  split). Where the layers do not divide, the planner chooses torchtitan's
  rule for the 1f1b and gpipe schedules (Megatron-LM expresses it with the
  flags below where the ``n + 2`` weights divide, else with
  ``--decoder-first-pipeline-num-layers`` and
  ``--decoder-last-pipeline-num-layers`` where its middle stages are alike);
  Llama 3 405B, 126 layers over 16 stages: 7, 8 x 14, 7. Under the
  interleaved schedule it does so only where the ``n + 2`` weights divide
  over the ``pp x v`` chunks: Megatron-LM's
  ``--account-for-embedding-in-pipeline-split`` and
  ``--account-for-loss-in-pipeline-split``, which count the embedding and
  the loss as a layer each and split ``n + 2`` evenly over the virtual
  stages (megatron/core/transformer/transformer_layer.py,
  ``get_transformer_layer_offset``; its arguments refuse a remainder).
  Llama 3.1 405B over pp 8 x v 8, as Megatron-Bridge's recipe runs it: 1,
  2 x 62, 1 blocks a chunk.
"""

from __future__ import annotations

import functools

from headroom.core.divisors import divisors_near
from headroom.core.errors import ConfigError
from headroom.core.specs.layout import Layout, split_text
from headroom.core.specs.schedule_order import zbv_chunks
from headroom.core.specs.stack import get_stack

EMBEDDING_WEIGHT = 1
"""Blocks the embedding counts as when the layers are dealt out (torchtitan's
``pipeline_parallel_first_stage_less_layers`` default)."""
HEAD_WEIGHT = 1
"""Blocks the final norm and head count as (torchtitan's ``pipeline_parallel_last_stage_less_layers`` default)."""


def weighted_split(n_layers: int, stages: int, embedding: int = EMBEDDING_WEIGHT, head: int = HEAD_WEIGHT
                   ) -> tuple[int, ...]:
    """Blocks per (virtual) stage by torchtitan's rule: ``n_layers + embedding + head`` dealt out over
    ``stages``, the first ``remainder`` one more, the first stage ``embedding`` fewer and the last ``head``
    fewer. Refused where torchtitan refuses it (more stages than weights, a stage too small to hold the
    embedding's or the head's weight)."""
    if stages == 1:
        return (n_layers,)
    weights = n_layers + embedding + head
    each, extra = divmod(weights, stages)
    if each < max(embedding, head, 1):
        raise ConfigError(f"{n_layers} layers do not split over {stages} pipeline stages with the embedding and head "
                          f"counted as {embedding} and {head} block(s): torchtitan needs at least "
                          f"{max(embedding, head, 1)} weight(s) a stage; use fewer stages")
    counts = [each + (i < extra) for i in range(stages)]
    counts[0] -= embedding
    counts[-1] -= head
    return tuple(counts)


@functools.lru_cache(maxsize=4096)
def chunk_layers(layout: Layout, n_layers: int, stack: str = "reference") -> tuple[int, ...]:
    """Blocks in each pipeline chunk (virtual stage), first to last: pp x v of them, placed on the ranks by
    `rank_chunks` (see the module's doc)."""
    if layout.pp == 1:
        return (n_layers,)
    given = layout.stage_layers
    if given is not None:
        if sum(given) != n_layers:
            raise ConfigError(f"stage layers {','.join(map(str, given))} hold {sum(given)} blocks, not the model's "
                              f"{n_layers}; give {layout.pp} counts that add up to {n_layers}")
        if layout.schedule == "interleaved":  # each stage's blocks evenly over its chunks, as Megatron-LM splits them
            return tuple(given[c % layout.pp] // layout.virtual_stages for c in range(layout.chunks))
        return given
    chunks = layout.chunks
    if get_stack(stack).weighted_stages or (n_layers % chunks and layout.schedule != "interleaved"):
        return weighted_split(n_layers, chunks)
    if n_layers % chunks == 0:
        return (n_layers // chunks,) * chunks
    if accounts_for_ends(n_layers, chunks):  # Megatron-LM's split with the embedding and the loss counted
        return weighted_split(n_layers, chunks)
    weighted = divisors_near(n_layers + EMBEDDING_WEIGHT + HEAD_WEIGHT, chunks)
    raise ConfigError(f"its {n_layers} layers do not split over pp {layout.pp} x {layout.virtual_stages} virtual "
                      f"stages, evenly or with the embedding and the loss counted as a layer each "
                      f"({n_layers + EMBEDDING_WEIGHT + HEAD_WEIGHT}); use --pp x --virtual-stages among "
                      f"{divisors_near(n_layers, chunks)} (or {weighted}), or --stage-layers, a count a stage (divisible by "
                      f"{layout.virtual_stages} under the interleaved schedule)")


def accounts_for_ends(n_layers: int, chunks: int) -> bool:
    """The layers, with the embedding and the loss counted as a layer each, split evenly over ``chunks`` (and the
    layers alone do not): Megatron-LM's ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split`` split (`weighted_split` gives it)."""
    weights = n_layers + EMBEDDING_WEIGHT + HEAD_WEIGHT
    return chunks > 1 and n_layers % chunks != 0 and weights % chunks == 0 and weights // chunks > 1


def rank_chunks(layout: Layout, rank: int) -> tuple[int, ...]:
    """The chunks (virtual stages) pipeline rank ``rank`` holds, 0 the model's first: looped (rank, rank + pp,
    ...), or under zbv in a V (rank, 2 pp - 1 - rank); without a pipeline the one chunk of every layer."""
    if layout.pp == 1:
        return (0,)
    if layout.schedule == "zbv":
        return zbv_chunks(layout.pp, rank)
    return tuple(range(rank, layout.chunks, layout.pp))


@functools.lru_cache(maxsize=4096)
def stage_layers(layout: Layout, n_layers: int, stack: str = "reference") -> tuple[int, ...]:
    """Blocks each pipeline rank holds, all its chunks together, first stage first (see the module's doc)."""
    split = chunk_layers(layout, n_layers, stack)
    return tuple(sum(split[c] for c in rank_chunks(layout, rank)) for rank in range(layout.pp))


def split_text_for(layout: Layout, n_layers: int, stack: str = "reference") -> str:
    """"18/21x2/20 blocks (torchtitan's split: ...)": the stages' blocks and where the split comes from."""
    layers = stage_layers(layout, n_layers, stack)
    if layout.stage_layers is not None:
        why = "as given"
    elif get_stack(stack).weighted_stages:
        why = f"{stack}'s split: the embedding and the head count as a block each"
    elif n_layers % layout.chunks and layout.schedule == "interleaved":
        why = ("chosen: the layers do not divide, so the embedding and the loss count as a layer each (Megatron-LM's "
               "--account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split)")
    elif n_layers % layout.chunks:
        why = "chosen: the layers do not divide, so the embedding and the head count as a block each (torchtitan's rule)"
    else:
        why = "even"
    if layout.schedule == "zbv":
        split = chunk_layers(layout, n_layers, stack)
        held = ", ".join("+".join(str(split[c]) for c in rank_chunks(layout, rank)) for rank in range(layout.pp))
        why += f"; rank i holds chunks i and 2 pp - 1 - i: {held}"
    return f"{split_text(layers)} blocks ({why})"


__all__ = ["EMBEDDING_WEIGHT", "HEAD_WEIGHT", "accounts_for_ends", "chunk_layers", "rank_chunks", "split_text_for", "stage_layers",
           "weighted_split"]
