"""Pipeline stages: which layers a rank holds, how many micro-batches it keeps in flight, the bubble.

A pipeline of ``pp`` stages runs ``m`` micro-batches per optimizer step.
Each stage holds its share of the blocks (headroom.core.specs.stages: ``n_layers
/ pp`` each by default; under ``interleaved``, in ``v`` chunks); the first
stage also holds the embedding, the last the final norm, the head and the
loss.

Activations in flight on stage i (0-based), in micro-batches of the stage's
layers, at the schedule's steady state:

- ``gpipe``: all m forwards run before any backward: m.
- ``1f1b`` (Narayanan et al., "Efficient Large-Scale Language Model Training
  on GPU Clusters Using Megatron-LM", 2021, Sec. 2.2.1): stage i warms up
  with pp - i - 1 forwards, then holds pp - i: min(pp - i, m). The first
  stage holds pp micro-batches of n_layers / pp layers: a whole model's.
- ``interleaved``: Megatron-LM's schedule warms up with
  2 (pp - i - 1) + (v - 1) pp chunks, so holds one more: c chunks of
  n_layers / (pp v) layers, i.e. c / v micro-batches of the stage's layers.
  On the first stage that is n_layers (1 + (pp - 1) / (pp v)) layers'
  worth, Korthikanti et al. 2022, Sec. 4.2.3.

- ``zbv`` (zero-bubble ZB-V, headroom.core.specs.schedule_order): rank i
  holds chunks i and 2 pp - 1 - i, the first rank the embedding and the
  head; a chunk's activations live from its forward to its weight gradient.
  Walking the schedule's table gives each chunk's micro-batches alive at
  every forward; the peak of their sum weighted by each chunk's bytes
  (`v_in_flight`) is about pp micro-batches of the rank's blocks on every
  rank (Qi et al. 2024, Sec. 6: pM_B). Here the weights are the chunks'
  blocks; the estimate (headroom.core.memory.estimate) weighs them by the
  bytes each chunk's ledger keeps, the first rank's head and loss included.

Bubble (Narayanan et al. 2021, Sec. 2.2): idle time is (pp - 1) / (v m) of
the ideal time of the m micro-batches (v = 1 for 1f1b and gpipe) when the stages
are alike; `pipeline_seconds` times stages that are not; the zero-bubble
schedule is timed by replaying its table (headroom.core.timing.schedule_replay).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from fractions import Fraction

from headroom.core.errors import ConfigError
from headroom.core.specs.layout import Layout
from headroom.core.specs.schedule_order import zbv_alive
from headroom.core.specs.stages import chunk_layers, rank_chunks


@dataclass(frozen=True, slots=True)
class RankKind:
    """One kind of rank: the ranks of one pipeline stage are alike (tp, cp and dp ranks are symmetric)."""

    name: str
    """``only`` (no pipeline), ``first stage``, ``middle stage`` or ``last stage``; ``middle stage i`` where
    the middle stages hold different numbers of blocks."""
    stage: int
    layers: int
    """Blocks this rank holds (all its chunks)."""
    first: bool
    """Holds the embedding."""
    last: bool
    """Holds the final norm, the head and the loss."""
    in_flight: Fraction
    """Micro-batches of this rank's layers whose activations are alive at once."""
    logits_in_flight: Fraction | None = None
    """Micro-batches of the loss's probabilities alive then, where not ``in_flight``: under zbv the first rank
    holds the head in its second chunk, whose micro-batches live one at a time."""
    copies_in_flight: Fraction | None = None
    """Micro-batches of autocast's weight copies alive then, where not ``in_flight`` (zbv: each chunk keeps its
    own weights' copies for its micro-batches in flight)."""
    chunks: tuple[int, ...] = ()
    """Blocks of each chunk the rank holds, in the order it runs them, where it holds more than one (interleaved,
    zbv); empty: one chunk of ``layers``."""

    @property
    def chunk_layers(self) -> tuple[int, ...]:
        """Blocks of each chunk the rank holds: ``chunks``, else one chunk of ``layers``."""
        return self.chunks or (self.layers,)

    @property
    def logits_count(self) -> Fraction:
        """Micro-batches of the loss's probabilities alive at the rank's peak."""
        return self.in_flight if self.logits_in_flight is None else self.logits_in_flight

    @property
    def copies_count(self) -> Fraction:
        """Micro-batches of autocast's weight copies alive at the rank's peak."""
        return self.in_flight if self.copies_in_flight is None else self.copies_in_flight

    @property
    def one_micro_batch(self) -> RankKind:
        """This kind with one micro-batch of everything in flight: what one micro-batch's ledger keys on."""
        return replace(self, in_flight=Fraction(1), logits_in_flight=None, copies_in_flight=None)


@functools.lru_cache(maxsize=65536)
def v_peak(pp: int, rank: int, micro_batches: int, chunk_weights: tuple[int, int]) -> tuple[int, int]:
    """The micro-batches of each of a zbv rank's two chunks (the one it runs down first, then its mirror) alive
    when their sum weighted by ``chunk_weights`` peaks over the schedule's table (the first such moment)."""
    down, up = chunk_weights
    return max(zbv_alive(pp, micro_batches, rank), key=lambda n: n[0] * down + n[1] * up)


def v_in_flight(pp: int, rank: int, micro_batches: int, chunk_weights: tuple[int, int],
                alive: tuple[int, int] | None = None) -> Fraction:
    """Micro-batches of a zbv rank's work in flight at its peak (``alive``, by default `v_peak`), weighted by
    ``chunk_weights``, over the weights' sum. Equal weights and enough micro-batches: pp."""
    down, up = chunk_weights
    if not down + up:
        return Fraction(1)
    a, b = alive or v_peak(pp, rank, micro_batches, chunk_weights)
    return Fraction(a * down + b * up, down + up)


def in_flight(layout: Layout, stage: int, micro_batches: int, chunk_weights: tuple[int, ...] = ()) -> Fraction:
    """Micro-batches of activations stage ``stage`` keeps at once under the layout's schedule; under zbv
    weighted by ``chunk_weights``, the rank's two chunks' (`v_in_flight`)."""
    p, v, m = layout.pp, layout.virtual_stages, micro_batches
    if p == 1:
        return Fraction(1)
    if layout.schedule == "zbv":
        return v_in_flight(p, stage, m, chunk_weights)
    if layout.schedule == "gpipe":
        return Fraction(m)
    if layout.schedule == "1f1b":
        return Fraction(min(p - stage, m))
    chunks = min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
    return Fraction(chunks, v)


def check_micro_batches(layout: Layout, micro_batches: int) -> None:
    """Megatron's interleaved schedule runs micro-batches in groups of pp."""
    if layout.schedule == "interleaved" and micro_batches % layout.pp:
        raise ConfigError(
            f"the interleaved schedule needs the micro-batches per step ({micro_batches}) to be a multiple of "
            f"pp {layout.pp}; use a multiple of {layout.pp} micro-batches, or --schedule 1f1b"
        )


def holds_ends(layout: Layout, stage: int) -> tuple[bool, bool]:
    """Whether pipeline rank ``stage`` holds the embedding (the first chunk) and the head (the last): the first
    and last stage, or under zbv both on the first rank."""
    if layout.pp == 1:
        return True, True
    held = rank_chunks(layout, stage)
    return 0 in held, layout.chunks - 1 in held


END_NAMES = {(True, False): "first stage", (False, True): "last stage", (True, True): "first and last stages"}
"""A rank that holds the embedding, the head or both, by (first, last)."""


@functools.lru_cache(maxsize=8192)
def rank_kinds(layout: Layout, chunks: tuple[int, ...], micro_batches: int) -> tuple[RankKind, ...]:
    """Every kind of rank, given each chunk's blocks (headroom.core.specs.stages.chunk_layers): one without a
    pipeline; with one the ranks that hold the embedding or the head (the first and last stages; under zbv the
    first rank holds both), and of the others, for each count of blocks the one that keeps the most
    micro-batches in flight (the first of those alike: under the other schedules a later stage keeps no more
    than an earlier one, so only zbv's ranks are weighed)."""
    if layout.pp == 1:
        return (RankKind("only", 0, chunks[0], True, True, Fraction(1)),)

    def held(rank: int) -> tuple[int, ...]:
        return tuple(chunks[c] for c in rank_chunks(layout, rank))

    def kind(rank: int, name: str = "") -> RankKind:
        weights = held(rank)
        return RankKind(name, rank, sum(weights), *holds_ends(layout, rank),
                        in_flight(layout, rank, micro_batches, weights), chunks=weights if len(weights) > 1 else ())

    ends, middles = [], {}
    for rank in range(layout.pp):
        if any(holds_ends(layout, rank)):
            ends.append(kind(rank))
            continue
        n = sum(held(rank))
        if n not in middles or (layout.schedule == "zbv" and kind(rank).in_flight > middles[n].in_flight):
            middles[n] = kind(rank)
    chosen = sorted(middles.values(), key=lambda k: k.stage)
    kinds = [replace(k, name=END_NAMES[k.first, k.last]) for k in ends]
    kinds += [replace(k, name="middle stage" if len(chosen) == 1 else f"middle stage {k.stage}") for k in chosen]
    return tuple(sorted(kinds, key=lambda k: (k.stage != 0, k.last and not k.first, k.stage)))


def first_rank(layout: Layout, n_layers: int, stack: str = "reference") -> RankKind:
    """The first stage's kind (the only one without a pipeline) under the stack's split."""
    return rank_kinds(layout, chunk_layers(layout, n_layers, stack), 1)[0]


def pipeline_seconds(stage_s: tuple[float, ...], micro_batches: int, virtual_stages: int = 1) -> float:
    """One step of a pipeline whose stage i takes ``stage_s[i]`` a micro-batch: the slowest stage runs every
    micro-batch and each other stage's one micro-batch fills and drains the pipe, m t_max + (sum t - t_max) / v.
    Alike stages give Narayanan et al.'s (m + (pp - 1) / v) t (2021, Sec. 2.2)."""
    slowest = max(stage_s)
    return micro_batches * slowest + (sum(stage_s) - slowest) / virtual_stages
