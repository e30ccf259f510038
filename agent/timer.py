"""Timing device work honestly (DESIGN.md, "Measurement recipe").

- Warm up first (kernel selection, allocator, caches), untimed.
- CUDA: one pair of events around each iteration, one synchronize at the end;
  the host clock never times asynchronous work.
- CPU: ``time.perf_counter`` around each iteration (CPU ops are synchronous).
- Keep inputs out of L2: the caller rotates through input buffers whose total
  size exceeds L2, or passes ``flush`` bytes; a flush buffer is overwritten
  before each iteration, outside the timed region.
- Keep every raw sample; report the median with min and max.
- Stop after ``iterations`` samples or ``budget_s`` seconds of samples,
  whichever comes first, but never before ``min_iterations``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Timing:
    samples_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def min_s(self) -> float:
        return min(self.samples_s)

    @property
    def max_s(self) -> float:
        return max(self.samples_s)


def l2_bytes(device: torch.device) -> int:
    """The device's L2 size (CUDA), or a last-level-cache guess for the CPU (64 MiB)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).L2_cache_size
    return 64 * 2**20


def time_fn(
    fn: Callable[[int], object],
    device: torch.device,
    *,
    warmup: int = 3,
    iterations: int = 20,
    min_iterations: int = 3,
    budget_s: float = 2.0,
    flush_bytes: int = 0,
) -> Timing:
    """Time ``fn(i)`` for iteration i (so the caller can rotate inputs).

    ``flush_bytes`` > 0 overwrites a buffer of that size before each timed
    iteration, evicting the inputs from L2; leave it 0 when inputs rotate.
    """
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device=device) if flush_bytes else None
    for i in range(warmup):
        fn(i)
    if device.type == "cuda":
        return _time_cuda(fn, device, warmup, iterations, min_iterations, budget_s, flush)
    return _time_host(fn, warmup, iterations, min_iterations, budget_s, flush)


def _time_cuda(fn, device, offset, iterations, min_iterations, budget_s, flush) -> Timing:
    torch.cuda.synchronize(device)
    pairs = []
    start_wall = time.perf_counter()
    for i in range(iterations):
        if flush is not None:
            flush.fill_(i & 0xFF)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(offset + i)
        end.record()
        pairs.append((start, end))
        # The host runs ahead of the device; syncing once per ~budget keeps the loop bounded.
        if len(pairs) >= min_iterations and time.perf_counter() - start_wall > budget_s:
            break
    torch.cuda.synchronize(device)
    return Timing(tuple(s.elapsed_time(e) / 1e3 for s, e in pairs))


def _time_host(fn, offset, iterations, min_iterations, budget_s, flush) -> Timing:
    samples = []
    spent = 0.0
    for i in range(iterations):
        if flush is not None:
            flush.fill_(i & 0xFF)
        start = time.perf_counter()
        fn(offset + i)
        elapsed = time.perf_counter() - start
        samples.append(elapsed)
        spent += elapsed
        if len(samples) >= min_iterations and spent > budget_s:
            break
    return Timing(tuple(samples))
