"""Timing device work honestly (docs/measurement.md).

- One sample is a *block* of calls run back to back, long enough
  (``block_s``, 1 ms) that launch gaps and timer resolution vanish in it: a
  1024^3 bf16 matmul takes about 3 us on an H100, less than the host needs to
  launch the next one, so a pair of events around one call would time the
  launch, not the kernel. A sample is the block's time over its calls.
- Warm up for a time (``warmup_s``), not a count: kernel selection, the
  allocator and clocks settle while the block size is found.
- CUDA: events on the measured device's own stream, one pair per block, one
  synchronize at the end; the host clock never times asynchronous work.
  CPU: ``time.perf_counter`` around each block (CPU ops are synchronous).
- Kernels shorter than the host's launch cost (a few microseconds of Python
  and dispatch per call) would still leave the GPU idle between them: with
  ``graph=True`` a CUDA block is captured once as a CUDA graph and each
  sample replays it, so its kernels run back to back with no host in
  between. A function that cannot be captured falls back to plain blocks,
  and the details say so.
- ``budget_s`` is real on both: on a GPU the number of blocks comes from the
  warm-up's fastest per-call time, so the samples take about that long on the
  device; on a CPU blocks are taken until the budget is spent.
- Keep inputs out of L2: ``fn(i)`` gets a running call index so the caller
  can rotate through input buffers whose total exceeds the L2.
- Keep every raw sample; report the median with min and max; record the
  GPU's clocks and throttle reasons as the samples end (agent/clocks.py),
  and the host's load, the samples' spread and the thread count, flagging a
  busy host (agent/host_load.py).
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from headroom.agent import host_load
from headroom.agent.clocks import read_clocks

BLOCK_S = 1e-3
"""Target wall time of one timed block of calls."""
MAX_CALLS = 4096
"""Calls per block at most (a no-op still costs the host a few microseconds per call)."""


@dataclass(frozen=True, slots=True)
class Timing:
    samples_s: tuple[float, ...]
    """Seconds per call, one per timed block."""
    calls_per_sample: int = 1
    clocks: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """More about the method, e.g. whether blocks were CUDA graphs."""
    host: dict[str, Any] | None = None
    """The host while the samples were taken (headroom.agent.host_load.verdict): threads, load, spread, busy."""

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def min_s(self) -> float:
        return min(self.samples_s)

    @property
    def max_s(self) -> float:
        return max(self.samples_s)

    def details(self) -> dict[str, Any]:
        """How the samples were taken, for a result's ``details``."""
        out: dict[str, Any] = {"calls_per_sample": self.calls_per_sample, **self.extra}
        if self.clocks is not None:
            out["clocks"] = self.clocks
        if self.host is not None:
            out["host"] = self.host
        return out


def l2_bytes(device: torch.device) -> int:
    """The device's L2 size (CUDA), or the CPU's last-level cache (`cpu_cache_bytes`)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).L2_cache_size
    return cpu_cache_bytes()


CPU_CACHE_GUESS = 64 * 2**20
"""The last-level cache assumed where the kernel does not say (off Linux)."""


CPU_CACHES = "/sys/devices/system/cpu/cpu0/cache"


@functools.cache
def cpu_cache_bytes(caches: str = CPU_CACHES) -> int:
    """The CPU's last-level cache as Linux reports it in ``caches`` (the highest-level data or unified
    cache of CPU 0), else ``CPU_CACHE_GUESS``."""
    from pathlib import Path

    best: tuple[int, int] | None = None
    for index in Path(caches).glob("index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        nbytes = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
        if best is None or level > best[0]:
            best = (level, nbytes)
    return best[1] if best else CPU_CACHE_GUESS


@functools.cache
def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for graph capture: cuBLAS keeps a workspace (32 MiB on Hopper) for
    every stream it has run on until the process ends, so a new stream per capture would leak one per
    benchmark (1.15 GB over the quick suite on an H200)."""
    return torch.cuda.Stream(device)


class _Blocks:
    """Times blocks of ``calls`` back-to-back calls of fn(i), i running on across blocks."""

    def __init__(self, fn: Callable[[int], object], device: torch.device) -> None:
        self.fn, self.device = fn, device
        self.index = itertools.count()
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.current_stream(device) if self.cuda else None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.graph_calls = 0

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def run(self, calls: int) -> None:
        for _ in range(calls):
            self.fn(next(self.index))

    def capture(self, calls: int) -> None:
        """Record ``calls`` calls as one CUDA graph; ``enqueue(calls)`` then replays it."""
        side = capture_stream(self.device)
        side.wait_stream(self.stream)
        with torch.cuda.stream(side):
            self.run(2)  # capture wants its kernels warmed up on a side stream first
        self.stream.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.run(calls)
        self.graph, self.graph_calls = graph, calls

    def enqueue(self, calls: int):
        """Run one block; returns what ``seconds`` turns into its duration."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
            if self.graph is not None and calls == self.graph_calls:
                self.graph.replay()
            else:
                self.run(calls)
            end.record(self.stream)
            return start, end
        start = time.perf_counter()
        self.run(calls)
        return start, time.perf_counter()

    def seconds(self, mark) -> float:
        start, end = mark
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start

    def timed(self, calls: int) -> float:
        mark = self.enqueue(calls)
        self.sync()
        return self.seconds(mark)


def time_fn(
    fn: Callable[[int], object],
    device: torch.device,
    *,
    iterations: int = 50,
    min_iterations: int = 5,
    budget_s: float = 1.0,
    warmup_s: float = 0.05,
    block_s: float = BLOCK_S,
    graph: bool = False,
) -> Timing:
    """Time ``fn(i)`` (i a running call index, so the caller can rotate inputs).

    Takes between ``min_iterations`` and ``iterations`` samples, as many as
    fit in ``budget_s`` seconds of device time. ``graph``: replay each CUDA
    block as a CUDA graph (``fn`` must be capturable and allocate nothing it
    keeps).
    """
    blocks = _Blocks(fn, device)
    blocks.run(1)  # first call: lazy initialisation, kernel selection
    blocks.sync()
    calls, started = 1, time.perf_counter()
    warm_blocks, per_call = 0, math.inf
    while True:
        # The fastest block so far: on a busy host a block descheduled for a quantum would otherwise
        # size the samples for a call 10-100x slower than it is, and the budget would go unspent.
        per_call = min(per_call, max(blocks.timed(calls) / calls, 1e-9))
        warm_blocks += 1
        calls = max(1, min(MAX_CALLS, math.ceil(block_s / per_call)))
        # A second block only when the first was too short to size the samples' blocks by.
        if (warm_blocks >= 2 or calls == 1) and time.perf_counter() - started >= warmup_s:
            break
    extra: dict[str, Any] = {}
    if graph and blocks.cuda:
        calls, per_call, extra = _graphed(blocks, calls, block_s)
    window = host_load.mark()
    if blocks.cuda:
        samples = max(min_iterations, min(iterations, int(budget_s / (calls * per_call))))
        marks = [blocks.enqueue(calls) for _ in range(samples)]
        blocks.sync()
    else:
        marks = _until_spent(blocks, calls, budget_s, min_iterations, iterations)
    taken = tuple(blocks.seconds(m) / calls for m in marks)
    host = host_load.verdict(window, host_load.mark(), taken, torch.get_num_threads())
    return Timing(taken, calls, read_clocks(device), extra, host)


def _until_spent(blocks: _Blocks, calls: int, budget_s: float, least: int, most: int) -> list:
    """CPU blocks are synchronous, so the clock can decide when to stop: blocks until ``budget_s`` is
    spent (at least ``least``, at most ``most``). A plan from the warm-up would come out short whenever
    every warm-up block ran slow (seen next to busy processes: a 0.4 s budget timed 86 ms)."""
    deadline = time.perf_counter() + budget_s
    marks = [blocks.enqueue(calls)]
    while len(marks) < least or (len(marks) < most and marks[-1][1] < deadline):
        marks.append(blocks.enqueue(calls))
    return marks


def _graphed(blocks: _Blocks, calls: int, block_s: float) -> tuple[int, float, dict[str, Any]]:
    """Capture the block as a CUDA graph, growing it once if replay shows the eager block was host-bound.

    Returns (calls, seconds per call, details); on a capture failure the plain block stays.
    """
    try:
        blocks.capture(calls)
        per_call = max(blocks.timed(calls) / calls, 1e-9)
        grown = max(1, min(MAX_CALLS, math.ceil(block_s / per_call)))
        if grown > 2 * calls:
            blocks.capture(grown)
            calls = grown
            per_call = max(blocks.timed(calls) / calls, 1e-9)
    except RuntimeError as err:  # not capturable: time plain blocks and say why
        blocks.graph = None
        torch.cuda.synchronize(blocks.device)
        per_call = max(blocks.timed(calls) / calls, 1e-9)
        return calls, per_call, {"cuda_graph": False, "cuda_graph_error": str(err).splitlines()[0][:200]}
    return calls, per_call, {"cuda_graph": True}
