"""The planner: for a model, a global batch and a memory budget, what to run.

On one layout (the request's), every micro-batch that divides the per-rank
batch is tried with every checkpoint policy worth trying. Given a GPU count
(``PlanRequest.gpus``), every layout of that many GPUs is tried
(headroom.core.planning.layout_search): a layout whose lightest candidate (micro-batch 1, full
recompute) does not fit is dropped with that candidate as its reason. Each candidate gets the ledger's peak memory
and the time model's step time on the chosen hardware, both corrected by that
hardware's calibration. A candidate fits when

    required = calibrated peak x allocator fragmentation + CUDA context reserve <= budget.

Fitting candidates are ranked by tokens/s, ties broken toward more headroom.
Candidates within 1% of the fastest (below what the time model can resolve)
are ranked first by the fewest model-parallel ranks (tp x pp x cp) and the
lowest sharding stage: such a layout is simpler to run, and the efficiency it
loses to smaller GEMMs and more kernel launches the datasheet model does not see.
Every rejected one says by how much it missed and which term broke the budget;
every layout that lost says why. When nothing fits, `headroom.core.planning.advice` says what
dominates and the smallest change that would fit. docs/plan-contract.md is the
user's account of all this.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from headroom.core.collector import collector_paused
from headroom.core.divisors import divisors
from headroom.core.errors import ConfigError
from headroom.core.measured.calibration import Calibration, uncalibrated
from headroom.core.memory.estimate import Estimate, estimate, layout_dict
from headroom.core.memory.ledger import activation_ledger, ledgers_kept
from headroom.core.planning.layout_search import candidate_layouts
from headroom.core.planning.pruning import (
    NO_RECOMPUTE,
    Bar,
    PrunedLayout,
    candidate_floor_s,
)
from headroom.core.planning.search_work import SearchWork, bounded_search, charge
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.float8 import FLOAT8_RECIPES
from headroom.core.specs.interconnect import Cluster
from headroom.core.specs.layout import MAX_GPUS, Layout
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.precision import SEARCHED, get_precision, searched_precisions
from headroom.core.specs.recompute import RecomputePolicy
from headroom.core.specs.run_config import RunConfig
from headroom.core.specs.stack import get_stack
from headroom.core.timing.run_cost import RunCost, Utilization, check_run, utilization
from headroom.core.timing.step import (
    HardwareProfile,
    StepTime,
    runs_recipe,
    step_time,
    tokens_per_s,
)
from headroom.core.units import GB

NEAR = 0.01
"""Candidates this close to the fastest (relative tokens/s) count as equally fast."""
MAX_GLOBAL_BATCH = 2**24
"""Sequences per step at most: 16.7 million, far beyond the largest published batches (Llama 3: 16M tokens,
i.e. 2,048 sequences of 8,192). The candidates are the batch's divisors, so the bound bounds the work."""
DEFAULT_BUDGET_BYTES = 80 * GB
DEFAULT_CONTEXT_RESERVE_BYTES = 1 * GB
"""CUDA context, cuBLAS/cuDNN workspaces and NCCL buffers: about 0.5-1 GB on Hopper; the high end."""

SearchProgress = Callable[[int, int, str], None]
"""Told ``(layouts done, layouts in all, what is searched)`` after each layout of a search: a search over
thousands of GPUs tries a thousand layouts and takes tens of seconds on one core."""


def default_budget(profile: HardwareProfile) -> int:
    """80 GB per device, or the device's memory where it has less: a 24 GB card is planned at 24 GB."""
    return min(DEFAULT_BUDGET_BYTES, profile.memory_bytes)


def budget_share(budget_bytes: int, profile: HardwareProfile) -> str:
    """The budget against what the device holds: "all the h100-sxm holds", or, on a device that holds more,
    "80.0 of the 141.0 GB the h200 holds" (the default budget plans 80 GB of a bigger card); empty over it
    (`budget_note` says that)."""
    if budget_bytes == profile.memory_bytes:
        return f"all the {profile.name} holds"
    if budget_bytes < profile.memory_bytes:
        return f"{budget_bytes / GB:.1f} of the {profile.memory_bytes / GB:.1f} GB the {profile.name} holds"
    return ""


def whole_device_budget(profile: HardwareProfile) -> str:
    """The budget that plans all of the device, as ``--budget`` takes it (rounded down to 0.1 GB)."""
    return f"{math.floor(profile.memory_bytes / GB * 10) / 10:g}GB"


def budget_note(budget_bytes: int, profile: HardwareProfile) -> str | None:
    """Said when the budget is more than the device holds: such a plan is for a device that does not exist."""
    if budget_bytes <= profile.memory_bytes:
        return None
    return (f"the {budget_bytes / GB:.1f} GB budget is more than the {profile.memory_bytes / GB:.1f} GB the "
            f"{profile.name} holds; a budget of at most {profile.memory_bytes / GB:.1f}GB plans for it")


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanRequest:
    spec: ModelSpec
    train: TrainConfig
    """Sequence length, precision, optimizer, attention, dropout and layout; the planner chooses the
    micro-batch and the checkpoint policy (their values here are ignored)."""
    global_batch: int
    """Sequences per optimizer step, across all data-parallel ranks."""
    budget_bytes: int = DEFAULT_BUDGET_BYTES
    allow_offload: bool = False
    context_reserve_bytes: int = DEFAULT_CONTEXT_RESERVE_BYTES
    gpus: int | None = None
    """Search every layout of this many GPUs; None: plan the one layout of ``train``."""
    pinned: frozenset[str] = frozenset()
    """Layout fields (headroom.core.planning.layout_search.PINNABLE) the search keeps at ``train.layout``'s value."""
    cluster: Cluster | None = None
    """GPUs per node and links; None: headroom.core.specs.interconnect.default_cluster of the hardware."""
    micro_batch: int | None = None
    """Pinned micro-batch (``--micro-batch``); None: the planner's to choose."""
    recompute: RecomputePolicy | None = None
    """Pinned checkpoint policy (``--recompute``); None: the planner's to choose."""
    accumulation: int | None = None
    """Pinned micro-batches per optimizer step (``--accumulation``): the micro-batch is the per-rank batch over it."""
    train_tokens: int | None = None
    """Tokens the whole run trains on (``--train-tokens``): the plan says how long and how many GPU-hours."""
    gpu_hour_price: float | None = None
    """Price of one GPU-hour (``--gpu-hour-price``), in any currency: the plan prices the run."""
    fp8_search: bool = False
    """Try every FP8 recipe (headroom.core.specs.float8) beside ``train.fp8`` (``--fp8 auto``): those the stack
    runs and the configuration allows, on hardware with fp8 units."""
    precision_search: bool = False
    """Try every precision recipe the hardware computes in (``--precision auto``;
    headroom.core.specs.precision.searched_precisions), each with fp8 off and with each FP8 recipe as
    ``fp8_search`` tries them; ``train.precision`` is then the lightest (``LIGHTEST``), which screens each layout."""

    def __post_init__(self) -> None:
        if isinstance(self.global_batch, bool) or not isinstance(self.global_batch, int) or self.global_batch <= 0:
            raise ConfigError(f"global batch must be a positive number of sequences, got {self.global_batch!r}")
        if self.global_batch > MAX_GLOBAL_BATCH:
            raise ConfigError(f"global batch {self.global_batch:,} sequences is beyond any training run "
                              f"(at most {MAX_GLOBAL_BATCH:,})")
        if self.gpus is not None and (isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus <= 0):
            raise ConfigError(f"gpus must be a positive integer, got {self.gpus!r}")
        if self.gpus is not None and self.gpus > MAX_GPUS:
            raise ConfigError(f"--gpus {self.gpus:,} is beyond any cluster (at most {MAX_GPUS:,})")
        self.train.layout.check_batch(self.global_batch)
        self._check_whole_nodes()
        if self.budget_bytes <= self.context_reserve_bytes:
            raise ConfigError(
                f"budget {self.budget_bytes / GB:.2f} GB leaves nothing after the "
                f"{self.context_reserve_bytes / GB:.2f} GB CUDA context reserve"
            )
        self.train.check_model(self.spec)
        self.train.check_sharding()
        layout = self.train.layout  # with one data-parallel rank, check_sharding leaves the stage to the pins
        get_stack(self.train.stack).check_data_parallel(layout.zero, layout.overlap_param_gather,
                                                        layout.defer_gradient_sync, "zero" in self.pinned)
        self._check_pins()
        check_run(self.train_tokens, self.gpu_hour_price)

    def _check_pins(self) -> None:
        """A pinned micro-batch, accumulation and policy must make the global batch, and the stack offer the policy."""
        for name, value in (("micro-batch", self.micro_batch), ("accumulation", self.accumulation)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ConfigError(f"--{name} must be a positive integer, got {value!r}")
        if self.recompute is not None:
            get_stack(self.train.stack).check_policy(self.recompute)
            if (why := self.train.unmodelled_policy(self.spec, self.recompute)) is not None:
                raise ConfigError(f"{why}; pin full or none, or leave --recompute to the planner")
        if self.gpus is not None:
            return  # each layout's per-rank batch differs: a layout the pins do not divide is skipped
        per_rank = self.per_rank_batch
        valid = ", ".join(map(str, divisors(per_rank)))
        if self.micro_batch is not None and per_rank % self.micro_batch:
            raise ConfigError(f"--micro-batch {self.micro_batch} does not divide the per-rank batch {per_rank} "
                              f"(global batch {self.global_batch} / dp {self.dp}); valid: {valid}")
        if self.accumulation is not None and per_rank % self.accumulation:
            raise ConfigError(f"--accumulation {self.accumulation} does not divide the per-rank batch {per_rank} "
                              f"(global batch {self.global_batch} / dp {self.dp}); valid: {valid}")
        if self.micro_batch is not None and self.accumulation is not None \
                and self.micro_batch * self.accumulation != per_rank:
            raise ConfigError(f"--micro-batch {self.micro_batch} x --accumulation {self.accumulation} is "
                              f"{self.micro_batch * self.accumulation} sequences per rank, not the per-rank batch "
                              f"{per_rank} (global batch {self.global_batch} / dp {self.dp})")

    def notes(self) -> tuple[str, ...]:
        """What a plan of this request says beside its figures: the model's notes
        (headroom.core.specs.config.TrainConfig.model_notes) and the policies its stack offers that are not tried
        for this model, with why."""
        left_out = () if self.recompute is not None else tuple(
            f"{policy} checkpointing is not tried: {why}" for policy in offered_policies(self)
            if (why := self.train.unmodelled_policy(self.spec, policy)) is not None)
        return (*self.train.model_notes(self.spec), *left_out)

    @property
    def pins_one_candidate(self) -> bool:
        """The micro-batch (directly or by accumulation) and the policy are pinned on one layout, and no FP8 recipe
        is searched: the plan evaluates that one configuration, and reports it even when it does not fit."""
        return self.gpus is None and self.recompute is not None and not self.searches_recipes and (
            self.micro_batch is not None or self.accumulation is not None)

    def run_cost(self, candidate: Candidate) -> RunCost | None:
        """What training ``train_tokens`` with ``candidate`` takes, or None without ``train_tokens``."""
        if self.train_tokens is None:
            return None
        return RunCost(self.train_tokens, self.global_batch * self.seq_len, candidate.step_time_s,
                       candidate.layout.world, self.gpu_hour_price)

    def _check_whole_nodes(self) -> None:
        """More GPUs than a node are whole nodes: the placement (headroom.core.timing.comm) numbers ranks node by node, and a
        partial last node is not modelled. Fewer than a node is one node, partly used."""
        if self.cluster is None:
            return
        world, per_node = self.gpus or self.layout.world, self.cluster.gpus_per_node
        if world > per_node and world % per_node:
            fewer, more = world // per_node * per_node, (world // per_node + 1) * per_node
            node_sizes = [d for d in divisors(world) if 1 < d <= per_node]
            raise ConfigError(
                f"{world} GPUs are not whole nodes of {per_node} (--gpus-per-node): use {fewer} or {more} GPUs"
                + (f", or --gpus-per-node among {', '.join(map(str, node_sizes))}" if node_sizes else ""))

    @property
    def seq_len(self) -> int:
        return self.train.seq_len

    @property
    def layout(self) -> Layout:
        return self.train.layout

    @property
    def dp(self) -> int:
        return self.train.dp

    @property
    def zero(self) -> int:
        return self.train.zero

    @property
    def precision(self) -> str:
        return self.train.precision

    @property
    def searches_recipes(self) -> bool:
        """The precision or the FP8 recipe is searched: each is a candidate of its own."""
        return self.fp8_search or self.precision_search

    @property
    def fp8_text(self) -> str:
        """The FP8 recipe a plan's header names beside the precision: searched, pinned, or none ("")."""
        if self.fp8_search:
            return " (fp8 recipes searched)"
        if self.train.float8 is None:
            return ""
        return (f" + fp8 {self.train.fp8}" + (" (fp8 param gather)" if self.train.fp8_params else "")
                + (" (first and last blocks bf16)" if self.train.first_last_bf16 else ""))

    @property
    def precision_text(self) -> str:
        """The precision and FP8 recipe as a plan's header names them."""
        if self.precision_search:
            return "precision recipes searched (each with the fp8 recipes the stack runs)"
        return f"{self.precision}{self.fp8_text}"

    @property
    def per_rank_batch(self) -> int:
        return self.global_batch // self.dp

    def base_config(self, micro_batch: int, policy: RecomputePolicy) -> TrainConfig:
        return replace(self.train, micro_batch=micro_batch, recompute=policy)

    def with_layout(self, global_batch: int | None = None, **changes: Any) -> PlanRequest:
        """The same request on a changed layout (``dp=16, zero=3``), and optionally global batch."""
        return self.on_layout(replace(self.train.layout, **changes), global_batch)

    def on_layout(self, layout: Layout, global_batch: int | None = None) -> PlanRequest:
        """The same request planned on exactly ``layout``."""
        return replace(self, train=replace(self.train, layout=layout), gpus=None, pinned=frozenset(),
                       global_batch=self.global_batch if global_batch is None else global_batch)

    def cluster_for(self, profile: HardwareProfile) -> Cluster:
        """The request's cluster, else the hardware's default one (8 GPUs a node, NVLink, InfiniBand NDR)."""
        return self.cluster or profile.cluster()


@dataclass(frozen=True, slots=True)
class Candidate:
    estimate: Estimate
    accumulation_steps: int
    time: StepTime
    calibrated_peak_bytes: int
    """Predicted peak allocated bytes times the calibration's memory correction (the raw prediction is
    ``estimate.peak_bytes``)."""
    required_bytes: int
    """calibrated peak x fragmentation + context reserve: what must fit in the budget."""
    tokens_per_s: float
    """Across all data-parallel ranks, calibrated."""
    step_time_s: float
    """Calibrated."""
    rejection: str | None = None
    peak_flop_per_s: float | None = None
    """One GPU's dense peak for the compute dtype (MFU's denominator); None where the device has none."""
    fragmentation: float = 1.0
    """The allocator's fragmentation ``required_bytes`` was margined by (HardwareProfile.fragmentation_for)."""
    names_precision: bool = False
    """Its precision recipe was searched (PlanRequest.precision_search): its label names it."""

    @property
    def utilization(self) -> Utilization:
        """MFU, HFU and TFLOP/s per GPU at the calibrated step time (headroom.core.timing.run_cost)."""
        return utilization(self.estimate, self.accumulation_steps, self.step_time_s, self.peak_flop_per_s)

    @property
    def config(self) -> TrainConfig:
        return self.estimate.config

    @property
    def run_config(self) -> RunConfig:
        """What this candidate runs, as the agent measures it and an export writes it."""
        return RunConfig(train=self.config, accumulation_steps=self.accumulation_steps)

    @property
    def label(self) -> str:
        """The run configuration's label, and the precision where the plan searched it."""
        return self.run_config.label + (f", {self.config.precision}" if self.names_precision else "")

    @property
    def layout(self) -> Layout:
        return self.config.layout

    @property
    def _factor(self) -> float:
        """The calibration's correction, as applied to ``step_time_s``."""
        return self.step_time_s / self.time.total_s

    @property
    def compute_s(self) -> float:
        """The step's device time, calibrated like ``step_time_s``."""
        return self.time.step_device_s * self._factor

    @property
    def host_s(self) -> float:
        """The step's host dispatch time, calibrated like ``step_time_s``."""
        return self.time.step_host_s * self._factor

    def time_by_term(self) -> dict[str, float]:
        """Seconds per step by term, calibrated like ``step_time_s``: they add up to it."""
        return {term: seconds * self._factor for term, seconds in self.time.by_term().items()}

    def to_dict(self, budget_bytes: int) -> dict[str, Any]:
        return {
            "micro_batch": self.config.micro_batch,
            "accumulation_steps": self.accumulation_steps,
            "recompute": str(self.config.recompute),
            "precision": self.config.precision,
            "fp8": self.config.fp8,
            "tokens_per_s": self.tokens_per_s,
            "step_time_s": self.step_time_s,
            "calibrated_peak_bytes": self.calibrated_peak_bytes,
            "required_bytes": self.required_bytes,
            "fragmentation": self.fragmentation,
            "headroom_bytes": budget_bytes - self.required_bytes,
            "layout": layout_dict(self.layout),
            "stage_layers": list(self.config.stage_layers(self.estimate.spec)),
            "cp_comm": self.config.cp_comm if self.layout.cp > 1 else None,
            "ep_comm": self.config.ep_comm if self.layout.ep > 1 else None,
            "tokens_per_s_per_gpu": self.tokens_per_s / self.layout.world,
            "memory_bytes": self.estimate.memory_dict(),
            "ranks": self.estimate.ranks_list(),
            "time_s": self.time_by_term(),
            "compute_s": self.compute_s,
            "host_s": self.host_s,
            "host_bound": self.time.host_bound,
            "kernel_launches_per_micro_batch": self.time.launches,
            "utilization": self.utilization.to_dict(),
            "communication": [
                {"axis": t.axis, "op": t.op, "message_bytes": t.message_bytes, "calls": t.calls,
                 "group_size": t.group_size, "link": t.link_key, "seconds": t.seconds,
                 "overlappable": t.overlappable, "window": t.window, "note": t.note}
                for t in self.time.communication
            ],
            "data_parallel": self.config.data_parallel.to_dict(self.layout.zero),
            "overlap": [overlap.to_dict() for overlap in self.time.overlaps],
            "rejection": self.rejection,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    request: PlanRequest
    profile: HardwareProfile
    calibration: Calibration
    candidates: tuple[Candidate, ...]
    """Fitting candidates, best first."""
    rejected: tuple[Candidate, ...]
    advice: tuple[str, ...] = field(default=())
    """When nothing fits: what dominates and the smallest change that would fit."""
    layouts: tuple[LayoutOutcome, ...] = field(default=())
    """Every layout searched, best first (one entry without a search)."""
    unsearched: int = 0
    """Layouts left untried when the search ran out of its time limit (`plan`'s ``time_limit_s``) or its work
    bound (headroom.core.planning.search_work): ``stopped_at`` says which."""
    stopped_at: str = ""
    """``time limit`` or ``work bound`` where the search stopped short, else empty."""
    pruned: tuple[PrunedLayout, ...] = field(default=())
    """Layouts a search left out, lowest floor first: no candidate of theirs can tie with the recommendation
    (headroom.core.planning.pruning)."""

    @property
    def recommendation(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    def tied_with_fastest(self, candidate: Candidate, fastest: float | None = None) -> bool:
        """``candidate`` is within ``NEAR`` of the fastest fitting one (``fastest`` tokens/s, where known): as fast
        as the model can tell (the ranking puts the simplest of these first)."""
        if fastest is None:
            fastest = max((c.tokens_per_s for c in self.candidates), default=0.0)
        return candidate.tokens_per_s >= fastest * (1 - NEAR)

    @property
    def band(self) -> int:
        """How many of the ranked candidates lead tied with the fastest (`tied_with_fastest`)."""
        fastest = max((c.tokens_per_s for c in self.candidates), default=0.0)
        return next((i for i, c in enumerate(self.candidates) if not self.tied_with_fastest(c, fastest)),
                    len(self.candidates))

    @property
    def pinned(self) -> Candidate | None:
        """The one configuration a fully pinned request asks about, fitting or not (`PlanRequest.pins_one_candidate`)."""
        if not self.request.pins_one_candidate:
            return None
        return next(iter(self.candidates or self.rejected), None)

    def forced_by(self) -> str | None:
        """What made a search split the model as far as its recommendation does (tp x pp x cp ranks): none of the
        layouts split over fewer ranks fits (memory: the closest, and what breaks it), or the fastest of them is
        slower by more than a near tie (time: by how much, and the term). None without a search, or where the
        recommendation splits the model over no more ranks than any layout searched."""
        best = self.recommendation
        if self.request.gpus is None or best is None:
            return None
        split = _split(best.layout)
        simpler = [o for o in self.layouts if _split(o.layout) < split]
        left_out = [p for p in self.pruned if _split(p.layout) < split]
        if not simpler and not left_out:
            return None
        fitting = [o for o in simpler if o.fits]
        if left_out:
            tokens = self.request.global_batch * self.request.seq_len
            floored = (f"{len(left_out):,} layout{'s' if len(left_out) > 1 else ''} over fewer model-parallel ranks "
                       f"cannot come within {NEAR:.0%} (the fastest at most "
                       f"{left_out[0].max_tokens_per_s(tokens):,.0f} tokens/s against {best.tokens_per_s:,.0f})")
            if not fitting:
                return f"time: {floored}" + ("; the others do not fit" if simpler else "")
        if not fitting:
            closest = min((o.closest for o in simpler if o.closest is not None), key=lambda c: c.required_bytes,
                          default=None)
            if closest is None:
                return None
            return (f"memory: no layout over fewer than {split} model-parallel ranks fits; the closest, "
                    f"{closest.layout} ({closest.label}), {closest.rejection}")
        fastest = max(fitting, key=lambda o: o.best.tokens_per_s if o.best else 0.0)
        searched = "searched " if left_out else ""
        return (f"time: the fastest {searched}layout over fewer model-parallel ranks, {fastest.layout}, is "
                f"{fastest.why_lost(best)}" + (f"; {floored}" if left_out else ""))


@dataclass(frozen=True, slots=True)
class LayoutOutcome:
    """One layout searched: its fastest fitting candidate, or the lightest one and why it does not fit."""

    layout: Layout
    best: Candidate | None
    closest: Candidate | None
    """The least-memory candidate tried, when nothing fit."""

    @property
    def fits(self) -> bool:
        return self.best is not None

    def why_lost(self, winner: Candidate | None) -> str:
        """Why this layout is not the recommendation: its memory, or the terms that made it slower."""
        if self.best is None:
            assert self.closest is not None
            return f"does not fit: {self.closest.label} {self.closest.rejection}"
        if winner is None or self.best is winner:
            return "recommended"
        if self.best.tokens_per_s >= winner.tokens_per_s * (1 - NEAR):
            return (f"as fast within {NEAR:.0%} ({self.best.label}), but splits the model over "
                    f"{_how_split(self.layout)} against {_how_split(winner.layout)}")
        mine, theirs = self.best.time_by_term(), winner.time_by_term()
        term = max(mine, key=lambda k: mine[k] - theirs[k])
        slower = winner.tokens_per_s / self.best.tokens_per_s - 1
        return (f"{slower:.0%} slower ({self.best.label}): {term} {_seconds(mine[term])} against "
                f"{_seconds(theirs[term])} a step")


def policies_worth_trying(request: PlanRequest) -> list[RecomputePolicy]:
    """none, selective, op-selective, full, every-K near the optimum, offload when allowed: those the
    request's training stack offers (headroom.core.specs.stack).

    The segment optimum (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
    Cost"): M(k) ~ ceil(L/k) c + k A is smallest near
    k = sqrt(L c / A), with c one block's input and A one block's activations;
    its neighbours and 2 and 4 are tried too.
    """
    if request.recompute is not None:
        return [request.recompute]
    return [p for p in offered_policies(request) if request.train.unmodelled_policy(request.spec, p) is None]


def offered_policies(request: PlanRequest) -> list[RecomputePolicy]:
    """`policies_worth_trying` before leaving out what cannot be accounted for the model (`PlanRequest.notes`
    says which and why)."""
    layers = max(request.train.stage_layers(request.spec))
    probe = activation_ledger(request.spec, request.base_config(1, RecomputePolicy("none")))
    per_layer = max(1, probe.per_layer_bytes)
    block_input = _block_input_bytes(request)
    best_k = round(math.sqrt(layers * block_input / per_layer))
    ks = sorted({k for k in (2, 4, best_k - 1, best_k, best_k + 1) if 2 <= k < layers})
    policies = [RecomputePolicy(kind) for kind in ("none", "selective", "op-selective", "full")]
    policies += [RecomputePolicy("every", k) for k in ks]
    if request.allow_offload:
        policies.append(RecomputePolicy("offload"))
    offered = get_stack(request.train.stack).policies
    return [p for p in policies if p.kind in offered]


def _block_input_bytes(request: PlanRequest) -> int:
    """What a checkpointed block keeps: its input, this rank's share of the sequence."""
    layout = request.layout
    rows = request.seq_len // layout.cp // (layout.tp if layout.sp else 1)
    return rows * request.spec.hidden * get_precision(request.precision).param_bytes


def evaluate(request: PlanRequest, profile: HardwareProfile, calibration: Calibration,
             micro_batch: int, policy: RecomputePolicy) -> Candidate:
    accumulation = request.per_rank_batch // micro_batch
    est = estimate(request.spec, request.base_config(micro_batch, policy), profile.device, accumulation)
    charge()
    cluster = request.cluster_for(profile) if request.layout.world > 1 else None
    time = step_time(est, profile, accumulation, cluster)
    step_s = time.total_s * calibration.time.correction
    peak = round(est.peak_bytes * calibration.memory.correction)
    fragmentation = profile.fragmentation_for(policy)
    required = round(peak * fragmentation) + request.context_reserve_bytes
    candidate = Candidate(
        estimate=est, accumulation_steps=accumulation, time=time, calibrated_peak_bytes=peak, required_bytes=required,
        tokens_per_s=tokens_per_s(est.config, time) / calibration.time.correction, step_time_s=step_s,
        peak_flop_per_s=profile.peak_flop_per_s.get(est.config.recipe.compute_dtype), fragmentation=fragmentation,
        names_precision=request.precision_search,
    )
    if required <= request.budget_bytes:
        return candidate
    return replace(candidate, rejection=rejection_reason(candidate, request, profile))


def recipe_requests(request: PlanRequest, profile: HardwareProfile) -> list[PlanRequest]:
    """The request, and the same with each recipe it searches: under ``fp8_search`` each FP8 recipe the stack runs
    and this configuration allows, where the device has the tensor cores it needs
    (headroom.core.timing.step.runs_recipe); under ``precision_search`` each precision recipe the device computes
    in (headroom.core.specs.precision.searched_precisions), each with fp8 off and those FP8 recipes."""
    if not request.searches_recipes:
        return [request]
    train = request.train
    precisions = searched_precisions(profile.peak_flop_per_s) if request.precision_search else [train.precision]
    fp8s = [train.fp8, *(name for name, recipe in FLOAT8_RECIPES.items()
                         if name != train.fp8 and train.stack in recipe.stacks and runs_recipe(profile, recipe))]
    subs = []
    for precision in precisions:
        for fp8 in fp8s:
            if (precision, fp8) == (train.precision, train.fp8):
                subs.append(request)
                continue
            try:  # the request checks the configuration and the model, as for the recipe asked for
                subs.append(replace(request, train=replace(train, precision=precision, fp8=fp8)))
            except ConfigError:
                continue
    return subs


def micro_batches(request: PlanRequest) -> list[int]:
    """Micro-batches that divide the per-rank batch (into a multiple of pp under the interleaved schedule): the
    pinned one only, where the request pins the micro-batch or the accumulation."""
    per_rank, layout = request.per_rank_batch, request.layout
    group = layout.pp if layout.schedule == "interleaved" else 1
    return [m for m in divisors(per_rank) if (per_rank // m) % group == 0
            and m == (request.micro_batch or m) and per_rank // m == (request.accumulation or per_rank // m)]


def rejection_reason(candidate: Candidate, request: PlanRequest, profile: HardwareProfile) -> str:
    """How far over the budget, and the term that broke it."""
    est, budget = candidate.estimate, request.budget_bytes
    over = candidate.required_bytes - budget
    static = est.static.total
    if static * candidate.fragmentation + request.context_reserve_bytes > budget:
        term = f"static state alone ({static / GB:.1f} GB of parameters, gradients and optimizer state) breaks it"
    else:
        static_parts = ("parameters", "gradients", "master_weights", "optimizer_states")
        dynamic = {k.replace("_", " "): v for k, v in est.peak_components.items() if k not in static_parts}
        name, size = max(dynamic.items(), key=lambda kv: kv[1])
        term = f"{name} ({size / GB:.1f} GB) break it on top of {static / GB:.1f} GB static"
    return (
        f"needs {candidate.required_bytes / GB:.1f} GB (peak {candidate.calibrated_peak_bytes / GB:.1f} GB x "
        f"{candidate.fragmentation:.2f} fragmentation + {request.context_reserve_bytes / GB:.1f} GB context), "
        f"{over / GB:.1f} GB over the {budget / GB:.1f} GB budget: {term}"
    )


@collector_paused
@ledgers_kept()
def plan(request: PlanRequest, profile: HardwareProfile, calibration: Calibration | None = None, *,
         time_limit_s: float | None = None, progress: SearchProgress | None = None, prune: bool = True) -> Plan:
    """Every candidate of the request's layout, or of every layout of ``request.gpus`` GPUs that can tie with
    the fastest.

    A search tries layouts from the lowest compute floor up (headroom.core.planning.pruning; then the fewest
    ranks one model is split over, then the lowest sharding stage), and leaves out a layout or candidate whose
    floor cannot come within ``NEAR`` of the fastest fitting step found (`Plan.pruned`); ``prune=False``
    evaluates them all (the recommendation and its near ties are the same). ``time_limit_s`` bounds a layout
    search (a dashboard page's work), and headroom.core.planning.search_work bounds every search's work: once
    either is spent no further layout is tried, and the plan counts the ones left (`Plan.unsearched`,
    `Plan.stopped_at`); a search cut short has tried the layouts that could be fastest. ``progress`` hears of
    each layout tried. No advice: when nothing fits, ``headroom.core.planning.advice.plan_and_advise`` says what
    would.
    """
    with bounded_search() as work:
        return _plan(request, profile, calibration or uncalibrated(profile.name), time_limit_s, progress, work,
                     Bar(NEAR) if prune else None)


def _plan(request: PlanRequest, profile: HardwareProfile, calibration: Calibration, time_limit_s: float | None,
          progress: SearchProgress | None, work: SearchWork, bar: Bar | None) -> Plan:
    unsearched, stopped_at, pruned = 0, "", []
    if (request.searches_recipes or request.train.float8 is not None) and "fp8" in profile.dtype_sources:
        fp8 = f"fp8 GEMMs by shape from one large fp8 GEMM ({profile.dtype_sources['fp8']})"
        profile = replace(profile, assumptions=(*profile.assumptions, fp8))
    if request.gpus is None:
        searched = [_plan_layout(request, profile, calibration, screen=False)]
    else:
        cluster = request.cluster_for(profile)
        layouts = candidate_layouts(request.spec, request.train, request.global_batch, request.gpus,
                                    cluster.gpus_per_node, request.pinned)
        subs = [replace(request.on_layout(layout), cluster=cluster) for layout in layouts]
        floors = [layout_floor_s(sub, profile, calibration) for sub in subs]
        order = sorted(range(len(subs)), key=lambda i: (floors[i], _split(subs[i].layout), _stage(subs[i].layout)))
        searched = []  # (outcome, its candidates, the lowest floor of those left out), in the order tried
        started = time.monotonic()
        for tried, i in enumerate(order):
            if searched and (work.exhausted or time_limit_s is not None and time.monotonic() - started > time_limit_s):
                unsearched, stopped_at = len(layouts) - tried, "work bound" if work.exhausted else "time limit"
                break
            sub = subs[i]
            if not micro_batches(sub):  # interleaving needs micro-batches in groups of pp: none to schedule
                pass
            elif bar is not None and bar.beyond(floors[i]):
                pruned.append(PrunedLayout(sub.layout, floors[i], None))
            else:
                searched.append(_plan_layout(sub, profile, calibration, screen=True, bar=bar))
            if progress is not None:
                progress(tried + 1, len(layouts), f"layouts of {request.gpus:,} GPUs")
    outcomes, kept = [], []
    # Whole layouts first, then those some of whose candidates were left out, each in the order tried.
    for outcome, evaluated, skipped in sorted(searched, key=lambda searched: searched[2] < math.inf):
        if skipped < math.inf and outcome.best is not None and bar is not None and bar.beyond(outcome.best.step_time_s):
            # Its fastest may be one left out: each is the best evaluated, or one whose floor is known.
            pruned.append(PrunedLayout(outcome.layout, min(skipped, outcome.best.step_time_s), True))
            continue
        outcomes.append(outcome)
        kept += evaluated
    pruned.sort(key=lambda p: p.floor_s)
    fitting = [c for c in kept if c.rejection is None]
    rejected = [c for c in kept if c.rejection is not None]
    fastest = max((c.tokens_per_s for c in fitting), default=0.0)
    fitting.sort(key=lambda c: _rank(c, fastest))
    outcomes.sort(key=lambda o: _rank(o.best, fastest) if o.best else (True, (0, 0), 0.0, o.closest.required_bytes))
    return Plan(request, profile, calibration, tuple(fitting), tuple(rejected), layouts=tuple(outcomes),
                unsearched=unsearched, stopped_at=stopped_at, pruned=tuple(pruned))


def _seconds(s: float) -> str:
    """Seconds to three significant figures, in ms or us below a second."""
    if s >= 1 or s == 0:
        return f"{s:.3g} s"
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"


def _split(layout: Layout) -> int:
    """Ranks one replica's model is split over."""
    return layout.tp * layout.pp * layout.cp


def _stage(layout: Layout) -> int:
    """The sharding stage as simplicity counts it: FSDP kept gathered from forward to backward (FSDP1's
    ``SHARD_GRAD_OP``) between ZeRO-1 and FSDP resharding, as ZeRO-2."""
    return 2 if layout.zero == 3 and layout.reshard_after_forward is False else layout.zero


def _how_split(layout: Layout) -> str:
    ranks = _split(layout)
    kept = " kept gathered" if _stage(layout) != layout.zero else ""
    return (f"{ranks} rank{'s' if ranks > 1 else ''} at ZeRO-{layout.zero}{kept}"
            + (f", experts over ep {layout.ep}" if layout.ep > 1 else ""))


def _rank(c: Candidate, fastest: float) -> tuple[bool, tuple[int, int, int], float, int]:
    """Sort key: the near-fastest first, simplest layout first among them (fewest ranks splitting a replica,
    lowest sharding stage, fewest expert-parallel ranks); then by speed and headroom."""
    near = c.tokens_per_s >= fastest * (1 - NEAR)
    simplicity = (_split(c.layout), _stage(c.layout), c.layout.ep) if near else (0, 0, 0)
    return (not near, simplicity, -c.tokens_per_s, c.required_bytes)


def _plan_layout(request: PlanRequest, profile: HardwareProfile, calibration: Calibration, screen: bool,
                 bar: Bar | None = None) -> tuple[LayoutOutcome, list[Candidate], float]:
    """Every candidate of one layout, and the lowest floor of those left out (infinite: none). A policy's
    micro-batches are tried from small to large and stop at the first that does not fit (memory grows with the
    micro-batch). ``screen``: first try the lightest candidate, micro-batch 1 under full recompute, and give up
    on the layout if even that does not fit. ``bar``: the search's fastest step so far; a candidate whose floor
    cannot tie with it is left out (headroom.core.planning.pruning), and each candidate that fits lowers it."""
    layout = request.layout
    if not micro_batches(request):
        if request.micro_batch is not None or request.accumulation is not None:
            raise ConfigError(f"the pinned micro-batch and accumulation do not split the per-rank batch "
                              f"{request.per_rank_batch} into a multiple of pp {layout.pp} micro-batches for the "
                              "interleaved schedule")
        raise ConfigError(f"no micro-batch splits the per-rank batch {request.per_rank_batch} into a multiple of "
                          f"pp {layout.pp} micro-batches for the interleaved schedule")
    evaluated: list[Candidate] = []
    screened = None
    if screen:
        screened = min(micro_batches(request)), request.recompute or RecomputePolicy("full")
        lightest = evaluate(request, profile, calibration, *screened)
        if lightest.rejection is not None:
            return LayoutOutcome(layout, None, lightest), [lightest], math.inf
        evaluated.append(lightest)
    skipped = math.inf
    for sub in recipe_requests(request, profile):
        first = 0 if sub is request else len(evaluated)  # this recipe's candidates (the screen's among them)
        for policy in policies_worth_trying(sub):
            for micro in micro_batches(sub):
                if sub is request and (micro, policy) == screened:
                    candidate = evaluated[0]  # the screen's
                elif bar is not None and bar.beyond(floor := candidate_floor_s(sub, profile, calibration, micro,
                                                                               policy)):
                    skipped = min(skipped, floor)
                    continue
                else:
                    candidate = evaluate(sub, profile, calibration, micro, policy)
                    evaluated.append(candidate)
                if bar is not None:
                    bar.saw(candidate)
                if candidate.rejection is not None and screen:
                    break
        if searches_block_recompute(sub):
            evaluated += _fewest_blocks(sub, profile, calibration, evaluated[first:], bar)
    fitting = [c for c in evaluated if c.rejection is None]
    if fitting:
        best = min(fitting, key=lambda c: (-c.tokens_per_s, c.required_bytes))  # one layout: speed decides
        return LayoutOutcome(layout, best, None), evaluated, skipped
    return LayoutOutcome(layout, None, min(evaluated, key=lambda c: c.required_bytes)), evaluated, skipped


BLOCK_SEARCHED_STACKS = ("megatron",)
"""Stacks whose search tries block-K: Megatron-LM's own dial (``--recompute-method block``). The reference stack
runs it when pinned; its search keeps the policies the agent's sweeps measure."""


def searches_block_recompute(request: PlanRequest) -> bool:
    """The search tries block-K for this request: no policy pinned, a stack that runs it, and a model whose
    recompute the ledger accounts for."""
    return (request.recompute is None and request.train.stack in BLOCK_SEARCHED_STACKS
            and request.train.unmodelled_policy(request.spec, RecomputePolicy("block", 1)) is None)


def _fewest_blocks(request: PlanRequest, profile: HardwareProfile, calibration: Calibration,
                   tried: list[Candidate], bar: Bar | None) -> list[Candidate]:
    """block-K at each micro-batch where keeping every block whole does not fit and full recompute does: the fewest
    blocks each pipeline chunk checkpoints for the step to fit, the fastest block-K (each further block reruns one
    more forward). A rank's memory falls by the same bytes with each further block (headroom.core.memory.ledger:
    one block's kept activations less its input, for each micro-batch in flight), so block-1 and block-2 give the K
    to check; past that estimate (the most loaded rank may change with K) the fewest K that fits is bisected. The
    candidates evaluated, fitting or not."""
    layers = max(request.train.chunk_layers(request.spec))  # block-K of a chunk's blocks or more is full recompute
    found: list[Candidate] = []
    if layers < 2:
        return found
    fastest = max((c.tokens_per_s for c in tried if c.rejection is None), default=0.0)  # the layout's, so far

    def tried_at(micro: int, kind: str) -> Candidate | None:
        return next((c for c in tried if c.estimate.config.micro_batch == micro
                     and c.estimate.config.recompute.kind == kind), None)

    def at(micro: int, k: int) -> Candidate:
        nonlocal fastest
        candidate = evaluate(request, profile, calibration, micro, RecomputePolicy("block", k))
        found.append(candidate)
        if bar is not None:
            bar.saw(candidate)
        if candidate.rejection is None:
            fastest = max(fastest, candidate.tokens_per_s)
        return candidate

    for micro in micro_batches(request):
        none, full = tried_at(micro, "none"), tried_at(micro, "full")
        if none is not None and none.rejection is None:
            continue  # nothing recomputed fits: faster than any block-K
        if full is not None and full.rejection is not None:
            break  # not even full recompute fits, nor will a larger micro-batch
        # Any block-K is slower than nothing recomputed at this micro-batch, whose step is known where it was
        # tried (if not, its floor, which the layout's floor already priced): a bound the layout's fastest, or the
        # search's, may already beat.
        bound = none.step_time_s if none is not None else candidate_floor_s(request, profile, calibration, micro,
                                                                             NO_RECOMPUTE)
        if (none is not None and none.tokens_per_s <= fastest) or (bar is not None and bar.beyond(bound)):
            continue
        # Each further block reruns one more forward: block-K is no faster than block-1 nor, past 2, block-2.
        one = at(micro, 1)
        if one.rejection is None or layers < 3 or not _could_win(one, fastest, bar):
            continue
        two = at(micro, 2)
        step = one.required_bytes - two.required_bytes
        if two.rejection is None or step <= 0 or not _could_win(two, fastest, bar):
            continue
        low, high = 2, layers  # block-2 does not fit; block-L is full recompute
        k = min(high - 1, max(low + 1, 2 + math.ceil((two.required_bytes - request.budget_bytes) / step)))
        probes = 0
        while low + 1 < high:
            if at(micro, k).rejection is None:
                high = k
            else:
                low = k
            probes += 1  # the estimate's neighbour first (where it is exact, that settles it), then halves
            k = (high - 1 if k == high else low + 1) if probes == 1 else (low + high) // 2
    return found


def _could_win(candidate: Candidate, fastest: float, bar: Bar | None) -> bool:
    """A candidate slower than this one may still be its layout's fastest and come within the search's near tie."""
    return candidate.tokens_per_s > fastest and not (bar is not None and bar.beyond(candidate.step_time_s))


def layout_floor_s(request: PlanRequest, profile: HardwareProfile, calibration: Calibration) -> float:
    """The lowest floor of any candidate of the request's layout (headroom.core.planning.pruning): without
    recompute, which only adds, at each recipe and micro-batch it tries; infinite where none divides the batch."""
    return min((candidate_floor_s(sub, profile, calibration, micro, NO_RECOMPUTE)
                for sub in recipe_requests(request, profile) for micro in micro_batches(sub)), default=math.inf)


def _cluster_dict(cluster: Cluster) -> dict[str, Any]:
    return {"gpus_per_node": cluster.gpus_per_node, "intra": cluster.intra.key, "inter": cluster.inter.key,
            "nics_per_node": cluster.nics_per_node or cluster.gpus_per_node,
            "intra_bytes_per_s": cluster.intra.bytes_per_s, "inter_bytes_per_s": cluster.inter.bytes_per_s,
            "source": "measured" if cluster.measured_inside else "datasheet", "assumed": cluster.assumed,
            "measured": None if cluster.measured is None else {
                "source": cluster.measured.source, "group_sizes": list(cluster.measured.group_sizes()),
                "across_nodes": None if cluster.measured.across_nodes is None else [
                    {"op": op, "ranks": ranks, "ranks_per_node": a_node}
                    for op, ranks, a_node in cluster.measured.across_nodes.runs()]}}


@collector_paused
def plan_to_dict(result: Plan, top: int | None = None) -> dict[str, Any]:
    """The JSON contract of ``headroom plan --json`` (README.md)."""
    from headroom.core.planning.dispatch_hint import dispatch_hint  # it evaluates candidates: imports this module

    budget = result.request.budget_bytes
    best = result.recommendation
    profile = result.profile
    band = result.band
    tokens = result.request.global_batch * result.request.seq_len
    return {
        "request": {
            "model": result.request.spec.name,
            "parameters": result.request.spec.parameters,
            "seq_len": result.request.seq_len,
            "global_batch": result.request.global_batch,
            "global_tokens": result.request.global_batch * result.request.seq_len,
            "budget_bytes": budget,
            "dp": result.request.dp,
            "zero": result.request.zero,
            "gpus": result.request.gpus,
            "pinned": sorted(result.request.pinned),
            "precision": SEARCHED if result.request.precision_search else result.request.precision,
            "fp8": "auto" if result.request.searches_recipes else result.request.train.fp8,
            "fp8_param_gather": result.request.train.fp8_param_gather,
            "first_last_bf16": result.request.train.first_last_bf16,
            "compile": result.request.train.compile,
            "optimizer": result.request.train.optimizer,
            "attention": result.request.train.attention,
            "stack": result.request.train.stack,
            "micro_batch": result.request.micro_batch,
            "recompute": None if result.request.recompute is None else str(result.request.recompute),
            "accumulation": result.request.accumulation,
            "train_tokens": result.request.train_tokens,
            "gpu_hour_price": result.request.gpu_hour_price,
        },
        "hardware": {
            "name": profile.name,
            "source": profile.source,
            "memory_bytes": profile.memory_bytes,
            "fragmentation": profile.fragmentation,
            "fragmentation_by_policy": dict(profile.fragmentation_by_policy),
            "context_reserve_bytes": result.request.context_reserve_bytes,
            "assumptions": list(profile.assumptions),
            "cluster": _cluster_dict(result.request.cluster_for(profile))
            if result.request.gpus or result.request.layout.world > 1 else None,
        },
        "calibration": result.calibration.to_dict(),
        "notes": [note for note in (budget_note(budget, profile), *result.request.notes())
                  if note],
        "recommendation": best.to_dict(budget) if best else None,
        "dispatch_hint": dispatch_hint(result),
        "pinned": _pinned_dict(result),
        "run": run.to_dict() if best and (run := result.request.run_cost(best)) else None,
        "candidates": [c.to_dict(budget) | {"tied_with_fastest": i < band} for i, c in enumerate(result.candidates[:top])],
        "rejected": [c.to_dict(budget) for c in result.rejected],
        "layouts": [
            {"layout": layout_dict(o.layout), "fits": o.fits,
             "tokens_per_s": o.best.tokens_per_s if o.best else None,
             "required_bytes": (o.best or o.closest).required_bytes if (o.best or o.closest) else None,
             "why": o.why_lost(best)}
            for o in result.layouts
        ],
        "pruned": [
            {"layout": layout_dict(p.layout), "fits": p.fits, "floor_step_s": p.floor_s,
             "max_tokens_per_s": p.max_tokens_per_s(tokens), "why": p.why_left_out(tokens, best.tokens_per_s)}
            for p in result.pruned
        ] if best else [],
        "unsearched": {"layouts": result.unsearched, "stopped_at": result.stopped_at} if result.unsearched else None,
        "advice": list(result.advice),
        "forced_by": result.forced_by(),
    }


def _pinned_dict(result: Plan) -> dict[str, Any] | None:
    """``pinned`` of the JSON: the configuration a fully pinned request asked about, whether it fits and by how
    much it misses, and what a run of it would cost."""
    pinned = result.pinned
    if pinned is None:
        return None
    budget = result.request.budget_bytes
    run = result.request.run_cost(pinned)
    return pinned.to_dict(budget) | {"fits": pinned.rejection is None,
                                     "over_budget_bytes": max(0, pinned.required_bytes - budget),
                                     "run": run.to_dict() if run else None}
