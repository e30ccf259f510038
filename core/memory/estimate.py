"""One configuration in, a breakdown of memory and FLOPs out.

``estimate(spec, config, device).to_dict()`` is the JSON contract of
``headroom estimate --json`` (documented in README.md): top-level keys
``model``, ``config``, ``memory_bytes``, ``peak`` (when the peak happens and
its components, which add up to it), ``flops`` and ``notes``. Bytes and FLOPs
are integers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from fractions import Fraction
from typing import Any

from headroom.core.errors import ConfigError
from headroom.core.memory.flops import StepFlops, step_flops
from headroom.core.memory.ledger import Ledger, activation_ledger, chunk_device_bytes
from headroom.core.memory.pipeline import (
    RankKind,
    check_micro_batches,
    holds_ends,
    rank_kinds,
    v_in_flight,
    v_peak,
)
from headroom.core.memory.static import (
    StaticMemory,
    fsdp_units,
    gathered_in_forward,
    rank_matmul_weights,
    static_memory,
)
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.layout import Layout
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.precision import optimizer_step_transient_bytes
from headroom.core.specs.stack import get_stack
from headroom.core.specs.stages import rank_chunks

PEAK_NOTE = (
    "peak = the larger of forward's last moment (static state + every autocast weight copy + activations "
    "+ log-probs + the logits the loss reads) and backward's first (static state + weight copies kept + "
    "activations + log-probs + the loss's gradients: two fp32 over the vocabulary under F.cross_entropy, "
    "other stacks' per docs/accounting.md) or a recomputed segment, and the optimizer's step (the whole static "
    "state, every gradient included, and the step's temporaries); without gradient accumulation the gradients "
    "do not exist yet at forward's and backward's moments"
)


@dataclass(frozen=True, slots=True)
class Estimate:
    spec: ModelSpec
    config: TrainConfig
    device: str
    static: StaticMemory
    ledger: Ledger
    flops: StepFlops
    accumulation_steps: int = 1
    """Micro-batches per optimizer step: with more than one, the gradients exist (from the previous
    micro-batch) while the next forward and the start of its backward run; with one, gradients are
    freed after each step (``zero_grad(set_to_none=True)``) and appear only as backward produces them."""
    rank: RankKind = field(default_factory=lambda: RankKind("only", 0, 0, True, True, Fraction(1)))
    """The rank this estimate is for (headroom.core.memory.pipeline): its stage, layers and micro-batches in flight."""
    ranks: tuple[Estimate, ...] = ()
    """Every rank kind of the layout, this one included (set by ``estimate``)."""
    _moments_once: dict[str, dict[str, int]] | None = field(default=None, init=False, repr=False, compare=False)
    """``_moments``, worked out on first use: the peak, its moment and its parts all read them."""

    def _in_flight(self, nbytes: int, count: Fraction | None = None) -> int:
        count = self.rank.in_flight if count is None else count
        return nbytes * count.numerator // count.denominator

    @property
    def logits_bytes(self) -> int:
        """The loss's fp32 probabilities over the vocabulary, kept for backward (last stage)."""
        return self._in_flight(self.ledger.probability_bytes, self.rank.logits_count)

    @property
    def activation_bytes(self) -> int:
        """Everything else forward keeps on the device for backward, for every micro-batch in flight."""
        return self._in_flight(self.ledger.device_activation_bytes) - self.logits_bytes

    @property
    def weight_copy_bytes(self) -> int:
        """Autocast's 16-bit weight copies backward keeps, one set per micro-batch in flight."""
        return self._in_flight(self.ledger.parameter_copy_bytes, self.rank.copies_count)

    @property
    def autocast_cache_bytes(self) -> int:
        """Under amp-bf16, autocast's 16-bit copy of every matmul weight of this rank, alive until the
        forward ends (the ones backward needs are kept beyond it: ``weight_copy_bytes``); measured on an
        H200. Under ZeRO-3, FSDP's mixed precision gathers bf16 units instead: no autocast cache."""
        if not self.config.recipe.autocast or self.config.zero == 3:
            return 0
        return 2 * rank_matmul_weights(self.spec, self.config.layout, self.rank)

    @property
    def fsdp_units(self) -> tuple[tuple[int, int], ...]:
        """The units FSDP gathers on this rank (headroom.core.memory.static.fsdp_units); none without ZeRO-3 or
        without ranks to shard over."""
        config = self.config
        if config.zero < 3 or config.dp * config.layout.cp == 1:
            return ()
        return fsdp_units(self.spec, config.layout, self.rank)

    @property
    def gathered_parameter_bytes(self) -> tuple[int, int]:
        """FSDP (ZeRO-3): the unsharded units alive at once in forward and in backward
        (headroom.core.specs.data_parallel says when a unit is freed).

        Forward (`gathered_in_forward`): each unit's all-gather buffer and the parameters copied out of it,
        and what the units before it keep: nothing where they are resharded after forward, all of them where
        they are kept to backward or from one micro-batch to the next (torch's pipelining), a 1/k shard where
        a shard is kept over k ranks. Backward: that, plus the largest unit's unsharded gradient in the compute
        dtype and its copy in the reduce dtype for the reduce-scatter (FSDP2's default reduce dtype is the
        parameters'), a bound.
        """
        units = self.fsdp_units
        if not units:
            return 0, 0
        compute = self.config.recipe.activation_bytes
        reduce = self.config.recipe.grad_bytes
        schedule = self.config.data_parallel
        reshard = False if schedule.keeps_gathered_between_micro_batches else schedule.reshard_after_forward
        gathered = gathered_in_forward(units, reshard) * compute
        return gathered, gathered + max(size for size, _ in units) * (compute + reduce)

    @property
    def deferred_gradient_bytes(self) -> int:
        """FSDP with gradients reduced once per step: each unit's unsharded gradient, kept in the reduce dtype
        from one micro-batch's backward to the next (FSDPParam.to_accumulated_grad_if_needed), in place of the
        sharded gradients, which exist only after the last backward; nothing with one micro-batch."""
        if self.accumulation_steps == 1 or not self.config.data_parallel.defer_gradient_sync:
            return 0
        return sum(size * n for size, n in self.fsdp_units) * self.config.recipe.grad_bytes

    @property
    def _static_at_loss(self) -> int:
        """Static state at the loss: without accumulation the gradients do not exist yet."""
        return self.static.total - (self.static.gradients if self.accumulation_steps == 1 else 0)

    def _moment(self, gradients: int, copies: int, gathered: int, activations: tuple[int, int],
                transient: tuple[str, int]) -> dict[str, int]:
        """What is allocated at one moment: the static state, and ``activations``, the bytes kept for backward
        and the log-probs."""
        static = self.static
        return {
            "parameters": static.parameters, "gradients": gradients, "master_weights": static.master_weights,
            "optimizer_states": static.optimizer_states, "gradient_buckets": static.gradient_buckets,
            "gathered_parameters": gathered, "weight_copies": copies,
            "activations": activations[0], "logits": activations[1], transient[0]: transient[1],
            # only where there are any: one key more in every moment of every candidate costs a search 9 MB
            **({"fp8_weights": static.fp8_weights} if static.fp8_weights else {}),
        }

    @property
    def _moments(self) -> dict[str, dict[str, int]]:
        if self._moments_once is None:
            object.__setattr__(self, "_moments_once", self._allocated_at_moments())
        return self._moments_once

    def _allocated_at_moments(self) -> dict[str, dict[str, int]]:
        """What is allocated at each candidate for the peak, by component.

        ``forward``: the loss reads fp32 logits while autocast still caches every weight copy.
        ``loss backward``: the log-probs' and the logits' fp32 gradients. ``recompute`` (when a
        checkpointed segment or offloaded block is brought back): the log-probs gone, every
        gradient and every kept activation counted, an upper bound. ``optimizer step``: every
        gradient with the rest of the static state and the step's temporaries, nothing else (it is
        the peak when the static state outweighs what a micro-batch adds, as for large sharded models
        under full recompute). Without gradient accumulation no gradient exists at the first two
        moments. The forward, backward and optimizer moments agree with an H200 to 0.3%
        (tests/test_reference_data.py); the recompute bound never formed a measured peak.
        """
        deferred = self.deferred_gradient_bytes
        gradients = deferred or (self.static.gradients if self.accumulation_steps > 1 else 0)
        kept = self.weight_copy_bytes
        activations = (self.activation_bytes, self.logits_bytes)
        ledger = self.ledger
        forward_units, backward_units = self.gathered_parameter_bytes
        moments = {
            "forward": self._moment(gradients, max(self.autocast_cache_bytes, kept), forward_units, activations,
                                    ("forward_transient", ledger.forward_transient_bytes)),
            # Ring attention's buffers in the last layer's backward replace the loss's gradients, freed by
            # then: the larger of the two bounds both moments.
            "loss backward": self._moment(gradients, kept, backward_units, activations, (
                "backward_transient", max(ledger.loss_gradient_bytes, ledger.ring_buffer_bytes))),
        }
        if ledger.recompute_bytes:
            moments["recompute"] = self._moment(deferred or self.static.gradients, kept, backward_units, activations,
                                                ("backward_transient", ledger.recompute_bytes))
        # Every gradient exists and every activation, weight copy and gathered unit is gone.
        moments["optimizer step"] = self._moment(self.static.gradients, 0, 0, (0, 0), (
            "optimizer_transient", self.optimizer_transient_bytes))
        return moments

    @property
    def optimizer_transient_bytes(self) -> int:
        """What the optimizer's step allocates beyond its state (headroom.core.specs.precision.optimizer_step_transient_bytes)."""
        return optimizer_step_transient_bytes(self.config.optimizer, self.device, self.static.optimizer_states)

    @property
    def forward_peak_bytes(self) -> int:
        return sum(self._moments["forward"].values())

    @property
    def backward_peak_bytes(self) -> int:
        return max(sum(parts.values()) for moment, parts in self._moments.items()
                   if moment not in ("forward", "optimizer step"))

    @property
    def optimizer_peak_bytes(self) -> int:
        """The optimizer's step: the whole static state, every gradient included, and the step's temporaries."""
        return sum(self._moments["optimizer step"].values())

    @property
    def peak_moment(self) -> str:
        """When the peak happens: ``forward``, ``loss backward``, ``recompute`` or ``optimizer step``."""
        moments = self._moments
        return max(moments, key=lambda name: sum(moments[name].values()))

    @property
    def peak_components(self) -> dict[str, int]:
        """The peak by component: they add up to ``peak_bytes``."""
        return self._moments[self.peak_moment]

    @property
    def peak_bytes(self) -> int:
        """Peak allocated bytes of the step (torch.cuda.max_memory_allocated: checked on an H200)."""
        return sum(self.peak_components.values())

    def to_dict(self) -> dict[str, Any]:
        model = self.spec.to_dict() | {"parameters": self.spec.parameters}
        config = {
            "seq_len": self.config.seq_len,
            "micro_batch": self.config.micro_batch,
            "tokens": self.config.tokens,
            "recompute": str(self.config.recompute),
            "attention": self.config.attention,
            "dropout": self.config.dropout,
            "precision": self.config.precision,
            "fp8": self.config.fp8,
            "fp8_param_gather": self.config.fp8_param_gather,
            "first_last_bf16": self.config.first_last_bf16,
            "compile": self.config.compile,
            "optimizer": self.config.optimizer,
            "dp": self.config.dp,
            "zero": self.config.zero,
            "layout": layout_dict(self.config.layout),
            "stage_layers": list(self.config.stage_layers(self.spec)),
            "stack": self.config.stack,
            "device": self.device,
            "accumulation_steps": self.accumulation_steps,
        }
        notes = [f"activations: {self._ledger_source()}", PEAK_NOTE]
        notes[:0] = self.config.model_notes(self.spec)
        peak = {"moment": self.peak_moment, "components": self.peak_components}
        return {"model": model, "config": config, "rank": self.rank.name, "ranks": self.ranks_list(),
                "memory_bytes": self.memory_dict(), "peak": peak, "flops": self.flops_dict(), "notes": notes}

    def _ledger_source(self) -> str:
        """Whose tensors the activation ledger counts, and what it was checked against."""
        stack = get_stack(self.config.stack)
        if stack.name == "hf-liger":
            return (f"per-tensor ledger of transformers' modules with Liger's kernels (the hf-liger stack) on "
                    f"{self.device} (checked against the patched model's saved tensors on cpu, Liger's kernels run "
                    "through Triton's interpreter)")
        if stack.transformers_modules:
            flash2 = ", FlashAttention 2's tensors apart" if self.spec.attention_softcap \
                and self.config.attention == "flash" else ""
            return (f"per-tensor ledger of transformers' modules (the {stack.name} stack) on {self.device} (checked "
                    f"against transformers' own model traced on meta, tensor for tensor{flash2})")
        kernels = "" if stack.name == "reference" else f", with the {stack.name} stack's kernels"
        return (f"per-tensor ledger of the agent's decoder{kernels} on {self.device} "
                "(checked against autograd's saved tensors on cpu and meta)")

    def memory_dict(self) -> dict[str, int]:
        """``memory_bytes`` of ``to_dict``: this rank's bytes by component and at each moment."""
        return {
            "parameters": self.static.parameters,
            "gradients": self.static.gradients,
            "master_weights": self.static.master_weights,
            "optimizer_states": self.static.optimizer_states,
            "gradient_buckets": self.static.gradient_buckets,
            "fp8_weights": self.static.fp8_weights,
            "gathered_parameters_forward": self.gathered_parameter_bytes[0],
            "gathered_parameters_backward": self.gathered_parameter_bytes[1],
            "deferred_gradients": self.deferred_gradient_bytes,
            "weight_copies": self.weight_copy_bytes,
            "activations": self.activation_bytes,
            "activations_per_layer": self.ledger.per_layer_bytes,
            "activations_host": self.ledger.host_bytes,
            "logits": self.logits_bytes,
            "backward_transient": self.ledger.transient_bytes,
            "autocast_cache": self.autocast_cache_bytes,
            "forward_transient": self.ledger.forward_transient_bytes,
            "forward_peak": self.forward_peak_bytes,
            "backward_peak": self.backward_peak_bytes,
            "optimizer_transient": self.optimizer_transient_bytes,
            "optimizer_peak": self.optimizer_peak_bytes,
            "peak": self.peak_bytes,
        }

    def flops_dict(self) -> dict[str, Any]:
        """``flops`` of ``to_dict``."""
        return {
            "forward": self.flops.forward,
            "backward": self.flops.backward,
            "recompute": self.flops.recompute,
            "step": self.flops.hardware,
            "model": self.flops.model,
            "per_token": self.flops.model // self.flops.tokens,
            "forward_by_component": self.flops.blocks_forward_by_matmul | {"logits": self.flops.logits_forward},
        }

    def ranks_list(self) -> list[dict[str, Any]]:
        """``ranks`` of ``to_dict``: every rank kind's peak, its moment and its components."""
        return [
            {"rank": r.rank.name, "stage": r.rank.stage, "layers": r.rank.layers,
             "micro_batches_in_flight": float(r.rank.in_flight), "peak_moment": r.peak_moment,
             "peak": r.peak_bytes, "components": r.peak_components}
            for r in self.ranks or (self,)
        ]


def layout_dict(layout: Layout) -> dict[str, Any]:
    """A layout as JSON: every axis, the schedule and the world size."""
    return {f.name: getattr(layout, f.name) for f in fields(layout)} | {"world": layout.world}  # every field a scalar


def for_rank(prediction: Estimate, global_rank: int) -> Estimate:
    """The estimate of global rank ``global_rank``: its pipeline stage's kind, the one that holds as many blocks
    at the same end of the pipeline (ranks numbered tp, cp, dp, pp from fastest to slowest, as
    headroom.core.timing.comm places them)."""
    layout = prediction.config.layout
    if not 0 <= global_rank < layout.world:
        raise ConfigError(f"rank {global_rank} is not one of the layout's {layout.world} ranks")
    stage = global_rank // (layout.tp * layout.cp * layout.dp)
    layers = prediction.config.stage_layers(prediction.spec)[stage]
    kinds = prediction.ranks or (prediction,)
    return next(k for k in kinds if (k.rank.layers, k.rank.first, k.rank.last)
                == (layers, *holds_ends(layout, stage)))


MAX_ACCUMULATION_STEPS = 2**24
"""Micro-batches per optimizer step at most: the largest global batch planned (headroom.core.planning.planner.MAX_GLOBAL_BATCH)
in micro-batches of one sequence."""


EMBEDDING_ONLY = RankKind("embedding", 0, 0, True, False, Fraction(1))
"""A stage of the embedding alone: what the first chunk traces before its blocks."""


def _v_rank(rank: RankKind, ledger: Ledger, spec: ModelSpec, config: TrainConfig, device: str,
            chunks: tuple[int, ...], micro_batches: int) -> RankKind:
    """A zbv rank with what it keeps in flight counted chunk by chunk (headroom.core.memory.pipeline): the
    moment its two chunks' activations and weight copies peak together, and then the activations' and the
    copies' micro-batches in flight, each weighted by its chunks' bytes, and the head's."""
    pp, split = config.layout.pp, chunks[rank_chunks(config.layout, rank.stage)[0]]
    embedding = len(activation_ledger(spec, config, device, rank=EMBEDDING_ONLY).traced) if rank.first else 0
    kept = chunk_device_bytes(ledger, split, embedding)
    copies = chunk_device_bytes(ledger, split, embedding, ("parameter_copy",))
    alive = v_peak(pp, rank.stage, micro_batches, (kept[0] + copies[0], kept[1] + copies[1]))
    return replace(rank, in_flight=v_in_flight(pp, rank.stage, micro_batches, kept, alive),
                   copies_in_flight=v_in_flight(pp, rank.stage, micro_batches, copies, alive),
                   logits_in_flight=Fraction(alive[1]) if rank.last else None)


def estimate(spec: ModelSpec, config: TrainConfig, device: str = "cuda", accumulation_steps: int = 1) -> Estimate:
    """The most loaded rank of the layout (its ``ranks`` hold every rank kind's estimate)."""
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) \
            or not 0 < accumulation_steps <= MAX_ACCUMULATION_STEPS:
        raise ConfigError(f"accumulation steps must be an integer from 1 to {MAX_ACCUMULATION_STEPS:,}, got "
                          f"{accumulation_steps!r}")
    config.check_model(spec)
    check_micro_batches(config.layout, accumulation_steps)
    flops = step_flops(spec, config, device)
    chunks = config.chunk_layers(spec)
    ranks = []
    for rank in rank_kinds(config.layout, chunks, accumulation_steps):
        ledger = activation_ledger(spec, config, device, rank=rank)
        if config.layout.schedule == "zbv":
            rank = _v_rank(rank, ledger, spec, config, device, chunks, accumulation_steps)
        ranks.append(Estimate(spec=spec, config=config, device=device, static=static_memory(spec, config, rank),
                              ledger=ledger, flops=flops, accumulation_steps=accumulation_steps, rank=rank))
    worst = max(ranks, key=lambda r: r.peak_bytes)
    if len(ranks) == 1:
        return worst
    with_ranks = replace(worst, ranks=tuple(ranks))
    object.__setattr__(with_ranks, "_moments_once", worst._moments)  # the same rank: the same moments
    return with_ranks
