"""Step time of a training configuration on one device, from its measurements or its datasheet.

A `HardwareProfile` holds what the time model needs: matmul throughput by
dtype (measured points over GEMM sizes, or the datasheet peak), attention
throughput, memory bandwidth, and the allocator's reserved/allocated ratio.
`datasheet_profile` fills it from core.hardware with stated default
efficiencies; db/profiles.py fills it from a box's own benchmark results.

The model, per micro-batch (``step_time``):

- forward: every GEMM of every block and the head at the profile's rate for
  its dtype and size; the attention core (QK^T and PV) at the attention rate;
  memory-bound elementwise work as bytes over bandwidth, taking each tensor
  a block saves without checkpointing as written once and read once;
- backward: matmuls 2x forward, attention ``attention_backward_ratio`` x
  forward (FlashAttention-2 runs five GEMMs in backward against two forward,
  Dao 2023), elementwise 2x forward;
- recompute: the recomputed share of the blocks' forward (op-selective: all
  of their elementwise work, no matmul);
- offload: saved bytes to the host and back over ``host_bytes_per_s``;
per optimizer step:

- accumulation: each micro-batch after the first adds its gradients into
  ``.grad`` (read both, write one);
- optimizer: a memory-bound pass reading parameters, gradients, master copy and
  state, and writing all but the gradients;
- communication (core.comm): tensor- and pipeline-parallel traffic in full;
  data-parallel and FSDP traffic hidden behind the compute it overlaps with
  (the last micro-batch's backward for DDP and ZeRO-1, every backward for
  ZeRO-2, every forward and backward for FSDP), context-parallel ring traffic
  behind the attention; what is left over is exposed and counted;
- bubble: a pipeline idles (pp - 1) / v micro-batch times per step
  (core.pipeline.bubble_fraction).

Per rank, the blocks are the rank's n_layers / pp, their FLOPs split over
tp x cp ranks, and the head counted on every rank (the last stage, the slowest,
sets the pipeline's pace).
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass, field, replace
from typing import Literal

from core.comm import (
    DEFAULT_COLLECTIVE_EFFICIENCY,
    CommTerm,
    exposed_seconds,
    step_communication,
)
from core.config import TrainConfig
from core.errors import ConfigError
from core.estimate import Estimate
from core.flops import layer_forward_flops, logits_forward_flops
from core.hardware import HardwareSpec
from core.collective_curves import CollectiveCurves
from core.interconnect import DEFAULT_INTER_NODE_LINK, Cluster, cluster_for
from core.ledger import activation_ledger
from core.model import ModelSpec
from core.pipeline import bubble_fraction
from core.recompute import RecomputePolicy

# Defaults used when a box has no measurement of its own (stated in every plan that uses them).
DEFAULT_MATMUL_EFFICIENCY = 0.75
"""Large bf16 GEMMs reach 75-80% of the dense peak on Hopper (DEVELOPERS' H200: 769-798 of 989 TFLOP/s)."""
DEFAULT_ATTENTION_EFFICIENCY = 0.50
"""FlashAttention-2 forward reaches 50-73% of peak on A100/H100 (Dao 2023, Fig. 4-6); the low end."""
DEFAULT_BANDWIDTH_EFFICIENCY = 0.85
"""Large copies reach ~85-90% of HBM bandwidth (H200 here: ~4.3 of 4.8 TB/s)."""
DEFAULT_FRAGMENTATION = 1.10
"""Reserved / allocated of PyTorch's caching allocator when the box measured none."""
DEFAULT_COMPUTE_OVERHEAD = 1.5
"""A full eager PyTorch step takes this many times the sum of its kernels at the efficiencies above (launch
gaps, unfused elementwise work, power and clock limits). Fitted to published full training steps on H100,
planned with the stack they ran (``torchtitan``: its per-op checkpointing recomputes every second matmul, its
full checkpointing reruns whole blocks): torchtitan docs/performance.md, Table 1 (Llama 3.1 8B, FSDP on 8 H100,
local batch 2, seq 8192, selective op AC, eager: 5,762 tokens/s per GPU) implies 1.48; its Llama 3.1 405B run
(128 H100, TP 8 x FSDP 16, local batch 2, full AC: 109 tokens/s per GPU) implies 1.53. Both ran at a 500 W
power limit on 96 GB HBM2e parts, so a 700 W SXM card may beat it; tests/test_published_runs.py keeps both
within 15%."""
DEFAULT_HOST_BYTES_PER_S = 25e9
"""PCIe Gen5 x16 in practice, for offload traffic."""
ATTENTION_BACKWARD_RATIO = 2.5


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
    attention_backward_ratio: float = ATTENTION_BACKWARD_RATIO
    host_bytes_per_s: float = DEFAULT_HOST_BYTES_PER_S
    compute_overhead: float = 1.0
    """Full-step compute time over the sum of its kernels' (datasheet profiles: DEFAULT_COMPUTE_OVERHEAD;
    a measured profile leaves it to the calibration)."""
    device: str = "cuda"
    """The device whose saving rules the ledger applies (core.devices)."""
    assumptions: tuple[str, ...] = field(default=())
    """Which figures are defaults rather than measurements."""
    collectives: CollectiveCurves | None = None
    """Collective times measured over the box's devices (core.collective_curves); None: datasheet links."""

    def cluster(self, gpus_per_node: int = 8, inter: str = DEFAULT_INTER_NODE_LINK) -> Cluster:
        """Nodes of this device: its datasheet links (core.interconnect.cluster_for), with the measured
        collectives inside a node where the box recorded them."""
        return cluster_for(self.name, gpus_per_node, inter, self.collectives)

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


def datasheet_profile(hw: HardwareSpec) -> HardwareProfile:
    """A profile from the datasheet with the stated default efficiencies."""
    return HardwareProfile(
        name=hw.key,
        source="datasheet",
        memory_bytes=hw.memory_bytes,
        peak_flop_per_s=dict(hw.peak_flop_per_s),
        matmul={d: (MatmulPoint(1.0, p * DEFAULT_MATMUL_EFFICIENCY),) for d, p in hw.peak_flop_per_s.items()},
        attention_flop_per_s=hw.peak("bf16") * DEFAULT_ATTENTION_EFFICIENCY,
        hbm_bytes_per_s=hw.hbm_bytes_per_s * DEFAULT_BANDWIDTH_EFFICIENCY,
        compute_overhead=DEFAULT_COMPUTE_OVERHEAD,
        assumptions=(
            f"matmul at {DEFAULT_MATMUL_EFFICIENCY:.0%} of the dense datasheet peak",
            f"attention at {DEFAULT_ATTENTION_EFFICIENCY:.0%} of the bf16 peak",
            f"memory-bound work at {DEFAULT_BANDWIDTH_EFFICIENCY:.0%} of datasheet bandwidth",
            f"allocator fragmentation {DEFAULT_FRAGMENTATION:.2f}x",
            f"full-step overhead {DEFAULT_COMPUTE_OVERHEAD:.1f}x the kernels' time (fitted to torchtitan's "
            "published H100 runs)",
            f"collectives at {DEFAULT_COLLECTIVE_EFFICIENCY:.0%} of link bandwidth",
        ),
    )


@dataclass(frozen=True, slots=True)
class StepTime:
    """Seconds of one optimizer step on one rank, by term."""

    forward_s: float
    backward_s: float
    recompute_s: float
    offload_s: float
    accumulation_s: float
    optimizer_s: float
    micro_batches: int
    communication_s: float = 0.0
    """Communication left exposed after overlap (per step)."""
    bubble_s: float = 0.0
    """Pipeline idle time (per step)."""
    communication: tuple[CommTerm, ...] = ()
    """Every collective of the step, before overlap."""

    @property
    def waiting_s(self) -> float:
        """Seconds the rank waits on others: exposed communication and, in a pipeline, its bubble. What
        a profile of the rank measures as communication (agent.comm_time): a pipeline stage waiting for
        its neighbour's activations cannot tell the link's time from the neighbour's compute."""
        return self.communication_s + self.bubble_s

    @property
    def per_micro_batch_s(self) -> float:
        return self.forward_s + self.backward_s + self.recompute_s + self.offload_s

    @property
    def total_s(self) -> float:
        return (self.micro_batches * self.per_micro_batch_s + self.accumulation_s + self.optimizer_s
                + self.communication_s + self.bubble_s)

    def by_term(self) -> dict[str, float]:
        """Seconds per step by term; they add up to ``total_s``."""
        m = self.micro_batches
        return {"forward": self.forward_s * m, "backward": self.backward_s * m, "recompute": self.recompute_s * m,
                "offload": self.offload_s * m, "accumulation": self.accumulation_s, "optimizer": self.optimizer_s,
                "communication": self.communication_s, "bubble": self.bubble_s}


def _plain_activation_bytes(spec: ModelSpec, config: TrainConfig, device: str) -> int:
    """What one rank's blocks save without checkpointing: the elementwise traffic every policy runs forward."""
    return _plain_ledger_bytes(spec, replace(config, recompute=RecomputePolicy("none")), device)


@functools.lru_cache(maxsize=4096)
def _plain_ledger_bytes(spec: ModelSpec, config: TrainConfig, device: str) -> int:
    return activation_ledger(spec, config, device).saved_bytes


def step_time(estimate: Estimate, profile: HardwareProfile, accumulation_steps: int,
              cluster: Cluster | None = None) -> StepTime:
    """Predicted time of one optimizer step (``accumulation_steps`` micro-batches) on one rank.

    ``cluster``: the interconnect, needed when the layout spans more than one GPU.
    """
    spec, cfg = estimate.spec, estimate.config
    layout = cfg.layout
    split = layout.tp * layout.cp  # ranks sharing one micro-batch's FLOPs within a stage
    layers = spec.n_layers // layout.pp
    dtype = cfg.recipe.compute_dtype
    moe_layers = spec.moe_layers  # a mixture of experts runs without a pipeline: every block is here
    blocks_matmul_s = attention_flops = 0.0
    for moe, n in ((False, layers - moe_layers), (True, moe_layers)):
        if n:
            layer = {k: f // split for k, f in layer_forward_flops(spec, cfg.micro_batch, cfg.seq_len, moe).items()}
            attention_flops += n * (layer.pop("attn_scores") + layer.pop("attn_values"))
            blocks_matmul_s += n * sum(_gemms_s(profile, dtype, name, f, spec.n_experts // layout.ep)
                                        for name, f in layer.items())
    blocks_attention_s = attention_flops / profile.attention_flop_per_s
    blocks_elementwise_s = 2 * _plain_activation_bytes(spec, cfg, profile.device) / profile.hbm_bytes_per_s
    blocks_s = blocks_matmul_s + blocks_attention_s + blocks_elementwise_s
    logits = logits_forward_flops(spec, cfg.micro_batch, cfg.seq_len) // split
    head_s = logits / profile.matmul_flop_per_s(dtype, logits)

    overhead = profile.compute_overhead
    forward_s = overhead * (blocks_s + head_s)
    backward_s = overhead * (2 * (blocks_matmul_s + blocks_elementwise_s + head_s)
                             + profile.attention_backward_ratio * blocks_attention_s)
    policy = cfg.recompute
    flops = estimate.flops
    if policy.caches_matmuls:  # matmul outputs cached (torchtitan: every other one); every elementwise op runs again
        recompute_s = overhead * (blocks_elementwise_s + blocks_s * flops.recompute / flops.blocks_forward)
    else:  # a fraction of the blocks' forward runs again, at the forward's blend of rates
        recompute_s = overhead * blocks_s * flops.recompute / flops.blocks_forward
    offload_s = 2 * estimate.ledger.host_bytes / profile.host_bytes_per_s

    static = estimate.static
    accumulation_s = (accumulation_steps - 1) * 3 * static.gradients / profile.hbm_bytes_per_s
    state = static.optimizer_states + static.master_weights
    optimizer_s = (2 * static.parameters + static.gradients + 2 * state) / profile.hbm_bytes_per_s

    m = accumulation_steps
    per_micro = forward_s + backward_s + recompute_s + offload_s
    bubble_s = float(bubble_fraction(layout, m)) * m * per_micro
    terms: tuple[CommTerm, ...] = ()
    exposed = 0.0
    if layout.world > 1:
        if cluster is None:
            raise ConfigError(f"a layout over {layout.world} GPUs needs an interconnect to time its communication")
        terms = step_communication(spec, cfg, m, cluster)
        exposed = exposed_seconds(terms, {
            "dp": _dp_hideable(layout.zero, m, forward_s, backward_s + recompute_s),
            "cp": m * overhead * (1 + profile.attention_backward_ratio) * blocks_attention_s,
        })
    return StepTime(forward_s, backward_s, recompute_s, offload_s, accumulation_s, optimizer_s, m,
                    communication_s=exposed, bubble_s=bubble_s, communication=terms)


def _gemms_s(profile: HardwareProfile, dtype: str, name: str, flops: float, experts: int) -> float:
    """Seconds of one block's matmul ``name``: one GEMM, or for the routed experts (``experts_*``) one per
    expert of this rank (``experts``: n_experts / ep), each over its share of the routed tokens (as many as
    the others, on average): under expert parallelism fewer, larger GEMMs for the same FLOPs."""
    gemms = experts if name.startswith("experts_") else 1
    return flops / profile.matmul_flop_per_s(dtype, flops / gemms)


def _dp_hideable(zero: int, m: int, forward_s: float, backward_s: float) -> float:
    """Compute the data-parallel traffic can hide behind: the last backward for DDP and ZeRO-1 (gradients
    are reduced once, as the last micro-batch's backward produces them), every backward for ZeRO-2,
    every forward and backward for FSDP (gathers prefetched a unit ahead)."""
    if zero <= 1:
        return backward_s
    if zero == 2:
        return m * backward_s
    return m * (forward_s + backward_s)


def tokens_per_s(cfg: TrainConfig, time: StepTime, ranks: int | None = None) -> float:
    """Tokens per second across all data-parallel replicas (``ranks``, default the layout's dp)."""
    replicas = cfg.dp if ranks is None else ranks
    return cfg.tokens * time.micro_batches * replicas / time.total_s
