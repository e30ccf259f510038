"""What one op costs on a device, and what the host pays to launch it.

Device time of each op kind (headroom.core.timing.step_ops enumerates them):

- **GEMM** (m x k)(k x n), ``batch`` of them: its FLOPs at the device's large-GEMM efficiency times two shape
  factors, and never faster than reading its operands and writing its result at the achieved bandwidth:

      efficiency = large-GEMM efficiency x wave(m, n) x k / (k + GEMM_K_RAMP)

  ``wave`` is NVIDIA's tile and wave quantization ("Matrix Multiplication Background User's Guide"): the
  output is cut into ``GEMM_TILE`` x ``GEMM_TILE`` tiles, one per SM at a time, and a last wave with fewer
  tiles than SMs leaves the rest idle; a 1024^3 product on an H200's 132 SMs is 64 tiles, one half-empty
  wave. The k factor is the main loop's prologue and epilogue, amortised over k. Backward runs the input
  gradient (m x n)(n x k) and the weight gradient (n x m)(m x k) at their own shapes.
- **Attention**: the FLOPs counted in full (headroom.core.memory.flops) over the device's attention rate (counted the same
  way), times a wave factor over the query tiles (batch x heads x s / ``GEMM_TILE``); backward
  ``attention_backward_ratio`` times forward.
- **Memory-bound ops** (norms, casts, activations, RoPE, residual adds, the loss's softmax): what an op reads
  and writes (the trace says how many tensors of its output's size it reads: one for a unary op, two for a
  binary one, a cast its input's bytes) over the achieved bandwidth. Backward moves twice forward's bytes
  (the output's gradient and the saved input in, the input's gradient out) in one kernel; a float8 cast's
  backward is the casts it runs again, each its own kernel (``TracedOp.backward_moved``), and Transformer
  Engine's cast of a linear's output gradient runs in backward only (``TracedOp.backward_only``).
- Every kernel adds ``KERNEL_GAP_S``: the device idles between two dependent kernels while the next one
  starts, and a small kernel's grid ramps up and drains.

Host time: eager PyTorch dispatches each op from Python before the device can run it (`HostCosts`). Forward
pays ``forward_op_s`` an op, backward ``backward_op_s`` a kernel (autograd's engine, in C++), and a policy
that runs forward under a selective-checkpoint context (op-selective: torch's
``create_selective_checkpoint_contexts`` calls its policy in Python for every op, in forward and in
recompute) ``selective_checkpoint_op_s`` more an op. Where the host cannot run ahead of the device, a step takes the longer of
the two (headroom.core.timing.step).

The kernel gap and the three host constants were fitted to one data set, the H200 reference run's 20 measured
steps without offload (tests/data/reference; ``python benchmarks/fit_time_constants.py`` refits them), whose
small micro-batches are launch- and host-bound. Nothing else is fitted: docs/time-model.md lists each
constant with what it was fitted on or cited from.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from headroom.core.memory.trace import TracedOp
from headroom.core.specs.precision import DTYPE_BYTES

GEMM_TILE = 128
"""Output tile edge of a large cuBLAS/CUTLASS GEMM kernel on Ampere and Hopper (128 x 128 and 128 x 256 tiles
are the common ones; the smaller makes the wave factor the milder)."""
GEMM_K_RAMP = 128
"""k at which a GEMM's main loop reaches half its rate: 1024^3 runs at 0.90 of an 8192^3's k factor. Chosen with
the wave factor against the H200 reference run's 19 bf16 GEMMs (median 2.3% off; docs/time-model.md)."""
KERNEL_GAP_S = 6.0e-6
"""What each kernel adds to its work: launch-to-start on a busy queue, grid ramp-up and drain. Fitted to the
H200 reference run within 1-6 us, the range CUDA's launch latency is quoted in (the fit takes the top of it)."""


@dataclass(frozen=True, slots=True)
class HostCosts:
    """What the host pays to dispatch a step's ops, in seconds. The defaults were fitted to the H200 reference
    run (its host: a 16-thread Xeon VM); a box that measured its own dispatch replaces them."""

    forward_op_s: float = 5e-6
    """One forward op from an eager PyTorch module: Python, the dispatcher, autograd's graph recording."""
    backward_op_s: float = 12e-6
    """One backward kernel: autograd's engine walks the graph in C++."""
    selective_checkpoint_op_s: float = 60e-6
    """More per op under a selective-checkpoint context (op-selective): torch calls the policy in Python for
    each op, in forward and again in recompute."""
    source: str = "fitted to the H200 reference run (tests/data/reference)"


@dataclass(frozen=True, slots=True)
class DeviceRates:
    """What a device reaches, as the op prices need it (headroom.core.timing.step.HardwareProfile provides it)."""

    peak_flop_per_s: dict[str, float]
    """Dense peak by dtype; empty where the device has none (a CPU): GEMMs then take a measured rate by size
    (``ops_time``'s ``gemm_rate``)."""
    matmul_efficiency: float
    """The shape model's anchor: a GEMM whose shape leaves every SM busy and whose k is unbounded reaches this
    fraction of the peak (``anchor_efficiency``)."""
    sms: int
    """Tiles of one wave; 0 when unknown (no wave quantization)."""
    attention_flop_per_s: float
    """Fused attention forward, FLOPs counted in full (causal too) per second."""
    attention_backward_ratio: float
    bytes_per_s: float
    """Achieved memory bandwidth (read plus written)."""
    kernel_gap_s: float = KERNEL_GAP_S
    """What each kernel adds to its work (``KERNEL_GAP_S``)."""
    dtype_efficiency: dict[str, float] = field(default_factory=dict)
    """The anchor for a dtype whose large GEMMs reach another fraction of their peak than bf16's (fp8)."""


def wave_efficiency(tiles: int, sms: int) -> float:
    """Busy SMs over SMs x waves: 1 when the tiles fill every wave."""
    if sms <= 0 or tiles <= 0:
        return 1.0
    waves = math.ceil(tiles / sms)
    return tiles / (waves * sms)


def shape_factor(m: int, n: int, k: int, batch: int, sms: int) -> float:
    """What a GEMM's shape leaves of the large-GEMM efficiency: its last wave's idle SMs, and k's ramp."""
    tiles = batch * math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE)
    return wave_efficiency(tiles, sms) * k / (k + GEMM_K_RAMP)


def anchor_efficiency(flop_per_s: float, peak_flop_per_s: float, m: int, n: int, k: int, sms: int) -> float:
    """The large-GEMM efficiency that makes the shape model give ``flop_per_s`` for an (m, n, k) GEMM."""
    return flop_per_s / peak_flop_per_s / shape_factor(m, n, k, 1, sms)


def gemm_efficiency(rates: DeviceRates, m: int, n: int, k: int, batch: int = 1, dtype: str = "bf16") -> float:
    """Fraction of ``dtype``'s dense peak a GEMM of this shape reaches (the module's docstring)."""
    return rates.dtype_efficiency.get(dtype, rates.matmul_efficiency) * shape_factor(m, n, k, batch, rates.sms)


def gemm_s(rates: DeviceRates, m: int, n: int, k: int, batch: int, dtype: str,
           flop_per_s: float | None = None) -> float:
    """Seconds of ``batch`` GEMMs (m x k)(k x n) in ``dtype``. ``flop_per_s``: a measured rate for this size
    that replaces the shape model (a device without a datasheet peak)."""
    flops = 2 * m * n * k * batch
    if flop_per_s is None:
        if dtype in rates.peak_flop_per_s:
            flop_per_s = rates.peak_flop_per_s[dtype] * gemm_efficiency(rates, m, n, k, batch, dtype)
        else:
            flop_per_s = rates.peak_flop_per_s.get("bf16", 0.0) * gemm_efficiency(rates, m, n, k, batch)
    element = DTYPE_BYTES.get(dtype, 2)
    traffic = element * batch * (m * k + k * n + m * n)
    return max(flops / flop_per_s, traffic / rates.bytes_per_s) + rates.kernel_gap_s


def attention_s(rates: DeviceRates, op: TracedOp) -> float:
    """Seconds of a fused attention forward (``op.flops`` counted in full)."""
    busy = wave_efficiency(_query_tiles(op), rates.sms)
    return op.flops / rates.attention_flop_per_s / busy + rates.kernel_gap_s


def memory_s(rates: DeviceRates, moved_bytes: int) -> float:
    """Seconds of a memory-bound op reading and writing ``moved_bytes`` in all."""
    return moved_bytes / rates.bytes_per_s + rates.kernel_gap_s


@dataclass(frozen=True, slots=True)
class OpsTime:
    """Device seconds of a list of ops, forward and backward, by kind, and their kernel launches."""

    gemm_s: float = 0.0
    attention_s: float = 0.0
    memory_s: float = 0.0
    backward_gemm_s: float = 0.0
    backward_attention_s: float = 0.0
    backward_memory_s: float = 0.0
    launches: int = 0
    """Forward kernels."""
    backward_launches: int = 0
    weight_gemm_s: float = 0.0
    """The part of ``backward_gemm_s`` that makes the weights' gradients (the GEMMs outside the attention core):
    what a zero-bubble schedule runs apart, as ``W`` (headroom.core.specs.schedule_order)."""

    @property
    def forward_s(self) -> float:
        return self.gemm_s + self.attention_s + self.memory_s

    @property
    def backward_s(self) -> float:
        return self.backward_gemm_s + self.backward_attention_s + self.backward_memory_s

    def scaled(self, n: int) -> OpsTime:
        """``n`` times these ops."""
        return OpsTime(*(getattr(self, f) * n for f in self.__slots__))

    def __add__(self, other: OpsTime) -> OpsTime:
        return OpsTime(*(getattr(self, f) + getattr(other, f) for f in self.__slots__))


def ops_time(rates: DeviceRates, ops: tuple[TracedOp, ...],
             gemm_rate: Callable[[str, float], float] | None = None) -> OpsTime:
    """Device time of ``ops`` forward and backward. ``gemm_rate(dtype, flops)``: a measured rate by size, for a
    device without a datasheet peak."""
    gemm = attention = memory = b_gemm = b_attention = b_memory = weight = 0.0
    launches = backward = 0
    for op in ops:
        if op.kind == "gemm":
            m, n, k, batch = op.m, op.n, op.k, op.batch
            rate = gemm_rate(op.dtype, op.flops / batch) if gemm_rate else None
            gemm += gemm_s(rates, m, n, k, batch, op.dtype, rate)
            # (m x k)(k x n): the input's gradient is (m x n)(n x k), the right operand's (n x m)(m x k); outside
            # the attention core the right operand is a weight
            right = gemm_s(rates, n, k, m, batch, op.dtype, rate)
            b_gemm += gemm_s(rates, m, k, n, batch, op.dtype, rate) + right
            weight += 0.0 if op.attention_core else right
            backward += 2
        elif op.kind == "attention":
            t = attention_s(rates, op)
            attention += t
            b_attention += rates.attention_backward_ratio * (t - rates.kernel_gap_s) + rates.kernel_gap_s
            backward += 1
        else:
            moved = op.bytes + op.read_bytes
            kernels = op.backward_moved if op.backward_moved is not None else (2 * moved,)
            b_memory += sum(memory_s(rates, b) for b in kernels)
            backward += len(kernels)
            if op.backward_only:
                continue
            memory += memory_s(rates, moved)
        launches += 1
    return OpsTime(gemm, attention, memory, b_gemm, b_attention, b_memory, launches, backward, weight)


def _query_tiles(op: TracedOp) -> int:
    """An attention kernel's blocks: a tile of ``GEMM_TILE`` queries of each head of each sequence."""
    return op.batch * math.ceil(op.m / GEMM_TILE)
