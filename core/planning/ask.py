"""What a user asks a plan for, and the one function that turns it into the planner's `PlanRequest`.

``headroom plan`` parses its flags into a `PlanAsk`, the dashboard's Plan page its inputs; both call
`PlanAsk.request`. Every default a plan takes for a setting the user left out is decided here, once:

- the budget: 80 GB per GPU, or all of a smaller card (`default_budget`); a card that holds more is
  planned at 80 GB and the plan says so (`budget_share`);
- the cluster: a node of ``gpus_per_node`` of the card, ``intra_node`` or the card's own link inside the
  node and, between nodes, ``interconnect`` or the card generation's network
  (headroom.core.specs.interconnect), built only when the plan spans more than one GPU;
- the layout: one GPU (`ONE_GPU`) for every axis left free without a GPU count; with one, the axes in
  ``pinned`` are kept and the others searched;
- the configuration: the planner's to choose (micro-batch, accumulation, checkpoint policy) unless pinned.

tests/test_plan_ask.py holds the command and the page to it on every datasheet device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from headroom.core.planning.planner import PlanRequest, default_budget
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.recompute import RecomputePolicy
from headroom.core.timing.step import HardwareProfile

DEFAULT_SEQ_LEN = 2048
"""Tokens per sequence when the user gives none (``--seq-len``; the page's sequence length)."""
DEFAULT_GPUS_PER_NODE = 8
"""GPUs a node: what HGX and DGX boxes hold."""
ONE_GPU: dict[str, object] = {"tp": 1, "sp": False, "pp": 1, "schedule": "1f1b", "virtual_stages": 1, "cp": 1,
                              "dp": 1, "zero": 0}
"""The layout's axes without a GPU count: one GPU, sequence parallelism off, no pipeline."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanAsk:
    """A plan's question, parsed: what the user gave, None where they left a setting to its default."""

    global_batch: int
    """Sequences per optimizer step, across all data-parallel ranks."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(seq_len=DEFAULT_SEQ_LEN))
    """Sequence, precision, optimizer, attention, dropout, stack and layout (the planner chooses the
    micro-batch and the policy). Its layout, without ``gpus``: the one layout planned (the front end fills
    free axes from `ONE_GPU`); with ``gpus``: the values of the ``pinned`` axes
    (headroom.core.planning.layout_search.pinned_layout)."""
    budget_bytes: int | None = None
    """Per GPU; None: `default_budget` of the hardware."""
    pinned: frozenset[str] = frozenset()
    """Layout axes kept by a search; ignored without ``gpus``."""
    gpus: int | None = None
    """Search every layout of this many GPUs; None: plan ``train.layout``."""
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    interconnect: str | None = None
    """headroom.core.specs.interconnect key of the link between nodes; None: the card generation's network."""
    intra_node: str | None = None
    """headroom.core.specs.interconnect key of the link between GPUs of a node; None: the card's own."""
    allow_offload: bool = False
    micro_batch: int | None = None
    accumulation: int | None = None
    recompute: RecomputePolicy | None = None
    train_tokens: int | None = None
    gpu_hour_price: float | None = None
    fp8_search: bool = False
    """``--fp8 auto``: try each FP8 recipe beside ``train.fp8`` (PlanRequest.fp8_search)."""
    precision_search: bool = False
    """``--precision auto``: try each precision recipe the device computes in, with and without each FP8 recipe
    (PlanRequest.precision_search)."""

    def request(self, spec: ModelSpec, profile: HardwareProfile) -> PlanRequest:
        """The planner's request for ``spec`` on ``profile``'s hardware; ConfigError names an invalid setting."""
        search = self.gpus is not None
        spans_gpus = search or self.train.layout.world > 1
        return PlanRequest(
            spec=spec, train=self.train, global_batch=self.global_batch,
            budget_bytes=default_budget(profile) if self.budget_bytes is None else self.budget_bytes,
            allow_offload=self.allow_offload, gpus=self.gpus, pinned=self.pinned if search else frozenset(),
            cluster=profile.cluster(self.gpus_per_node, self.interconnect, self.intra_node) if spans_gpus else None,
            micro_batch=self.micro_batch, accumulation=self.accumulation, recompute=self.recompute,
            train_tokens=self.train_tokens, gpu_hour_price=self.gpu_hour_price, fp8_search=self.fp8_search,
            precision_search=self.precision_search,
        )
