"""Measured collective times: the curves the agent recorded on a box, in place of datasheet links.

The agent measures each collective over the box's GPUs at message sizes from
1 KiB to 1 GiB (agent/bench_collectives.py). For a collective of S bytes over
n ranks inside that box the planner then reads the time from the curve of
the same op and group size, interpolated log-log between measured sizes,
held at the smallest size's time below it (latency-bound) and extended at the
largest size's bandwidth above it (bandwidth-bound).

A group size the box did not measure is read from the closest measured group
size n' of the same op at the same *bus* bytes: nccl-tests' bus bandwidth is
defined so that it does not depend on n for ring algorithms
(doc/PERFORMANCE.md), so t(S, n) = t'(S x bus_factor(n) / bus_factor(n')).
Groups that span nodes take curves measured across nodes where there are
any (nccl-tests over several hosts: `SpanningCurves`); the agent's box
measured no network.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from headroom.core.errors import ConfigError
from headroom.core.timing.collective_ops import bus_factor, nics_worth, ring_latency_s

Curve = tuple[tuple[int, float], ...]
"""(message bytes, seconds per call), sorted by size, sizes distinct."""


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    """One ok measured collective: its op, group, message size and median time per call."""

    op: str
    group_size: int
    message_bytes: int
    median_s: float


def _interpolate(curve: Curve, size: float) -> float:
    sizes = [s for s, _ in curve]
    if size <= sizes[0]:
        return curve[0][1]
    if size >= sizes[-1]:
        return curve[-1][1] * size / sizes[-1]
    i = bisect.bisect_left(sizes, size)
    if sizes[i] == size:
        return curve[i][1]
    (s0, t0), (s1, t1) = curve[i - 1], curve[i]
    w = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
    return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))


@dataclass(frozen=True, slots=True)
class SpanningCurves:
    """Collective times measured over ranks on several nodes (nccl-tests across hosts): what the network runs,
    for groups that span nodes (headroom.core.timing.comm)."""

    curves: Mapping[tuple[str, int, int], Curve]
    """(op, ranks, ranks a node) -> its curve."""

    def seconds(self, op: str, message_bytes: int, group_size: int, members: int, nodes: int, intra_s: float,
                inter_s: float) -> float | None:
        """One call of ``op`` over ``group_size`` ranks across ``nodes`` nodes, ``members`` of them a node (the fewest
        on any node); None when the op
        was not measured across nodes. Read from the run of the closest group size (n', k' a node) at the message
        that loads the network as this one does:

        - all-reduce, all-gather, reduce-scatter: the same bus bytes a NIC, a ring's node-crossing hops sharing the
          k members' NICs (headroom.core.timing.comm.group_link): S' = S x bus_factor(n) / bus_factor(n') x k' / k;
        - all-to-all: the same bytes off the node a rank, (n - k) / n of its buffer through its own NIC;
        - send/recv: the same bytes, one NIC a hop.

        A group whose ring waits longer than the run's adds the difference, each hop at NCCL's per-hop latency, those
        between nodes at ``inter_s``, the rest at ``intra_s`` (collective_ops.ring_latency_s); one that waits less is
        priced as the run (no latency taken off)."""
        runs = [(n, k) for o, n, k in self.curves if o == op]
        if not runs:
            return None
        n, k = min(runs, key=lambda run: (abs(run[0] - group_size), abs(run[1] - members), -run[0]))
        # the same bytes a NIC carries: bus bytes over the NICs' worth a member has (collective_ops.nics_worth)
        size = (message_bytes * bus_factor(op, group_size) / bus_factor(op, n)
                * nics_worth(op, n, k) / nics_worth(op, group_size, members))
        extra = max(0.0, ring_latency_s(op, group_size, nodes, intra_s, inter_s)
                    - ring_latency_s(op, n, n // k, intra_s, inter_s))
        return _interpolate(self.curves[(op, n, k)], size) + extra

    def runs(self) -> tuple[tuple[str, int, int], ...]:
        """(op, ranks, ranks a node) of each measured run."""
        return tuple(sorted(self.curves))

    def text(self) -> str:
        """"all_reduce over 16, 8 a node; ...": the runs, in words."""
        return "; ".join(f"{op} over {ranks}, {a_node} a node" for op, ranks, a_node in self.runs())


@dataclass(frozen=True, slots=True)
class CollectiveCurves:
    curves: Mapping[tuple[str, int], Curve]
    """(op, group size) -> its curve, measured inside one node."""
    source: str
    """Where they were measured, e.g. 'NVIDIA H200 (nccl)'."""
    across_nodes: SpanningCurves | None = None
    """Curves measured across nodes, where there are any."""

    @classmethod
    def from_records(cls, records: Iterable[CollectiveRecord], source: str) -> CollectiveCurves | None:
        """The median time per (op, group, size) over every record; None without any."""
        times: dict[tuple[str, int], dict[int, list[float]]] = {}
        for r in records:
            if r.median_s and r.median_s > 0 and r.message_bytes > 0 and r.group_size > 1:
                times.setdefault((r.op, r.group_size), {}).setdefault(r.message_bytes, []).append(r.median_s)
        if not times:
            return None
        return cls({key: tuple(sorted((size, statistics.median(ts)) for size, ts in by_size.items()))
                    for key, by_size in times.items()}, source)

    def seconds(self, op: str, message_bytes: int, group_size: int) -> float | None:
        """Time of one call, or None when the op was never measured (a group of 1 moves nothing: 0)."""
        if group_size < 1 or message_bytes < 0:
            raise ConfigError(f"a collective needs a group of 1+ ranks and 0+ bytes, got {group_size}, {message_bytes}")
        if group_size == 1 or message_bytes == 0:
            return 0.0
        measured = [n for o, n in self.curves if o == op]
        if not measured:
            return None
        n = min(measured, key=lambda m: (abs(m - group_size), -m))
        size = message_bytes * bus_factor(op, group_size) / bus_factor(op, n)
        return _interpolate(self.curves[(op, n)], size)

    def group_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({n for _, n in self.curves}))
