"""Collective curves from nccl-tests' output: what a cluster's owner measured with ``all_reduce_perf`` and its
siblings (github.com/NVIDIA/nccl-tests), handed to the planner in place of the node's datasheet link.

The agent measures its collectives with nccl-tests' definitions (headroom.agent.bench_collectives), so a
nccl-tests table reads as the agent's records: each row's ``size`` is the message (the whole buffer: all-reduce's
tensor, all-gather's gathered output, reduce-scatter's full input, all-to-all's per-rank input, send/recv's per-rank
buffer), its out-of-place ``time`` (microseconds) the time of one call, over the ranks the header's ``#  Rank``
lines list. The collective is the one its ``# Collective test starting:`` line names, or the one given with the
file (``all_reduce=FILE``: older nccl-tests do not print it).
Each row's bandwidths are checked against its size and time (``algbw = size / time``) and against the collective's
bus factor (``busbw = algbw x bus_factor``), so that a table whose columns are not nccl-tests', or the output of
another collective, is refused rather than misread.

A run inside one node (every rank on one host) stands for groups inside a node. A run across hosts, the same
number of ranks on each, stands for groups that span nodes (headroom.core.timing.collective_curves.SpanningCurves):
the network's own times in place of its datasheet rate, for any group size and ranks a node, by the rules the
datasheet network follows (a ring's crossing hops share the members' NICs; all-to-all and send/recv go through each
rank's own).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from headroom.core.errors import ConfigError
from headroom.core.timing.collective_curves import (
    CollectiveCurves,
    CollectiveRecord,
    SpanningCurves,
)
from headroom.core.timing.collective_ops import OPS, bus_factor

MAX_BYTES = 1024 * 1024
"""A nccl-tests log is a few hundred lines; anything larger is not one."""
BINARIES = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "reduce_scatter_perf": "reduce_scatter",
            "alltoall_perf": "all_to_all", "sendrecv_perf": "send_recv"}
"""nccl-tests' binaries of the collectives the planner prices, and their names here (headroom.core.timing.collective_ops)."""
TOLERANCE = 0.05
"""How far a row's algbw may be from size / time, and its busbw from algbw x the collective's bus factor
(headroom.core.timing.collective_ops.bus_factor), before the row is refused."""
BANDWIDTH_CHECKED = 1.0
"""GB/s from which a row's bandwidths are checked: below it nccl-tests' two decimals are too coarse."""

_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")


@dataclass(frozen=True, slots=True)
class NcclTestsRun:
    """One nccl-tests table: its collective, the ranks and GPUs it ran on, and a record per message size."""

    op: str
    """headroom.core.timing.collective_ops's name of the collective."""
    host: str
    """The first host the ranks ran on."""
    devices: tuple[str, ...]
    """Each rank's GPU, as the header names it."""
    records: tuple[CollectiveRecord, ...]
    nodes: int = 1
    """Hosts the ranks ran on, as many on each."""

    @property
    def ranks(self) -> int:
        return len(self.devices)

    @property
    def ranks_a_node(self) -> int:
        return self.ranks // self.nodes


def parse_nccl_tests(data: bytes, where: str, op: str | None = None) -> NcclTestsRun:
    """The table in nccl-tests' output ``data`` (named ``where`` in errors); ``op`` names the collective where the
    output does not. ConfigError says what is wrong with it."""
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{where}: over {MAX_BYTES // 1024} KiB; nccl-tests' output is a few hundred lines")
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text; give the output of an nccl-tests binary "
                          "(e.g. all_reduce_perf -b 1K -e 1G -f 4 -g 8)") from None
    ranks = [m.groups() for line in lines if (m := _RANK.match(line))]
    if not ranks:
        raise ConfigError(f"{where}: no '#  Rank N Group G Pid P on HOST device D [BUS] GPU' lines: not the output "
                          "of an nccl-tests binary (e.g. all_reduce_perf -b 1K -e 1G -f 4 -g 8)")
    on_host = Counter(host for _, host, _ in ranks)
    hosts = sorted(on_host)
    if len(set(on_host.values())) > 1:
        counts = ", ".join(f"{host} {on_host[host]}" for host in hosts)
        raise ConfigError(f"{where}: its {len(ranks)} ranks ran unevenly on {len(hosts)} hosts ({counts}); a run "
                          "across nodes is taken with as many ranks on each host (e.g. mpirun -np 16 -N 8 "
                          "all_reduce_perf -g 1)")
    if len(ranks) < 2:
        raise ConfigError(f"{where}: one rank moves nothing; run nccl-tests over the node's GPUs (-g 8)")
    collective = _op(lines, where, op)
    return NcclTestsRun(op=collective, host=hosts[0], devices=tuple(gpu for _, _, gpu in ranks),
                        records=tuple(_records(lines, where, collective, len(ranks))), nodes=len(hosts))


def _op(lines: list[str], where: str, given: str | None) -> str:
    named = next((m.group(1) for line in lines if (m := _STARTING.match(line))), None)
    if named is not None and named not in BINARIES:
        raise ConfigError(f"{where}: {named} is not a collective the planner prices; give the output of "
                          f"{', '.join(BINARIES)}")
    said = BINARIES[named] if named is not None else None
    if given is not None and given not in OPS:
        raise ConfigError(f"{where}: unknown collective {given!r}; valid: {', '.join(OPS)}")
    if said is not None and given is not None and said != given:
        raise ConfigError(f"{where}: given as {given}, but its output says {named}")
    if said is None and given is None:
        raise ConfigError(f"{where}: its output does not name its collective (older nccl-tests print no "
                          "'# Collective test starting:' line); name it before the file: --nccl-tests all_reduce=FILE "
                          "(all_reduce, all_gather, reduce_scatter, all_to_all or send_recv)")
    return said or given  # type: ignore[return-value]


def _records(lines: list[str], where: str, op: str, ranks: int) -> list[CollectiveRecord]:
    """One record a row: size, count, type, redop, [root,] then the out-of-place time, algbw, busbw, #wrong (the
    header line says whether there is a root column)."""
    header = next((line.split()[1:] for line in lines
                   if line.startswith("#") and {"size", "count", "time", "busbw"} <= set(line.split())), None)
    if header is None:
        raise ConfigError(f"{where}: no column header ('#  size  count  type  redop  root  time  algbw  busbw ...'); "
                          "give the whole output of the nccl-tests run")
    columns = 13 if "root" in header else 12
    records = []
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields or line.lstrip().startswith("#") or not fields[0].isdigit():
            continue
        if len(fields) != columns:
            raise ConfigError(f"{where}, line {number}: {len(fields)} columns, not the {columns} of its header (size "
                              f"count type redop{' root' if columns == 13 else ''} time algbw busbw #wrong, out-of-place "
                              "then in-place)")
        time_at = columns - 8  # the out-of-place time, before algbw, busbw, #wrong and the in-place four
        try:
            size, time_us = int(fields[0]), float(fields[time_at])
            algbw, busbw = float(fields[time_at + 1]), float(fields[time_at + 2])
        except ValueError:
            raise ConfigError(f"{where}, line {number}: size, time or a bandwidth is not a number: "
                              f"{line.strip()!r}") from None
        if size == 0:
            continue  # nccl-tests prints rows of 0 bytes; nothing to time
        if not (math.isfinite(time_us) and time_us > 0):
            raise ConfigError(f"{where}, line {number}: a time of {fields[time_at]} us, which no collective takes: "
                              "give the output as nccl-tests printed it")
        wrong = fields[time_at + 3]
        if wrong.isdigit() and int(wrong) > 0:  # "N/A" where the run did not check (-c 0)
            raise ConfigError(f"{where}, line {number}: {wrong} wrong values in the out-of-place result (#wrong): the "
                              "collective failed its own check at that size; rerun nccl-tests and fix the fabric first")
        if algbw >= BANDWIDTH_CHECKED:
            expected = size / (time_us * 1e-6) / 1e9
            if abs(algbw - expected) > TOLERANCE * expected:
                raise ConfigError(f"{where}, line {number}: algbw {algbw:g} GB/s is not size / time ({expected:.2f}): "
                                  "not nccl-tests' columns (time in microseconds, out-of-place first)")
            factor = bus_factor(op, ranks)
            if abs(busbw - algbw * factor) > TOLERANCE * algbw * factor:
                raise ConfigError(f"{where}, line {number}: busbw / algbw is {busbw / algbw:.3f}, not {op}'s "
                                  f"{factor:.3f} over {ranks} ranks: the output of another collective?")
        records.append(CollectiveRecord(op=op, group_size=ranks, message_bytes=size, median_s=time_us * 1e-6))
    if not records:
        raise ConfigError(f"{where}: no rows of message size and time; give the whole output of the nccl-tests run")
    return records


def nccl_tests_curves(runs: Iterable[tuple[NcclTestsRun, str]], gpus_per_node: int,
                      measured: CollectiveCurves | None = None) -> CollectiveCurves:
    """The curves of ``runs`` (each with the file it came from), over ``measured`` (the store's, where it has
    them): a curve a file gives for an op and group size inside a node replaces the store's; a run across hosts
    gives the curves across nodes (`CollectiveCurves.across_nodes`), one per op, group size and ranks a node."""
    runs = list(runs)
    for run, where in runs:
        if run.ranks_a_node > gpus_per_node:
            raise ConfigError(f"{where}: {run.ranks_a_node} ranks on one host, more than the {gpus_per_node} GPUs a "
                              "node (--gpus-per-node)")
    inside = CollectiveCurves.from_records((r for run, _ in runs if run.nodes == 1 for r in run.records), "")
    spanning = [run for run, _ in runs if run.nodes > 1]
    across = measured.across_nodes if measured is not None else None
    if spanning:
        by_run: dict[tuple[str, int, int], list[CollectiveRecord]] = {}
        for run in spanning:
            by_run.setdefault((run.op, run.ranks, run.ranks_a_node), []).extend(run.records)
        given = {}
        for (op, ranks, a_node), records in by_run.items():
            curve = CollectiveCurves.from_records(records, "")
            assert curve is not None  # every run holds a record
            given[(op, ranks, a_node)] = curve.curves[(op, ranks)]
        across = SpanningCurves({**(across.curves if across else {}), **given})
    devices = sorted({device for run, _ in runs for device in run.devices})
    files = "; ".join(f"{where}: {run.op} over {run.ranks}"
                      + (f" on {run.nodes} hosts" if run.nodes > 1 else "") for run, where in runs)
    source = f"by nccl-tests on {', '.join(devices)} ({files})"
    if measured is not None:
        source += f", else {measured.source}"
    curves = {**(measured.curves if measured else {}), **(inside.curves if inside else {})}
    return CollectiveCurves(curves, source, across)
