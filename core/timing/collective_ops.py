"""The collectives, and how nccl-tests turns their times into bandwidths (doc/PERFORMANCE.md)."""

from __future__ import annotations

from headroom.core.errors import ConfigError

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
"""The collectives nccl-tests and the agent measure."""
PRICED_OPS: tuple[str, ...] = (*OPS, "broadcast")
"""What a plan prices: the measured ones, and a broadcast (torch's ZeroRedundancyOptimizer sends each updated
parameter from the rank that owns it), priced from the link alone."""


def _group(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"group size must be a positive integer, got {n!r}")
    return n


def _check_op(op: str) -> None:
    if op not in PRICED_OPS:
        raise ConfigError(f"unknown collective {op!r}; valid: {', '.join(PRICED_OPS)}")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw for ``op`` over ``n`` ranks; 0 for n == 1 (nothing moves)."""
    _check_op(op)
    _group(n)
    if n == 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("send_recv", "broadcast"):  # a broadcast's every rank receives the whole message
        return 1.0
    return (n - 1) / n


def ring_steps(op: str, n: int) -> int:
    """Latency-bound steps one call waits for: a ring's, 2(n-1) for all-reduce and n-1 for all-gather,
    reduce-scatter and broadcast (a chain from its root), one after the other; 1 for send/recv, and 1 for all-to-all, whose sends to every peer are
    issued at once (NCCL's all-to-all is a send and a receive per peer in one ncclGroupStart/End: nccl-tests'
    src/alltoall.cu, torch's ``all_to_all_single`` alike)."""
    _check_op(op)
    _group(n)
    if n == 1:
        return 0
    return {"all_reduce": 2 * (n - 1), "send_recv": 1, "all_to_all": 1}.get(op, n - 1)


def nics_worth(op: str, n: int, k: int) -> float:
    """The NICs a member of a group of ``n`` ranks, ``k`` of them on each node, moves its bus bytes through across
    nodes, in NICs a GPU (headroom.core.timing.comm.group_link): a ring collective's k (NCCL runs a ring per NIC and
    only its node-crossing hop uses one, so the k members' NICs carry it together); a send/recv's 1 (each rank's
    bytes through its own); an all-to-all's (n - 1) / (n - k) (a rank sends (n - k) / n of its buffer off the node
    through its own NIC, its bus bytes count (n - 1) / n)."""
    _check_op(op)
    _group(n)
    if not 1 <= k < n:
        raise ConfigError(f"a group across nodes has 1 to n - 1 = {n - 1} members a node, got {k!r}")
    if op == "send_recv":
        return 1.0
    if op == "all_to_all":
        return (n - 1) / (n - k)
    return float(k)


def ring_latency_s(op: str, n: int, nodes: int, intra_s: float, inter_s: float) -> float:
    """One call's latency over ``n`` ranks on ``nodes`` nodes, as NCCL's tuning model counts a ring's
    (src/graph/tuning.cc: ``(nsteps - nInterSteps) * intraLat + nInterSteps * interLat``, nInterSteps 2(N - 1) for
    all-reduce and N - 1 otherwise): the hops between nodes at ``inter_s``, the rest at ``intra_s``; a send/recv and
    an all-to-all (one step) wait for one hop, across nodes where there are two or more. A caller across nodes
    passes as ``intra_s`` the tuning model's floor of those hops at the network's post overhead
    (headroom.core.specs.interconnect.Cluster.spanning_hop_s: 6 us on AMD hosts, above NVLink's 3.4). Left out:
    the network plugin's ``latencyInter`` the model adds to each hop between nodes (0 unless the plugin reports
    one)."""
    steps = ring_steps(op, n)
    if nodes <= 1:
        return steps * intra_s
    inter = min(steps, 2 * (nodes - 1) if op == "all_reduce" else nodes - 1)
    return (steps - inter) * intra_s + inter * inter_s
