"""Exposed communication of a step, read from torch's profiler: the time the step waited for collectives.

Two views, one per device type, both as a union of time intervals (so nested
or overlapping events are counted once):

- **CPU (gloo).** Gloo runs a collective on its own threads; the training
  thread either calls it synchronously or waits on its handle later. The
  thread's time inside collective calls and waits (``c10d::*``,
  ``_c10d_functional::wait_tensor``, FSDP's ``*_wait`` spans) is the time the
  step could not compute: its exposed communication.
- **CUDA (NCCL).** Collectives are kernels on their own streams, launched
  asynchronously, so the host's view says nothing. Exposed communication is
  the time NCCL kernels run while no other kernel runs: the union of NCCL
  kernel intervals minus their overlap with the union of compute kernels.
"""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[float, float]

HOST_WAITS = ("c10d::", "_c10d_functional::wait_tensor", "c10d_functional::wait_tensor")
"""Host-side events (name prefixes) during which the training thread is blocked on communication."""
FSDP_WAIT_MARK = "_wait"


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Disjoint, sorted intervals covering exactly what the given ones cover."""
    merged: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in union(intervals))


def overlap(first: Iterable[Interval], second: Iterable[Interval]) -> float:
    """Time covered by both sets of intervals."""
    a, b = union(first), union(second)
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def is_host_wait(name: str) -> bool:
    return name.startswith(HOST_WAITS) or (name.startswith("FSDP::") and FSDP_WAIT_MARK in name)


def host_exposed_s(events: Iterable[tuple[str, int, float, float]], thread: int) -> float:
    """Seconds the ``thread`` spent in collective calls and waits; events are (name, thread, start_s, end_s)."""
    return length((start, end) for name, tid, start, end in events if tid == thread and is_host_wait(name))


def kernel_exposed_s(comm: Iterable[Interval], compute: Iterable[Interval]) -> float:
    """Seconds communication kernels ran with no compute kernel running."""
    comm = union(comm)
    return length(comm) - overlap(comm, compute)


def exposed_s(profile, device_type: str, step_mark: str) -> float:
    """Exposed communication in a ``torch.profiler.profile`` of the steps, seconds (all steps together);
    ``step_mark`` names the ``record_function`` span of a step, which tells the training thread."""
    if device_type == "cuda":
        comm, compute = [], []
        for event in profile.events():
            if getattr(event.device_type, "name", "") != "CUDA":
                continue
            span = (event.time_range.start / 1e6, event.time_range.end / 1e6)
            (comm if "nccl" in event.name.lower() else compute).append(span)
        return kernel_exposed_s(comm, compute)
    events = profile.events()
    threads = {e.thread for e in events if e.name == step_mark}
    if len(threads) != 1:
        raise ValueError(f"the profile holds {step_mark!r} spans on {len(threads)} threads, not one")
    return host_exposed_s(((e.name, e.thread, e.time_range.start / 1e6, e.time_range.end / 1e6)
                           for e in events), threads.pop())
