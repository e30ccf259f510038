"""Roofline model (Williams, Waterman, Patterson, CACM 2009).

Arithmetic intensity I = FLOPs / bytes moved to and from memory. A device's
ridge point (its "accelerator intensity") is peak FLOP/s / memory bytes/s:
H100 SXM bf16 989.4e12 / 3.35e12 ~ 295, H200 989.4e12 / 4.8e12 ~ 206.
Below the ridge an op is memory-bound, above it compute-bound, and the most it
can attain is min(peak, I x bandwidth).

The functions take plain rates so they serve datasheet and measured roofs alike.
"""

from __future__ import annotations

from typing import Literal

from headroom.core.errors import ConfigError

Bound = Literal["memory", "compute"]


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte moved."""
    if bytes_moved <= 0:
        raise ConfigError(f"bytes moved must be positive, got {bytes_moved!r}")
    return flops / bytes_moved


def matmul_intensity(m: int, n: int, k: int, element_bytes: int = 2) -> float:
    """(m x k)(k x n): 2mnk FLOPs over reading both operands and writing the result once.

    A 1024^3 bf16 matmul: 2 * 1024^3 / (2 * 3 * 1024^2) ~ 341.
    """
    return arithmetic_intensity(2 * m * n * k, element_bytes * (m * k + k * n + m * n))


def ridge_intensity(peak_flop_per_s: float, bytes_per_s: float) -> float:
    """Accelerator intensity: the intensity at which the two roofs meet."""
    return arithmetic_intensity(peak_flop_per_s, bytes_per_s)


def bound(intensity: float, peak_flop_per_s: float, bytes_per_s: float) -> Bound:
    """Which roof limits an op of this intensity."""
    return "compute" if intensity >= ridge_intensity(peak_flop_per_s, bytes_per_s) else "memory"


def attainable_flop_per_s(intensity: float, peak_flop_per_s: float, bytes_per_s: float) -> float:
    """min(peak, intensity x bandwidth)."""
    return min(peak_flop_per_s, intensity * bytes_per_s)
