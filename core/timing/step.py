"""Step time of a training configuration on one device, from its measurements or its datasheet.

A `HardwareProfile` holds what the time model needs: dense peaks, the efficiency a large GEMM reaches and the
SMs its tiles spread over, the attention rate, the achieved memory bandwidth, and the allocator's
reserved/allocated ratio. `datasheet_profile` fills it from headroom.core.specs.hardware and the cited curves of
headroom.core.timing.device_curves; headroom.core.measured.measurements fills it from a box's own benchmark results.

The model, per micro-batch (``step_time``), from the ops the rank runs (headroom.core.timing.step_ops, priced by headroom.core.timing.op_time):

- forward: every op of every block of the rank, and its embedding or head and loss: GEMMs at the efficiency
  their shape reaches, attention at the attention rate, memory-bound ops by their bytes;
- backward: each GEMM's two gradient products at their shapes, attention ``attention_backward_ratio`` x
  forward, memory-bound ops twice forward's bytes;
- recompute: what the policy runs again: whole blocks (full, every-K, block-K's first K a chunk; less the
  FLOPs torch's early stop skips), the attention core (selective), the memory-bound ops and every second matmul under torchtitan
  (op-selective);
- offload: saved bytes to the host and back over ``host_bytes_per_s``;
- FSDP (ZeRO-3): its copies into and out of the all-gather's and the reduce-scatter's buffers, forward and
  backward, as memory-bound traffic;
- host: the ops' dispatch (headroom.core.timing.op_time's host constants, and the selective-checkpoint context's per-op cost
  under op-selective). On a GPU the host runs ahead of the device, so a micro-batch takes the longer of the
  two; on a CPU the two are one and add up;

per optimizer step:

- accumulation: each micro-batch after the first adds its gradients into ``.grad`` (read both, write one);
- optimizer: a memory-bound pass reading parameters, gradients, master copy and state, and writing all but
  the gradients; under Transformer Engine's FP8 recipes, with the blocks' weights cast to fp8 once a step;
- communication (headroom.core.timing.comm): tensor- and pipeline-parallel traffic in full; data-parallel and FSDP traffic
  hidden behind the passes it runs in (`_dp_windows`: FSDP's forward gathers behind the forwards that gather,
  gradient reductions and backward gathers behind the backwards that run them, the last alone where
  gradients are reduced once per step), context-parallel traffic behind the attention (passed on beside
  each chunk; an all-gather beside the first chunk only), and with
  ``Layout.tp_overlap`` the blocks' tensor-parallel collectives behind the blocks' GEMMs, with
  ``Layout.ep_overlap`` the experts' all-to-alls behind the other micro-batches' compute; what is left over
  is exposed and counted;
- bubble: what the rank waits for a pipeline to fill and drain and for slower stages: the pipeline's m t_max +
  (sum t - t_max) / v over every stage's micro-batch time t (stages differ in blocks, embedding and head), less
  the rank's own m micro-batches; alike stages idle (pp - 1) / v micro-batch times (`_bubble_s`).

Per rank, the blocks are the rank's stage's (headroom.core.specs.stages) at the rank's shapes (tensor, sequence
and context parallelism split them), with the embedding on the first stage and the head and loss on the last.
No factor multiplies the sum: docs/time-model.md lists every constant and its source.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import Estimate
from headroom.core.memory.flops import StepFlops, checkpointed_block_flops, step_flops
from headroom.core.memory.pipeline import pipeline_seconds
from headroom.core.memory.static import (
    fp8_rank_blocks,
    te_block_shapes,
    te_block_weights,
)
from headroom.core.memory.trace import TracedOp
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.float8 import Float8Recipe, mx_scale_bytes
from headroom.core.specs.hardware import HardwareSpec
from headroom.core.specs.interconnect import Cluster, cluster_for
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.precision import DTYPE_BYTES
from headroom.core.specs.recompute import RecomputePolicy
from headroom.core.specs.schedule_order import zbv_chunks
from headroom.core.specs.stack import get_stack
from headroom.core.timing.collective_curves import CollectiveCurves
from headroom.core.timing.comm import (
    DEFAULT_COLLECTIVE_EFFICIENCY,
    CommTerm,
    Overlap,
    exposed_seconds,
    overlaps,
    step_communication,
)
from headroom.core.timing.device_curves import CURVES, FP8_OVER_BF16
from headroom.core.timing.op_time import (
    KERNEL_GAP_S,
    DeviceRates,
    HostCosts,
    OpsTime,
    anchor_efficiency,
    memory_s,
    ops_time,
)
from headroom.core.timing.schedule_replay import zbv_makespan
from headroom.core.timing.step_ops import ForwardOps, forward_ops, ops_config

# Defaults used when a box has no measurement of its own and its datasheet row no curve (stated in every plan).
DEFAULT_MATMUL_EFFICIENCY = 0.75
"""Large bf16 GEMMs reach 75-80% of the dense peak on Hopper (the H200 reference run: 746-776 of 989 TFLOP/s)."""
DEFAULT_ATTENTION_EFFICIENCY = 0.50
"""FlashAttention-2 forward reaches 50-73% of peak on A100/H100 (Dao 2023, Fig. 4-6); the low end."""
DEFAULT_BANDWIDTH_EFFICIENCY = 0.85
"""Large copies reach ~85-90% of HBM bandwidth (H200 here: ~4.2 of 4.8 TB/s)."""
DEFAULT_FRAGMENTATION = 1.10
"""Reserved / allocated of PyTorch's caching allocator when the box measured none."""
DEFAULT_HOST_BYTES_PER_S = 48e9
"""Offload's device-to-host and host-to-device copies: PCIe Gen5 x16 (64 GB/s each way) as the H200 reference
run's two offload steps achieved it (46.6 and 49.6 GB/s; benchmarks/fit_time_constants.py)."""
ATTENTION_BACKWARD_RATIO = 2.5
"""FlashAttention-2's backward runs five GEMMs against forward's two (Dao 2023): 2.5x forward's time."""
PRICED_KEPT = 4096
"""Ops tuples a profile keeps the price of (`HardwareProfile.price`): more than one search's distinct blocks."""


@dataclass(frozen=True, slots=True)
class MatmulPoint:
    flops: float
    """2 m n k of the measured product."""
    flop_per_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class HardwareProfile:
    name: str
    source: Literal["measured", "datasheet"]
    memory_bytes: int
    """Device memory, bytes (the budget's natural default)."""
    peak_flop_per_s: dict[str, float]
    """Dense datasheet peaks by dtype (for MFU); empty when the device has no datasheet row."""
    matmul: dict[str, tuple[MatmulPoint, ...]]
    """Measured matmul throughput by dtype, sorted by FLOPs; or one datasheet point per dtype."""
    attention_flop_per_s: float
    hbm_bytes_per_s: float
    fragmentation: float = DEFAULT_FRAGMENTATION
    """Peak reserved over peak allocated: the box's median, else the default."""
    fragmentation_by_policy: dict[str, float] = field(default_factory=dict)
    """The same for each checkpoint policy kind the box measured (headroom.core.measured.measurements.fragmentation_by_policy)."""
    attention_backward_ratio: float = ATTENTION_BACKWARD_RATIO
    host_bytes_per_s: float = DEFAULT_HOST_BYTES_PER_S
    matmul_efficiency: float = DEFAULT_MATMUL_EFFICIENCY
    """A large GEMM's rate over the dense peak: the shape model's anchor (headroom.core.timing.op_time)."""
    sms: int = 0
    """Streaming multiprocessors, for wave quantization; 0: unknown (no quantization)."""
    kernel_gap_s: float = KERNEL_GAP_S
    """What each kernel adds to its work (headroom.core.timing.op_time)."""
    host: HostCosts = HostCosts()
    """What the host pays to dispatch ops (headroom.core.timing.op_time)."""
    dtype_efficiency: dict[str, float] = field(default_factory=dict)
    """The shape model's anchor for dtypes whose large GEMMs reach another fraction of their peak (fp8)."""
    dtype_sources: dict[str, str] = field(default_factory=dict)
    """Where each of ``dtype_efficiency`` comes from: a plan that runs that dtype's GEMMs says it."""
    mx_formats: bool = False
    """The tensor cores run MXFP8 (headroom.core.specs.hardware.HardwareSpec.mx_formats)."""
    device: str = "cuda"
    """The device whose saving rules the ledger applies (headroom.core.specs.devices)."""
    assumptions: tuple[str, ...] = field(default=())
    """Which figures are defaults rather than measurements."""
    collectives: CollectiveCurves | None = None
    """Collective times measured over the box's devices (headroom.core.timing.collective_curves); None: datasheet links."""
    _priced: dict[int, tuple[tuple[TracedOp, ...], OpsTime]] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    """`price`'s answers by the ops tuple's identity, the tuple kept so that its identity stays its own: the blocks
    of a layout search's layouts share their ops (headroom.core.timing.step_ops caches them), so each is priced
    once a search, not once a candidate. A copy of the profile (``dataclasses.replace``) starts empty."""
    _floors: dict[tuple[object, ...], _FloorParts] = field(default_factory=dict, init=False, repr=False,
                                                           compare=False)
    """`step_floor_s`'s stage parts by what they depend on (the ops' configuration and the policy)."""

    def cluster(self, gpus_per_node: int = 8, inter: str | None = None, intra: str | None = None) -> Cluster:
        """Nodes of this device: its datasheet links (headroom.core.specs.interconnect.cluster_for; between nodes ``inter``, else
        its generation's network; inside one ``intra``, else its own), with the measured collectives inside a node
        where the box recorded them."""
        return cluster_for(self.name, gpus_per_node, inter, self.collectives, intra)

    @property
    def rates(self) -> DeviceRates:
        """What headroom.core.timing.op_time prices ops with."""
        return DeviceRates(self.peak_flop_per_s, self.matmul_efficiency, self.sms, self.attention_flop_per_s,
                           self.attention_backward_ratio, self.hbm_bytes_per_s, self.kernel_gap_s,
                           self.dtype_efficiency)

    def fragmentation_text(self) -> str:
        """The fragmentation a plan margins by, as text: "1.05", and each policy's where the box measured it."""
        if not self.fragmentation_by_policy:
            return f"{self.fragmentation:.2f}"
        kinds = ", ".join(f"{'every-K' if kind == 'every' else kind} {ratio:.2f}"
                          for kind, ratio in self.fragmentation_by_policy.items())
        return f"{self.fragmentation:.2f} (by checkpoint policy: {kinds})"

    def fragmentation_for(self, policy: RecomputePolicy) -> float:
        """The allocator's fragmentation under ``policy``: its kind's measured ratio, else the box's median."""
        return self.fragmentation_by_policy.get(policy.kind, self.fragmentation)

    def price(self, ops: tuple[TracedOp, ...]) -> OpsTime:
        """Device time of ``ops`` (headroom.core.timing.op_time): GEMMs by their shape, or on a device without a datasheet peak
        (a CPU) at the measured rate of their size."""
        known = self._priced.get(id(ops))
        if known is not None and known[0] is ops:
            return known[1]
        if len(self._priced) >= PRICED_KEPT:
            self._priced.clear()
        timed = ops_time(self.rates, ops, None if self.peak_flop_per_s else self.matmul_flop_per_s)
        self._priced[id(ops)] = ops, timed
        return timed

    @property
    def host_runs_ahead(self) -> bool:
        """The host queues kernels while the device runs earlier ones (a GPU), rather than running them itself."""
        return self.device != "cpu"

    def matmul_flop_per_s(self, dtype: str, flops: float) -> float:
        """Throughput of a GEMM of ``flops``: log-linear interpolation over the measured sizes, clamped."""
        points = self.matmul.get(dtype) or self.matmul.get("bf16") or next(iter(self.matmul.values()))
        sizes = [p.flops for p in points]
        i = bisect.bisect_left(sizes, flops)
        if i == 0:
            return points[0].flop_per_s
        if i == len(points):
            return points[-1].flop_per_s
        lo, hi = points[i - 1], points[i]
        t = (math.log(flops) - math.log(lo.flops)) / (math.log(hi.flops) - math.log(lo.flops))
        return lo.flop_per_s + t * (hi.flop_per_s - lo.flop_per_s)


def runs_recipe(profile: HardwareProfile, recipe: Float8Recipe) -> bool:
    """The device has the tensor cores an FP8 recipe's GEMMs need: fp8's, and for MXFP8 Blackwell's."""
    return "fp8" in profile.peak_flop_per_s and (profile.mx_formats or not recipe.block)


def datasheet_profile(hw: HardwareSpec) -> HardwareProfile:
    """A profile from the datasheet and the device family's cited curves (headroom.core.timing.device_curves)."""
    curves = CURVES.get(hw.key)
    if curves is None:
        matmul, sms, attention, bandwidth = DEFAULT_MATMUL_EFFICIENCY, 0, DEFAULT_ATTENTION_EFFICIENCY, \
            DEFAULT_BANDWIDTH_EFFICIENCY
        sources = ("assumed",) * 3
    else:
        sms = curves.sms
        matmul = anchor_efficiency(curves.matmul_tflop_per_s * 1e12, hw.peak("bf16"), *curves.matmul_shape, sms)
        attention, bandwidth = curves.attention_efficiency, curves.bandwidth_efficiency
        sources = (curves.matmul_source, curves.attention_source, curves.bandwidth_source)
    fp8 = {}
    if "fp8" in hw.peak_flop_per_s:
        fp8["fp8"], fp8_source = matmul * FP8_OVER_BF16, "assumed: the H200's fp8-to-bf16 GEMM efficiency ratio"
        if curves is not None and curves.fp8_matmul_tflop_per_s is not None:
            fp8["fp8"] = anchor_efficiency(curves.fp8_matmul_tflop_per_s * 1e12, hw.peak("fp8"),
                                           *curves.matmul_shape, sms)
            fp8_source = curves.fp8_matmul_source
    return HardwareProfile(
        name=hw.key,
        source="datasheet",
        memory_bytes=hw.memory_bytes,
        peak_flop_per_s=dict(hw.peak_flop_per_s),
        matmul={d: (MatmulPoint(1.0, p * matmul),) for d, p in hw.peak_flop_per_s.items()},
        # Counted in full, a causal kernel's rate is twice what it executes.
        attention_flop_per_s=2 * hw.peak("bf16") * attention,
        hbm_bytes_per_s=hw.hbm_bytes_per_s * bandwidth,
        matmul_efficiency=matmul,
        dtype_efficiency=fp8,
        dtype_sources={"fp8": fp8_source} if fp8 else {},
        mx_formats=hw.mx_formats,
        sms=sms,
        assumptions=(
            f"GEMMs by shape from one large bf16 GEMM ({sources[0]})",
            f"causal attention at {attention:.0%} of the bf16 peak ({sources[1]})",
            f"memory-bound work at {bandwidth:.0%} of datasheet bandwidth ({sources[2]})",
            f"allocator fragmentation {DEFAULT_FRAGMENTATION:.2f}x",
            f"collectives at {DEFAULT_COLLECTIVE_EFFICIENCY:.0%} of link bandwidth",
        ),
    )


@dataclass(frozen=True, slots=True)
class StepTime:
    """Seconds of one optimizer step on one rank, by term."""

    forward_s: float
    """Device time of one micro-batch's forward (and of each term below, per micro-batch)."""
    backward_s: float
    recompute_s: float
    offload_s: float
    accumulation_s: float
    """Per step, as every term below."""
    optimizer_s: float
    micro_batches: int
    communication_s: float = 0.0
    """Communication left exposed after overlap (per step)."""
    bubble_s: float = 0.0
    """Pipeline idle time (per step)."""
    communication: tuple[CommTerm, ...] = ()
    """Every collective of the step, before overlap."""
    overlaps: tuple[Overlap, ...] = ()
    """Each axis's overlappable collectives against the compute that hides them: what is exposed, and the
    slack of what is hidden (headroom.core.timing.comm.Overlap)."""
    host_s: float = 0.0
    """Host time to dispatch one micro-batch's ops (forward, backward and recompute)."""
    host_runs_ahead: bool = True
    """The host queues kernels ahead of the device (a GPU): a micro-batch takes the longer of the two. False (a
    CPU): the host runs them, and the two add up."""
    launches: int = 0
    """Kernels one micro-batch launches (forward, recompute and backward)."""
    weight_grad_s: float = 0.0
    """The part of ``backward_s`` that makes the weights' gradients, which a zero-bubble schedule runs apart."""

    @property
    def waiting_s(self) -> float:
        """Seconds the rank waits on others: exposed communication and, in a pipeline, its bubble. What
        a profile of the rank measures as communication (headroom.agent.comm_time): a pipeline stage waiting for
        its neighbour's activations cannot tell the link's time from the neighbour's compute."""
        return self.communication_s + self.bubble_s

    @property
    def device_s(self) -> float:
        """Device time of one micro-batch: forward, backward, recompute and offload."""
        return self.forward_s + self.backward_s + self.recompute_s + self.offload_s

    @property
    def host_wait_s(self) -> float:
        """What the host adds to a micro-batch: the time the device waits for kernels (GPU), or the dispatch
        itself (CPU)."""
        return max(0.0, self.host_s - self.device_s) if self.host_runs_ahead else self.host_s

    @property
    def host_bound(self) -> bool:
        """The host, not the device, sets the micro-batch's pace."""
        return self.host_runs_ahead and self.host_s > self.device_s

    @property
    def per_micro_batch_s(self) -> float:
        return self.device_s + self.host_wait_s

    @property
    def step_device_s(self) -> float:
        """Device time of the step's micro-batches: what ``plan`` reports as compute."""
        return self.micro_batches * self.device_s

    @property
    def step_host_s(self) -> float:
        """Host time to dispatch the step's micro-batches."""
        return self.micro_batches * self.host_s

    @property
    def total_s(self) -> float:
        return (self.micro_batches * self.per_micro_batch_s + self.accumulation_s + self.optimizer_s
                + self.communication_s + self.bubble_s)

    def by_term(self) -> dict[str, float]:
        """Seconds per step by term; they add up to ``total_s``."""
        m = self.micro_batches
        return {"forward": self.forward_s * m, "backward": self.backward_s * m, "recompute": self.recompute_s * m,
                "offload": self.offload_s * m, "host": self.host_wait_s * m, "accumulation": self.accumulation_s,
                "optimizer": self.optimizer_s, "communication": self.communication_s, "bubble": self.bubble_s}


def step_time(estimate: Estimate, profile: HardwareProfile, accumulation_steps: int,
              cluster: Cluster | None = None) -> StepTime:
    """Predicted time of one optimizer step (``accumulation_steps`` micro-batches) on one rank.

    ``cluster``: the interconnect, needed when the layout spans more than one GPU.
    """
    spec, cfg = estimate.spec, estimate.config
    if cfg.float8 is not None and profile.peak_flop_per_s and not runs_recipe(profile, cfg.float8):
        needs = "MXFP8 tensor cores (Blackwell)" if cfg.float8.block else \
            "fp8 tensor cores (fp8 GEMMs need Hopper, Ada, Blackwell or MI300)"
        raise ConfigError(f"--fp8 {cfg.fp8} on {profile.name}: it has no {needs}; use --fp8 off")
    layout = cfg.layout
    rank = estimate.rank
    price = profile.price
    mine, blocks = _micro_batch(estimate, profile, price, rank.layers, rank.first, rank.last)

    static = estimate.static
    accumulation_s = (accumulation_steps - 1) * 3 * static.gradients / profile.hbm_bytes_per_s
    state = static.optimizer_states + static.master_weights
    optimizer_s = (2 * static.parameters + static.gradients + 2 * state) / profile.hbm_bytes_per_s \
        + _fp8_weight_cast_s(estimate, profile)

    m = accumulation_steps
    compute = replace(mine, accumulation_s=accumulation_s, optimizer_s=optimizer_s, micro_batches=m)
    bubble_s = _bubble_s(estimate, profile, price, compute)
    if layout.world == 1:
        return replace(compute, bubble_s=bubble_s)
    if cluster is None:
        raise ConfigError(f"a layout over {layout.world} GPUs needs an interconnect to time its communication")
    terms = step_communication(spec, cfg, m, cluster)
    windows = _dp_windows(cfg, m, compute.forward_s, compute.backward_s + compute.recompute_s) | {
        ("cp", "attention"): m * (blocks.attention_s + blocks.backward_attention_s),
        ("cp", "first chunk"): m * (blocks.attention_s + blocks.backward_attention_s) / cfg.layout.cp,
        ("tp", "matmuls"): m * _matmuls_s(estimate, blocks),
        ("ep", "other micro-batch"): (m - 1) * (compute.forward_s + compute.backward_s + compute.recompute_s)}
    return replace(compute, communication_s=exposed_seconds(terms, windows), bubble_s=bubble_s, communication=terms,
                   overlaps=overlaps(terms, windows))


Price = Callable[[tuple[TracedOp, ...]], OpsTime]


def step_floor_s(spec: ModelSpec, config: TrainConfig, profile: HardwareProfile, accumulation_steps: int) -> float:
    """A floor under `step_time`'s ``total_s`` for ``config`` over ``accumulation_steps`` micro-batches, from its
    ops alone (no ledger, no collective): each pipeline stage's forward, backward and recompute per micro-batch
    (`_micro_batch`'s terms, priced alike), through the schedule: the pipeline's time (`_bubble_s`), or under ZB-V
    the busiest rank's two chunks (its replay cannot end sooner). A stage's time is its blocks' and its ends'
    (`_FloorParts`), kept on the profile: the layouts of a search share them. A model whose blocks differ in kind
    (dense and experts') is planned without a pipeline (TrainConfig.check_model): its one stage is priced whole.

    What it leaves out is never negative (offload, FSDP's copies, the host's wait, accumulation, the optimizer,
    exposed communication, any stage's wait but the pipeline's), and what a block runs does not depend on which
    rank is the estimate's or on what the policy keeps (headroom.core.timing.step_ops), so no estimate of the
    configuration is faster: headroom.core.planning.planner leaves out a candidate whose floor is slower than
    the fastest found by more than a near tie."""
    key = (spec, ops_config(config), config.recompute)
    parts = profile._floors.get(key)
    if parts is None:
        if len(profile._floors) >= PRICED_KEPT:
            profile._floors.clear()
        parts = profile._floors[key] = _FloorParts(spec, config, profile)
    layout, m = config.layout, accumulation_steps
    if layout.schedule == "zbv" and layout.pp > 1:
        chunks = config.chunk_layers(spec)
        timed = [parts.stage_s(n, i == 0, i == len(chunks) - 1) for i, n in enumerate(chunks)]
        return m * max(sum(timed[c] for c in zbv_chunks(layout.pp, rank)) for rank in range(layout.pp))
    stages = config.stage_layers(spec)
    timed = [parts.stage_s(n, i == 0, i == len(stages) - 1) for i, n in enumerate(stages)]
    return pipeline_seconds(tuple(timed), m, layout.virtual_stages)


class _FloorParts:
    """One micro-batch's forward, backward and recompute of a configuration's stages, as `_micro_batch` prices
    them: one block's and each end's (the embedding, the head and loss), or where blocks differ in kind (experts',
    bf16 end blocks under an FP8 recipe) each stage's whole (``block_s`` None)."""

    __slots__ = ("_config", "_ends", "_flops", "_profile", "_spec", "block_s")

    def __init__(self, spec: ModelSpec, config: TrainConfig, profile: HardwareProfile) -> None:
        self._spec, self._config, self._profile = spec, config, profile
        self._flops = step_flops(spec, config, profile.device)
        self._ends: dict[tuple[int, bool, bool], float] = {}
        # block-K recomputes a stage's first K blocks, not a share of each: a stage is not layers x one block.
        uniform = not (0 < spec.moe_layers < spec.n_layers or config.first_last_bf16 or config.recompute.kind == "block")
        self.block_s = self._direct_s(1, False, False) if uniform else None

    def stage_s(self, layers: int, first: bool, last: bool) -> float:
        if self.block_s is None:
            return self._once(layers, first, last)
        return layers * self.block_s + self._once(0, first, last)

    def _once(self, layers: int, first: bool, last: bool) -> float:
        key = (layers, first, last)
        if key not in self._ends:
            self._ends[key] = self._direct_s(*key)
        return self._ends[key]

    def _direct_s(self, layers: int, first: bool, last: bool) -> float:
        price = self._profile.price
        ops = forward_ops(self._spec, self._config, self._profile.device, layers, first=first, last=last)
        blocks = sum((price(block).scaled(n) for block, n in ops.blocks), OpsTime())
        head = price(ops.head)
        recomputed, _ = _recompute(self._spec, self._config, self._flops, blocks, ops, price)
        return blocks.forward_s + blocks.backward_s + head.forward_s + head.backward_s + recomputed


def _matmuls_s(estimate: Estimate, blocks: OpsTime) -> float:
    """The blocks' GEMMs in one micro-batch: forward, backward's two products, and the share of forward's the
    policy runs again (headroom.core.memory.flops: recompute FLOPs over the blocks' forward FLOPs)."""
    flops = estimate.flops
    again = min(1.0, flops.recompute / flops.blocks_forward) if flops.blocks_forward else 0.0
    return blocks.gemm_s * (1 + again) + blocks.backward_gemm_s


def _micro_batch(estimate: Estimate, profile: HardwareProfile, price: Price, layers: int, first: bool,
                 last: bool) -> tuple[StepTime, OpsTime]:
    """One micro-batch on a pipeline stage of ``layers`` blocks (the embedding on the ``first``, the head and
    loss on the ``last``), as a StepTime of one micro-batch with no per-step terms, and its blocks' device time.
    Offload and FSDP's copies are the estimate's rank's, in proportion to the blocks where the stage is
    another."""
    spec, cfg, rank = estimate.spec, estimate.config, estimate.rank
    ops = forward_ops(spec, cfg, profile.device, layers, first=first, last=last)
    blocks = sum((price(block).scaled(n) for block, n in ops.blocks), OpsTime())
    head = price(ops.head)
    recomputed, rerun_ops = _recompute(spec, cfg, estimate.flops, blocks, ops, price)
    share = 1.0 if layers == rank.layers else layers / rank.layers if rank.layers else 0.0
    offload_s = share * 2 * estimate.ledger.host_bytes / profile.host_bytes_per_s
    forward_copy_s, backward_copy_s = _fsdp_copy_s(estimate, profile)
    backward_kernels = blocks.backward_launches + head.backward_launches
    time = StepTime(blocks.forward_s + head.forward_s + share * forward_copy_s,
                    blocks.backward_s + head.backward_s + share * backward_copy_s, recomputed, offload_s, 0.0, 0.0, 1,
                    host_s=_host_s(profile.host, cfg, ops.launches, rerun_ops, backward_kernels),
                    host_runs_ahead=profile.host_runs_ahead, launches=ops.launches + rerun_ops + backward_kernels,
                    weight_grad_s=blocks.weight_gemm_s + head.weight_gemm_s)
    return time, blocks


def _bubble_s(estimate: Estimate, profile: HardwareProfile, price: Price, mine: StepTime) -> float:
    """What the rank waits in a step for the pipeline to fill and drain and for slower stages: the pipeline's
    time (headroom.core.memory.pipeline.pipeline_seconds over every stage's micro-batch) less the rank's own
    micro-batches. Alike stages: (pp - 1) / v micro-batch times (Narayanan et al. 2021, Sec. 2.2).

    Another stage's micro-batch is this one's with its own blocks and ends: every term of `_micro_batch` but the
    embedding's and the head's grows with the blocks, so per block it is this rank's less its ends, over its
    blocks (a rank of no blocks times each stage whole)."""
    layout, rank = estimate.config.layout, estimate.rank
    if layout.pp == 1:
        return 0.0
    if layout.schedule == "zbv":
        return _replayed_bubble_s(estimate, profile, price, mine)
    mine_ends = _ends(estimate, profile, price, rank.first, rank.last)
    seconds: dict[tuple[int, bool, bool], float] = {(rank.layers, rank.first, rank.last): mine.per_micro_batch_s}

    def stage_s(layers: int, first: bool, last: bool) -> float:
        if not rank.layers or estimate.config.first_last_bf16:  # bf16 blocks on the end stages: each its own
            return _micro_batch(estimate, profile, price, layers, first, last)[0].per_micro_batch_s
        device, host = _ends(estimate, profile, price, first, last)
        share = layers / rank.layers
        return StepTime(device + share * (mine.device_s - mine_ends[0]), 0.0, 0.0, 0.0, 0.0, 0.0, 1,
                        host_s=host + share * (mine.host_s - mine_ends[1]),
                        host_runs_ahead=profile.host_runs_ahead).per_micro_batch_s

    stages = []
    for stage, n in enumerate(estimate.config.stage_layers(estimate.spec)):
        key = (n, stage == 0, stage == layout.pp - 1)
        if key not in seconds:
            seconds[key] = stage_s(*key)
        stages.append(seconds[key])
    m = mine.micro_batches
    return pipeline_seconds(tuple(stages), m, layout.virtual_stages) - m * mine.per_micro_batch_s


def _replayed_bubble_s(estimate: Estimate, profile: HardwareProfile, price: Price, mine: StepTime) -> float:
    """The zero-bubble schedule's wait: its table (headroom.core.specs.schedule_order) replayed with each chunk's
    forward, input gradient (backward but the weights' GEMMs, with recompute and offload) and weight gradient,
    timed with the chunk's own blocks, embedding and head (headroom.core.timing.schedule_replay.zbv_makespan);
    less the rank's own micro-batches. A host-bound chunk's actions stretch as its micro-batch does."""
    layout, m = estimate.config.layout, mine.micro_batches
    chunks = estimate.config.chunk_layers(estimate.spec)
    timed: dict[tuple[int, bool, bool], dict[str, float]] = {}

    def chunk_s(chunk: int) -> dict[str, float]:
        key = (chunks[chunk], chunk == 0, chunk == len(chunks) - 1)
        if key not in timed:
            t = _micro_batch(estimate, profile, price, *key)[0]
            stretch = t.per_micro_batch_s / t.device_s if t.device_s else 1.0
            timed[key] = {"F": t.forward_s * stretch, "W": t.weight_grad_s * stretch,
                          "I": (t.backward_s - t.weight_grad_s + t.recompute_s + t.offload_s) * stretch}
        return timed[key]

    return max(0.0, zbv_makespan(layout.pp, m, lambda kind, chunk: chunk_s(chunk)[kind]) - m * mine.per_micro_batch_s)


def _ends(estimate: Estimate, profile: HardwareProfile, price: Price, first: bool, last: bool) -> tuple[float, float]:
    """Device and host seconds of a stage's embedding (``first``) and final norm, head and loss (``last``) in
    one micro-batch, as `_micro_batch` counts them."""
    head = forward_ops(estimate.spec, estimate.config, profile.device, 0, first=first, last=last).head
    if not head:
        return 0.0, 0.0
    timed = price(head)
    return (timed.forward_s + timed.backward_s,
            _host_s(profile.host, estimate.config, len(head), 0, timed.backward_launches))


def _recompute(spec: ModelSpec, config: TrainConfig, flops: StepFlops, blocks: OpsTime, ops: ForwardOps,
               price: Price) -> tuple[float, int]:
    """Device seconds one micro-batch's backward spends running forward ops again, and how many it runs.

    Full and every-K rerun the blocks' forward, less what torch's early stop skips (headroom.core.memory.flops.recompute_flops:
    the recomputed share of the blocks' FLOPs). Block-K reruns the stage's first K blocks, each its own segment
    (headroom.core.memory.flops.checkpointed_block_flops: the share of a block it reruns; a dense block's, where a
    stage mixes dense and experts' blocks). Selective reruns the attention core. Op-selective reruns every
    memory-bound op of the blocks, and under torchtitan every second matmul (the FLOPs headroom.core.memory.flops counts).
    """
    policy = config.recompute
    if not policy.recomputes or not flops.blocks_forward:
        return 0.0, 0
    # Shares of the whole model's FLOPs (headroom.core.memory.flops), applied to this rank's time.
    block_ops = ops.launches - len(ops.head)
    if policy.kind == "block":
        layers = sum(n for _, n in ops.blocks)
        if not layers:  # a stage of the embedding or the head alone
            return 0.0, 0
        k = config.recomputed_blocks(layers)
        early_stop = config.dropout == 0 and get_stack(config.stack).early_stop
        b, s = config.micro_batch, config.seq_len
        rerun = checkpointed_block_flops(spec, b, s, False, early_stop) / sum(flops.layer_forward.values())
        return blocks.forward_s * k / layers * rerun, block_ops * k // layers
    if policy.recomputes_blocks:
        return blocks.forward_s * flops.recompute / flops.blocks_forward, block_ops
    attention_flops = sum(v for k, v in flops.blocks_forward_by_matmul.items() if k.startswith("attn_"))
    if policy.caches_matmuls:
        matmul_flops = flops.blocks_forward - attention_flops
        gemm_share = min(1.0, flops.recompute / matmul_flops) if matmul_flops else 0.0
        return blocks.memory_s + blocks.gemm_s * gemm_share, block_ops
    # Selective: the attention core's ops (headroom.core.memory.trace.TracedOp.attention_core), those a fused kernel reruns whole;
    # of the explicit path's, the share of its FLOPs torch's early stop reruns (QK^T, not PV).
    rerun = min(1.0, flops.recompute / attention_flops) if attention_flops else 0.0
    core = [(tuple(op for op in block if op.attention_core), n) for block, n in ops.blocks]
    seconds = sum(price(block).forward_s * n for block, n in core)
    return seconds * rerun, sum(len(block) * n for block, n in core)


def _fp8_weight_cast_s(estimate: Estimate, profile: HardwareProfile) -> float:
    """Transformer Engine's casts of the rank's block weights to fp8, once a step (the first micro-batch's, cached
    for the rest: headroom.core.specs.float8): each linear's weight read (twice under current scaling, its amax
    first) and written row- and column-wise, one kernel a linear. Under ``fp8_param_gather`` the optimizer casts
    its fp32 master shard into the fp8 weight instead (read, twice under current scaling, and a byte written, over
    the dp x cp ranks the master is sharded over) and each rank transposes the gathered weight (a byte read, a
    byte written); MXFP8's parameters are gathered in bf16 and cast as the cached copies are. Priced with the
    optimizer's step."""
    cfg = estimate.config
    if not cfg.te_fp8:
        return 0.0
    passes = cfg.float8.te_cast_reads
    weights = te_block_weights(estimate.spec, cfg.layout.tp)
    rates = profile.rates
    if cfg.fp8_params and not cfg.float8.block:
        ranks = cfg.dp * cfg.layout.cp
        seconds = sum(memory_s(rates, -(-w // ranks) * (4 * passes + 1)) + memory_s(rates, 2 * w) for w in weights)
    else:
        reads = passes * DTYPE_BYTES[cfg.block_param_dtype]
        seconds = sum(memory_s(rates, w * (reads + 2)) for w in weights)
        if cfg.float8.block:  # MXFP8: the two copies' scales written too
            seconds = sum(memory_s(rates, out * width * (reads + 2) + mx_scale_bytes(out, width))
                          for out, width in te_block_shapes(estimate.spec, cfg.layout.tp))
    return fp8_rank_blocks(cfg, estimate.rank) * seconds


def _fsdp_copy_s(estimate: Estimate, profile: HardwareProfile) -> tuple[float, float]:
    """FSDP's own memory traffic in one micro-batch's forward and backward: each unit's shard copied into the
    all-gather's buffer and the gathered parameters copied out of it, in forward and again in backward (the
    unit was resharded after forward); in backward also the unsharded gradients copied into the
    reduce-scatter's buffer in the reduction's dtype, and the reduced shard accumulated into the sharded
    gradient (FSDP2's ``foreach_all_gather`` copy-in and ``foreach_all_gather_copy_out``, and
    ``foreach_reduce``'s copy-in, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py). Read and written,
    over the achieved bandwidth; none without ZeRO-3 or without ranks to shard over."""
    config = estimate.config
    ranks = config.dp * config.layout.cp
    if not estimate.fsdp_units:
        return 0.0, 0.0
    parameters = sum(size * n for size, n in estimate.fsdp_units)
    compute, reduce = config.recipe.activation_bytes, config.recipe.grad_bytes
    gather = 2 * parameters * compute * (1 + 1 / ranks)  # copy-in of the shard, copy-out of the whole, r + w
    reduce_copies = 2 * parameters * reduce * (1 + 1 / ranks)  # the whole into the buffer, the shard out
    return gather / profile.hbm_bytes_per_s, (gather + reduce_copies) / profile.hbm_bytes_per_s


def _host_s(costs: HostCosts, config: TrainConfig, forward_ops: int, rerun_ops: int, backward_kernels: int) -> float:
    """Host seconds to dispatch one micro-batch: forward and recompute op by op, backward kernel by kernel, and
    under a selective-checkpoint context (op-selective) its Python policy for each forward and recomputed op."""
    host = (forward_ops + rerun_ops) * costs.forward_op_s + backward_kernels * costs.backward_op_s
    if config.recompute.caches_matmuls:
        host += (forward_ops + rerun_ops) * costs.selective_checkpoint_op_s
    return host


def _dp_windows(config: TrainConfig, m: int, forward_s: float, backward_s: float) -> dict[tuple[str, str], float]:
    """The compute the data-parallel collectives hide behind, per step: the backward passes that reduce gradients
    or gather FSDP's parameters again (the last alone where gradients are reduced once and nothing is gathered
    in backward: DDP's and ZeRO-1's gradients), FSDP's forward passes that gather parameters (prefetched a unit
    ahead), and the next step's first forward, during which ZeRO-1 and 2 gather the updated parameters. A
    collective run after its pass (DataParallelSchedule.overlap_grad_reduce, overlap_param_gather off) has no
    window and is exposed (headroom.core.timing.comm)."""
    schedule, zero = config.data_parallel, config.zero
    if zero == 3:
        per_micro_batch = schedule.backward_gathers(m) or schedule.reductions(m) == m
        return {("dp", "forward"): schedule.forward_gathers(m) * forward_s,
                ("dp", "backward"): (m if per_micro_batch else 1) * backward_s}
    backwards = {0: schedule.reductions(m), 1: 1, 2: m}[zero]
    # ZeRO-1 and 2 gather the updated parameters during the next step's first forward (overlap_param_gather).
    return {("dp", "backward"): backwards * backward_s} | ({("dp", "forward"): forward_s} if zero else {})


def tokens_per_s(cfg: TrainConfig, time: StepTime, ranks: int | None = None) -> float:
    """Tokens per second across all data-parallel replicas (``ranks``, default the layout's dp)."""
    replicas = cfg.dp if ranks is None else ranks
    return cfg.tokens * time.micro_batches * replicas / time.total_s
