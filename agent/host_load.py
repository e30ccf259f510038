"""Was the host busy while a benchmark took its samples? Two witnesses, both stored with the result.

A box in a fleet is often running something else. On a CPU that turns a
timing into garbage without any error: single samples fall into two groups
(the op's time, or the op's time plus a scheduler quantum), and a matmul rate
can come out at a few percent of what the box does when idle. So every timed
window records:

- **other processes' CPU time**: from ``/proc/stat`` (all CPUs' busy ticks,
  hypervisor steal included) minus this process's own CPU time
  (``os.times``, every thread), over the window's wall time and the CPU
  count: the share of the machine something else used. More than
  ``BUSY_OTHER_FRACTION`` of it, over a window long enough for the clock
  ticks to resolve (``MIN_WINDOW_S``), flags the result.
- **the samples' own spread**: interquartile range over median. Samples that
  disagree by more than ``SPREAD_LIMIT`` flag the result whatever the
  cause (``/proc/stat`` does not exist off Linux).

The flag is a warning on the result (``details["host"]["busy"]``), not a
rejection: the figures are kept, and whoever reads them can tell.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

BUSY_OTHER_FRACTION = 0.25
"""Share of the machine's CPU time other processes may take during a window before it is flagged."""
SPREAD_LIMIT = 0.5
"""Interquartile range over median beyond which a result's samples are flagged as disagreeing. On this
project's 2-core VM a quiet CPU smoke suite spread up to 0.38 (GELU over 128 MiB), and matmuls next
to two busy processes 0.48-0.64 (when other processes' CPU time, 53-60%, flagged them as well)."""
MIN_WINDOW_S = 0.1
"""Shorter windows are judged by their spread only: /proc/stat counts in 10 ms ticks."""


@dataclass(frozen=True, slots=True)
class Mark:
    wall_s: float
    own_cpu_s: float
    busy_ticks: int | None


def _busy_ticks() -> int | None:
    """All CPUs' non-idle ticks since boot (user, nice, system, irq, softirq, steal), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return user + nice + system + irq + softirq + steal


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def mark() -> Mark:
    """The start (or end) of a timed window."""
    return Mark(time.perf_counter(), _own_cpu_s(), _busy_ticks())


def spread(samples: Sequence[float]) -> float:
    """Interquartile range over median (0 for fewer than two samples)."""
    if len(samples) < 2:
        return 0.0
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / median if median > 0 else 0.0


def other_cpu_fraction(start: Mark, end: Mark) -> float | None:
    """Share of the machine's CPU time that other processes used between the marks (None when unknown)."""
    wall = end.wall_s - start.wall_s
    if start.busy_ticks is None or end.busy_ticks is None or wall <= 0:
        return None
    busy_s = (end.busy_ticks - start.busy_ticks) / os.sysconf("SC_CLK_TCK")
    other = busy_s - (end.own_cpu_s - start.own_cpu_s)
    return max(0.0, other / (wall * (os.cpu_count() or 1)))


def verdict(start: Mark, end: Mark, samples: Sequence[float], threads: int) -> dict[str, Any]:
    """What a result stores about its window: the host's load, the samples' spread, and whether either
    says the figures may not be the box's own (``busy``, with the reasons in ``why``)."""
    window = end.wall_s - start.wall_s
    other = other_cpu_fraction(start, end)
    disagree = spread(samples)
    why = []
    if other is not None and window >= MIN_WINDOW_S and other > BUSY_OTHER_FRACTION:
        why.append(f"other processes used {other:.0%} of the CPUs")
    if disagree > SPREAD_LIMIT:
        why.append(f"samples spread {disagree:.0%} (interquartile range over median)")
    return {
        "threads": threads, "cpus": os.cpu_count(), "window_s": window,
        "other_cpu_fraction": other, "spread": disagree, "busy": bool(why), "why": why,
    }


SETTLE_WINDOW_S = 1.0
"""How long each look at the host's load lasts while waiting for it to settle."""


def wait_until_quiet(limit_s: float, load: Callable[[], float | None] | None = None,
                     clock: Callable[[], float] = time.monotonic) -> tuple[bool, float, float | None]:
    """Look at the host window by window until other processes use at most ``BUSY_OTHER_FRACTION`` of the
    CPUs, for at most ``limit_s``: (quiet, seconds waited, the last window's share). ``load`` measures one
    window (by default `window_load`); a host whose load cannot be read counts as quiet."""
    load = load or window_load
    started = clock()
    while True:
        share = load()
        waited = clock() - started
        if share is None or share <= BUSY_OTHER_FRACTION:
            return True, waited, share
        if waited >= limit_s:
            return False, waited, share


def window_load(window_s: float = SETTLE_WINDOW_S) -> float | None:
    """Other processes' share of the CPUs over the next ``window_s`` (None where /proc/stat is not read)."""
    start = mark()
    time.sleep(window_s)
    return other_cpu_fraction(start, mark())
