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

Bubble (Narayanan et al. 2021, Sec. 2.2): idle time is (pp - 1) / (v m) of
the ideal time of the m micro-batches (v = 1 for 1f1b and gpipe) when the stages
are alike; `pipeline_seconds` times stages that are not.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from headroom.core.errors import ConfigError
from headroom.core.specs.layout import Layout
from headroom.core.specs.stages import stage_layers


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


def in_flight(layout: Layout, stage: int, micro_batches: int) -> Fraction:
    """Micro-batches of activations stage ``stage`` keeps at once under the layout's schedule."""
    p, v, m = layout.pp, layout.virtual_stages, micro_batches
    if p == 1:
        return Fraction(1)
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


def rank_kinds(layout: Layout, layers: tuple[int, ...], micro_batches: int) -> tuple[RankKind, ...]:
    """Every kind of rank, given each stage's blocks (headroom.core.specs.stages.stage_layers): one without a
    pipeline; with one the first and last stages, and of the middle stages the first to hold each count of
    blocks (it keeps the most micro-batches in flight of those alike)."""
    if layout.pp == 1:
        return (RankKind("only", 0, layers[0], True, True, Fraction(1)),)
    middles = {n: stage for stage, n in reversed(list(enumerate(layers[1:-1], start=1)))}
    named = ["middle stage"] if len(middles) == 1 else [f"middle stage {stage}" for stage in sorted(middles.values())]
    stages = [("first stage", 0), *zip(named, sorted(middles.values()), strict=True), ("last stage", layout.pp - 1)]
    return tuple(
        RankKind(name, stage, layers[stage], stage == 0, stage == layout.pp - 1,
                 in_flight(layout, stage, micro_batches))
        for name, stage in stages
    )


def first_rank(layout: Layout, n_layers: int, stack: str = "reference") -> RankKind:
    """The first stage's kind (the only one without a pipeline) under the stack's split."""
    return rank_kinds(layout, stage_layers(layout, n_layers, stack), 1)[0]


def pipeline_seconds(stage_s: tuple[float, ...], micro_batches: int, virtual_stages: int = 1) -> float:
    """One step of a pipeline whose stage i takes ``stage_s[i]`` a micro-batch: the slowest stage runs every
    micro-batch and each other stage's one micro-batch fills and drains the pipe, m t_max + (sum t - t_max) / v.
    Alike stages give Narayanan et al.'s (m + (pp - 1) / v) t (2021, Sec. 2.2)."""
    slowest = max(stage_s)
    return micro_batches * slowest + (sum(stage_s) - slowest) / virtual_stages
