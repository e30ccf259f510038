"""A device's stored measurements as plain records, and the profile and calibration they make.

The store (headroom.db.profiles) fetches rows and hands them over as the records
below; this module decides what they mean:

- matmul throughput by dtype: the median over runs of each GEMM size, made
  non-decreasing in size (`matmul_curve`), for interpolation over GEMM sizes;
- attention throughput and the backward / forward time ratio: the fastest
  backend at the largest measured shape (`attention_throughput`);
- bandwidth: the best copy (`copy_bandwidth`);
- allocator fragmentation: the median reserved / allocated of the training
  steps (`allocator_fragmentation`; CUDA only, the stated default otherwise),
  and of each checkpoint policy's (`fragmentation_by_policy`);
- a calibration: each training step predicted again by the current core with
  the profile, against what was measured (`calibration_from_steps`).

Only datasheet peaks (for MFU) come from headroom.core.specs.hardware. A figure the records
lack falls back to the datasheet default, or without a datasheet row to a
stated guess, and the profile lists it among its assumptions.

Units as everywhere: FLOPs, FLOP/s, bytes, bytes/s, seconds.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from headroom.core.errors import ConfigError
from headroom.core.measured.calibration import (
    STEP_RANGE_LIMIT,
    Calibration,
    Observation,
    calibrate,
)
from headroom.core.memory.estimate import estimate, for_rank
from headroom.core.memory.flops import attention_forward_flops
from headroom.core.specs.hardware import match_device
from headroom.core.specs.layout import Layout
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.recompute import parse_policy
from headroom.core.specs.run_config import COLUMNS as RUN_COLUMNS
from headroom.core.specs.run_config import RECIPE_COLUMNS, RunConfig
from headroom.core.timing.collective_curves import CollectiveCurves, CollectiveRecord
from headroom.core.timing.device_curves import CURVES
from headroom.core.timing.op_time import HostCosts, anchor_efficiency
from headroom.core.timing.step import (
    DEFAULT_FRAGMENTATION,
    HardwareProfile,
    MatmulPoint,
    datasheet_profile,
    step_time,
)

UNMEASURED_BANDWIDTH_BYTES_PER_S = 10e9
"""Bandwidth assumed for a device with neither a measured copy nor a datasheet row (a host's DRAM, roughly)."""


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """The measured device, from its latest fingerprint."""

    name: str
    """As torch reports it, e.g. "NVIDIA H100 80GB HBM3"; matched to a datasheet row when ``device_type`` is cuda."""
    device_type: str
    """``cuda`` or ``cpu``."""
    memory_bytes: int | None = None
    """Device memory as the fingerprint read it; None when it could not."""


@dataclass(frozen=True, slots=True)
class MatmulRecord:
    """One ok matmul measurement."""

    dtype: str
    flops: int
    """2 m n k x batch."""
    flop_per_s: float


@dataclass(frozen=True, slots=True)
class AttentionRecord:
    """One ok attention measurement (one backend, one shape)."""

    batch: int
    seq_len: int
    n_heads: int
    head_dim: int
    forward_s: float | None
    """Median forward time; a record without one is ignored."""
    backward_s: float | None = None
    """Median backward time; None when only the forward pass was measured."""

    @property
    def forward_flops(self) -> int:
        return attention_forward_flops(self.batch, self.seq_len, self.n_heads, self.head_dim)


@dataclass(frozen=True, slots=True)
class ElementwiseRecord:
    """One ok memory-bound op measurement: its achieved bandwidth (a copy counts read and write)."""

    op: str
    bytes_per_s: float


def timing_noise(busy: bool, median_s: float | None, min_s: float | None, max_s: float | None) -> str | None:
    """Why a measured step's timing cannot be trusted, or None: the agent found the host busy, or its slowest and
    fastest repetitions differ by more than ``STEP_RANGE_LIMIT`` of its median. A missing figure (None) says
    nothing either way."""
    if busy:
        return "the agent found the host busy"
    if median_s and min_s is not None and max_s is not None:
        spread = (max_s - min_s) / median_s
        if spread > STEP_RANGE_LIMIT:
            return f"its steps spread {spread:.0%} of their median"
    return None


@dataclass(frozen=True, slots=True)
class TrainStepRecord:
    """One ok measured training step: the configuration it ran and what it measured."""

    model_name: str
    model_spec: Mapping
    """headroom.core.specs.model.ModelSpec as a dict (dataclasses.asdict), as stored."""
    seq_len: int
    micro_batch: int
    accumulation_steps: int
    precision: str
    optimizer: str
    attention: str
    recompute: str
    """The policy as headroom.core.specs.recompute names it (``none``, ``full``, ``every-2``, ...)."""
    median_s: float | None
    """Median time of one optimizer step."""
    dropout: float = 0.0
    peak_allocated_bytes: int | None = None
    """torch.cuda.max_memory_allocated() at steady state; None on a CPU."""
    peak_reserved_bytes: int | None = None
    activation_bytes: int | None = None
    """Saved-for-backward bytes (saved_tensors_hooks, deduplicated by storage)."""
    layout: Mapping | None = None
    """headroom.core.specs.layout.Layout as a dict for a multi-rank step; None on one device."""
    rank: int = 0
    communication_s: float | None = None
    """Measured exposed communication within one step on this rank (in a pipeline, with its waits on the
    neighbouring stages)."""
    min_s: float | None = None
    max_s: float | None = None
    """The fastest and slowest timed step."""
    busy: bool = False
    """The agent flagged the host busy while the steps were timed (agent/host_load.py)."""
    stack: str = "reference"
    """Whose checkpointing the step ran (headroom.core.specs.stack), as its stored prediction records it."""
    fp8: str = "off"
    """The FP8 recipe of its linears (headroom.core.specs.float8), or ``off``."""
    compile: bool = False
    """Its blocks compiled with torch.compile."""

    @property
    def noisy(self) -> str | None:
        """Why this step's timing cannot be trusted, or None (headroom.core.measured.calibration leaves such steps out)."""
        return timing_noise(self.busy, self.median_s, self.min_s, self.max_s)

    @property
    def key(self) -> tuple:
        """What makes two steps the same configuration (a fleet reruns the same ones night after night)."""
        return (json.dumps(self.model_spec, sort_keys=True), self.seq_len, self.micro_batch, self.accumulation_steps,
                self.precision, self.optimizer, self.attention, self.recompute, self.dropout,
                json.dumps(self.layout, sort_keys=True), self.rank, self.stack, self.fp8, self.compile)

    @property
    def world(self) -> int:
        """Ranks the step ran on: its layout's world size, 1 on one device."""
        return Layout(**self.layout).world if self.layout else 1

    @property
    def run_config(self) -> RunConfig:
        """The configuration the step ran; ConfigError where today's core cannot read it."""
        return RunConfig.from_columns({key: getattr(self, key) for key in (*RUN_COLUMNS, *RECIPE_COLUMNS)},
                                      dropout=self.dropout, stack=self.stack, layout=self.layout)

    @property
    def label(self) -> str:
        ranks = f" rank {self.rank}/{self.world}" if self.layout else ""
        stack = f" ({self.stack})" if self.stack != "reference" else ""
        recipe = (f" fp8 {self.fp8}" if self.fp8 != "off" else "") + (" compiled" if self.compile else "")
        return (f"{self.model_name} micro {self.micro_batch} x{self.accumulation_steps} {self.recompute}{recipe}"
                f"{stack}{ranks}")


@dataclass(frozen=True, slots=True)
class StepPrediction:
    """What the current core predicts for a measured step's configuration."""

    peak_bytes: int
    saved_bytes: int
    """Everything saved for backward, one micro-batch (Ledger.saved_bytes)."""
    step_time_s: float
    communication_s: float = 0.0
    """Exposed communication within the step, plus the bubble in a pipeline (StepTime.waiting_s; 0 on
    one device)."""


def _positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def matmul_curve(records: Iterable[MatmulRecord]) -> dict[str, tuple[MatmulPoint, ...]]:
    """Throughput by dtype and GEMM size: the median over runs of each size, non-decreasing in size.

    A larger GEMM is not slower per FLOP than a smaller one the same box ran:
    a dip is noise (a busy host, a cold clock), so each point carries the best
    rate seen at any smaller size of its dtype.
    """
    by_shape: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in records:
        if _positive(r.flop_per_s) and r.flops > 0:  # a damaged or forged row is no rate at all
            by_shape[(r.dtype, r.flops)].append(r.flop_per_s)
    points: dict[str, list[MatmulPoint]] = defaultdict(list)
    for (dtype, flops), rates in sorted(by_shape.items(), key=lambda kv: kv[0][1]):
        best = max(statistics.median(rates), points[dtype][-1].flop_per_s if points[dtype] else 0.0)
        points[dtype].append(MatmulPoint(float(flops), best))
    return {dtype: tuple(p) for dtype, p in points.items()}


@dataclass(frozen=True, slots=True)
class DispatchRecord:
    """One ok host-dispatch measurement (headroom.agent.bench_dispatch): seconds per op in one mode."""

    mode: str
    """``forward``, ``backward`` or ``selective-checkpoint``."""
    per_op_s: float


def host_costs(records: Iterable[DispatchRecord], device_name: str) -> HostCosts | None:
    """The box's own host costs: the median of each mode's measurements; None unless all three were measured."""
    by_mode: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if math.isfinite(r.per_op_s) and r.per_op_s >= 0:
            by_mode[r.mode].append(r.per_op_s)
    if not all(by_mode.get(mode) for mode in ("forward", "backward", "selective-checkpoint")):
        return None
    return HostCosts(forward_op_s=statistics.median(by_mode["forward"]),
                     backward_op_s=statistics.median(by_mode["backward"]),
                     selective_checkpoint_op_s=statistics.median(by_mode["selective-checkpoint"]),
                     source=f"measured on {device_name}")


LARGE_GEMM_FLOPS = 2 * 4096**3
"""A GEMM of this many FLOPs or more runs at the device's sustained large-GEMM rate (the H200 reference run: 15
such bf16 GEMMs, 687-776 TFLOP/s, median 709.8)."""


def large_gemm_efficiency(records: Iterable[MatmulRecord], peak_flop_per_s: float, sms: int,
                          dtype: str = "bf16") -> float | None:
    """The shape model's anchor (headroom.core.timing.op_time.anchor_efficiency) from a box's own ``dtype`` GEMMs
    of ``LARGE_GEMM_FLOPS`` or more: the median over their sizes of each size's median rate (what the store's
    aggregates hand over, db/profiles.py; fp8's with and without fast accumulation alike), at the median size
    taken as a cube. None without any."""
    by_size: dict[int, list[float]] = defaultdict(list)
    for r in records:
        if r.dtype == dtype and r.flops >= LARGE_GEMM_FLOPS and _positive(r.flop_per_s):
            by_size[r.flops].append(r.flop_per_s)
    if not by_size or peak_flop_per_s <= 0:
        return None
    rate = statistics.median(statistics.median(rates) for rates in by_size.values())
    side = round((statistics.median(by_size) / 2) ** (1 / 3))
    return anchor_efficiency(rate, peak_flop_per_s, side, side, side, sms)


def attention_throughput(records: Iterable[AttentionRecord]) -> tuple[float, float | None] | None:
    """(forward FLOP/s, backward / forward time) of the fastest backend at the largest shape; None without any.

    FLOPs are headroom.core.memory.flops.attention_forward_flops (causal counted in full). The
    ratio is None when that measurement has no backward time.
    """
    timed = [r for r in records if _positive(r.forward_s) and r.forward_flops > 0]
    if not timed:
        return None
    largest = max(r.forward_flops for r in timed)
    best = min((r for r in timed if r.forward_flops == largest), key=lambda r: r.forward_s)
    ratio = best.backward_s / best.forward_s if best.backward_s else None
    return largest / best.forward_s, ratio


def copy_bandwidth(records: Iterable[ElementwiseRecord]) -> float | None:
    """The best copy's bandwidth, bytes/s (read plus written); None without a copy."""
    copies = [r.bytes_per_s for r in records if r.op == "copy" and _positive(r.bytes_per_s)]
    return max(copies) if copies else None


def allocator_fragmentation(steps: Iterable[TrainStepRecord]) -> float | None:
    """Median peak reserved / peak allocated over the steps that have both (CUDA); None without any."""
    ratios = [s.peak_reserved_bytes / s.peak_allocated_bytes for s in steps
              if s.peak_reserved_bytes and s.peak_allocated_bytes]
    return statistics.median(ratios) if ratios else None


def fragmentation_by_policy(steps: Iterable[TrainStepRecord]) -> dict[str, float]:
    """``allocator_fragmentation`` of each checkpoint policy's steps, by kind (every-K together): a policy that
    brings segments back in backward leaves the caching allocator more fragmented than one that keeps everything
    (the H200 run: 1.02-1.08 without checkpointing, 1.05-1.12 under full and every-2). A step whose policy no
    longer reads is left out."""
    by_kind: dict[str, list[TrainStepRecord]] = defaultdict(list)
    for step in steps:
        try:
            by_kind[parse_policy(step.recompute).kind].append(step)
        except ConfigError:
            continue
    found = {kind: allocator_fragmentation(kind_steps) for kind, kind_steps in by_kind.items()}
    return {kind: ratio for kind, ratio in sorted(found.items()) if ratio is not None}


def profile_from_measurements(
    device: DeviceRecord,
    *,
    matmul: Iterable[MatmulRecord] = (),
    attention: Iterable[AttentionRecord] = (),
    elementwise: Iterable[ElementwiseRecord] = (),
    train_steps: Iterable[TrainStepRecord] = (),
    host_memory_bytes: int | None = None,
    collectives: Iterable[CollectiveRecord] = (),
    dispatch: Iterable[DispatchRecord] = (),
) -> HardwareProfile:
    """The planner's HardwareProfile of a measured device (``source="measured"``).

    A CUDA device whose name matches a datasheet row (headroom.core.specs.hardware.match_device)
    takes its dense peaks from it, and that row's datasheet profile fills in
    what was not measured. Without a row: attention at half the best matmul
    rate, bandwidth UNMEASURED_BANDWIDTH_BYTES_PER_S, and memory
    ``host_memory_bytes`` when the fingerprint has none (a CPU's memory is the
    host's). Each fallback is listed in ``assumptions``. ConfigError when
    there is no matmul measurement and no datasheet row to stand in for it.
    """
    datasheet = match_device(device.name).spec if device.device_type == "cuda" else None
    fallback = datasheet_profile(datasheet) if datasheet else None
    assumptions = []
    matmul = list(matmul)
    curve = matmul_curve(matmul)
    if not curve:
        if fallback is None:
            raise ConfigError(f"{device.name} has no matmul measurements in the store and no datasheet row; "
                              "run `headroom agent run` on it")
        curve = fallback.matmul
        assumptions.append(fallback.assumptions[0])
    attention_rate = attention_throughput(attention)
    if attention_rate is None:
        rate = fallback.attention_flop_per_s if fallback else max(p.flop_per_s for ps in curve.values() for p in ps) / 2
        attention_rate = (rate, None)
        assumptions.append("attention at half the matmul rate (not measured)")
    bandwidth = copy_bandwidth(elementwise)
    if bandwidth is None:
        bandwidth = fallback.hbm_bytes_per_s if fallback else UNMEASURED_BANDWIDTH_BYTES_PER_S
        assumptions.append("bandwidth not measured")
    train_steps = list(train_steps)
    fragmentation = allocator_fragmentation(train_steps)
    if fragmentation is None:
        fragmentation = DEFAULT_FRAGMENTATION
        assumptions.append(f"allocator fragmentation {DEFAULT_FRAGMENTATION:.2f}x (no CUDA allocator statistics stored)")
    memory = device.memory_bytes or (datasheet.memory_bytes if datasheet else host_memory_bytes)
    if not memory:
        raise ConfigError(f"{device.name}: memory size unknown (not in its fingerprint, no datasheet row, "
                          "no host memory given)")
    shape_model = {}
    if datasheet is not None:
        curves = CURVES.get(datasheet.key)
        sms = curves.sms if curves else 0
        efficiency = large_gemm_efficiency(matmul, datasheet.peak("bf16"), sms)
        if efficiency is None:
            efficiency = fallback.matmul_efficiency
            assumptions.append(f"GEMMs by shape from the datasheet row's cited GEMM (no bf16 GEMM of "
                               f"{LARGE_GEMM_FLOPS:.3g} FLOPs or more measured)")
        shape_model = {"matmul_efficiency": efficiency, "sms": sms, "dtype_efficiency": dict(fallback.dtype_efficiency),
                       "dtype_sources": dict(fallback.dtype_sources), "mx_formats": datasheet.mx_formats}
        if "fp8" in datasheet.peak_flop_per_s and \
                (fp8 := large_gemm_efficiency(matmul, datasheet.peak("fp8"), sms, "fp8")) is not None:
            shape_model["dtype_efficiency"]["fp8"] = fp8
            shape_model["dtype_sources"]["fp8"] = f"measured on {device.name}"
    host = host_costs(dispatch, device.name)
    if host is None:
        host = HostCosts()
        assumptions.append(f"host dispatch not measured: {host.source}")
    profile = HardwareProfile(
        name=device.name,
        source="measured",
        memory_bytes=memory,
        peak_flop_per_s=dict(datasheet.peak_flop_per_s) if datasheet else {},
        matmul=curve,
        attention_flop_per_s=attention_rate[0],
        hbm_bytes_per_s=bandwidth,
        fragmentation=fragmentation,
        fragmentation_by_policy=fragmentation_by_policy(train_steps),
        device="cpu" if device.device_type == "cpu" else "cuda",
        assumptions=tuple(assumptions),
        host=host,
        **shape_model,
    )
    backward_ratio = attention_rate[1]
    if backward_ratio:
        profile = replace(profile, attention_backward_ratio=backward_ratio)
    curves = CollectiveCurves.from_records(collectives, f"measured on {device.name}")
    return replace(profile, collectives=curves) if curves else profile


def predict_step(step: TrainStepRecord, profile: HardwareProfile) -> StepPrediction | None:
    """The current core's prediction for a measured step on ``profile``; None when the step no longer reads.

    A step recorded by an older core may carry a spec or a configuration the
    current one rejects (ConfigError) or does not know (TypeError): it is
    left out rather than guessed.
    """
    try:
        spec = ModelSpec(**step.model_spec)
        run = step.run_config
        predicted = for_rank(estimate(spec, run.train, profile.device, run.accumulation_steps), step.rank)
    except (ConfigError, TypeError):
        return None
    cluster = profile.cluster() if run.train.layout.world > 1 else None
    timing = step_time(predicted, profile, step.accumulation_steps, cluster)
    return StepPrediction(predicted.peak_bytes, predicted.ledger.saved_bytes, timing.total_s,
                          timing.waiting_s)


def step_observations(steps: Iterable[TrainStepRecord], profile: HardwareProfile) -> list[Observation]:
    """Each step that still reads, predicted again now, paired with what it measured and what it ran (model,
    ranks, checkpoint policy: what the confidence names).

    Memory pairs the predicted peak with the measured peak allocated bytes
    where the step has them (CUDA), and the ledger's saved-activation bytes
    with the probe's wherever it ran. Each distinct configuration
    (`TrainStepRecord.key`) is predicted once.
    """
    predictions: dict[tuple, StepPrediction | None] = {}
    observations = []
    for step in steps:
        if step.key not in predictions:
            predictions[step.key] = predict_step(step, profile)
        predicted = predictions[step.key]
        if predicted is None:
            continue
        communication = (predicted.communication_s, step.communication_s) if step.layout else (None, None)
        observations.append(Observation(
            predicted_bytes=predicted.peak_bytes if step.peak_allocated_bytes else None,
            measured_bytes=step.peak_allocated_bytes, predicted_s=predicted.step_time_s,
            measured_s=step.median_s, label=step.label,
            predicted_communication_s=communication[0], measured_communication_s=communication[1],
            predicted_activation_bytes=predicted.saved_bytes if step.activation_bytes else None,
            measured_activation_bytes=step.activation_bytes, noisy=step.noisy,
            model=step.model_name, gpus=step.world, policy=step.recompute,
        ))
    return observations


def calibration_from_steps(device_name: str, steps: Iterable[TrainStepRecord], profile: HardwareProfile) -> Calibration:
    """headroom.core.measured.calibration.calibrate over `step_observations`: how far today's core is from the measured steps;
    the steps it cannot predict any more (an older core's configuration, a damaged row) are counted."""
    steps = list(steps)
    observations = step_observations(steps, profile)
    unit = "device" if profile.device == "cpu" else "GPU"
    return replace(calibrate(device_name, observations, unit), unreadable=len(steps) - len(observations))
