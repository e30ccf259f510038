"""``headroom plan --nccl-tests [OP=]FILE``: nccl-tests' output of one node read as the node's measured collectives
(headroom.core.timing.nccl_tests). The logs here are synthetic, written in nccl-tests' format (its header, rank
lines and the 13 columns of all_reduce_perf and its siblings, or the 12 of versions without a root column) from a
stated latency and bandwidth; no figure in them was measured."""

from __future__ import annotations

import json

import pytest

from headroom.core.errors import ConfigError
from headroom.core.timing.collective_curves import CollectiveCurves, CollectiveRecord
from headroom.core.timing.collective_ops import bus_factor
from headroom.core.timing.nccl_tests import (
    MAX_BYTES,
    nccl_tests_curves,
    parse_nccl_tests,
)

GPU = "NVIDIA H100 80GB HBM3"
SIZES = [1024 * 4**i for i in range(11)]  # 1 KiB .. 1 GiB


def log(binary: str = "all_reduce_perf", ranks: int = 8, hosts: tuple[str, ...] = ("node1",), latency_us: float = 20.0,
        gb_per_s: float = 300.0, named: bool = True, root: bool = True, bus: str | None = None,
        time_scale: float = 1.0) -> bytes:
    """nccl-tests' output of ``binary`` over ``ranks`` GPUs spread over ``hosts``: each size takes latency + size /
    bandwidth; ``bus`` the collective whose bus factor the busbw column uses (default the binary's);
    ``time_scale`` scales the printed times alone (as a table in other units would)."""
    op = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "sendrecv_perf": "send_recv",
          "alltoall_perf": "all_to_all"}[binary]
    lines = [f"# Collective test starting: {binary}"] if named else []
    lines += [(f"# nThread 1 nGpus {ranks} minBytes 1024 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 20 "
               "agg iters: 1 validation: 1 graph: 0"), "#", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid  {4000 + r} on {hosts[r * len(hosts) // ranks]:>10} device {r:2d} "
              f"[0000:{r:02x}:00] {GPU}" for r in range(ranks)]
    lines += ["#", "#       size         count      type   redop" + ("    root" if root else "")
              + "     time   algbw   busbw #wrong     time   algbw   busbw #wrong"]
    for size in SIZES:
        t = latency_us + size / (gb_per_s * 1e9) * 1e6
        algbw = size / (t * 1e-6) / 1e9
        busbw = algbw * bus_factor(bus or op, ranks)
        cells = f"{t * time_scale:8.2f} {algbw:7.2f} {busbw:7.2f}      0"
        lines.append(f"{size:12d} {size // 2:13d}      bf16     sum" + ("      -1" if root else "") + f" {cells} {cells}")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 99.99", "#"]
    return "\n".join(lines).encode()


def test_a_table_reads_as_one_record_a_size_at_its_out_of_place_time():
    run = parse_nccl_tests(log(), "a.log")
    assert (run.op, run.ranks, run.host, set(run.devices)) == ("all_reduce", 8, "node1", {GPU})
    assert [r.message_bytes for r in run.records] == SIZES
    assert {(r.op, r.group_size) for r in run.records} == {("all_reduce", 8)}
    one_mib = next(r for r in run.records if r.message_bytes == 2**20)
    assert one_mib.median_s == pytest.approx(round(20 + 2**20 / 300e3, 2) * 1e-6, rel=1e-12)  # the printed time
    curves = nccl_tests_curves([(run, "a.log")], 8)
    assert curves.seconds("all_reduce", 2**20, 8) == one_mib.median_s  # a measured size: its time, as printed
    assert curves.group_sizes() == (8,) and curves.seconds("all_gather", 2**20, 8) is None
    assert curves.source == f"by nccl-tests on {GPU} (a.log: all_reduce over 8)"


def test_an_older_table_without_its_name_or_a_root_column_takes_the_collective_given():
    old = log("all_gather_perf", named=False, root=False)
    with pytest.raises(ConfigError, match=r"^b.log: its output does not name its collective .* name it before the "
                                          r"file: --nccl-tests all_reduce=FILE"):
        parse_nccl_tests(old, "b.log")
    run = parse_nccl_tests(old, "b.log", "all_gather")
    assert run.op == "all_gather" and len(run.records) == len(SIZES)


@pytest.mark.parametrize(("data", "op", "said"), [
    (b"all good\n", None, "no '#  Rank N Group G Pid P on HOST device D [BUS] GPU' lines"),
    (log(hosts=("node1", "node2", "node3"), ranks=16), None,
     "its 16 ranks ran unevenly on 3 hosts (node1 6, node2 5, node3 5); a run across nodes is taken with as many"),
    (log(ranks=1), None, "one rank moves nothing"),
    (log(), "all_gather", "given as all_gather, but its output says all_reduce_perf"),
    (log(named=False), "allreduce", "unknown collective 'allreduce'; valid: all_reduce, all_gather"),
    (log("all_gather_perf", named=False, bus="all_reduce"), "all_gather",
     "busbw / algbw is 1.750, not all_gather's 0.875 over 8 ranks: the output of another collective?"),
    (log(time_scale=1e-3), None, "is not size / time"),  # milliseconds where nccl-tests prints microseconds
    (log().replace(b"      0\n", b"\n", 1), None, "12 columns, not the 13 of its header"),
    (log().split(b"#       size")[0], None, "no column header"),
    (log().split(b"# Out of bounds")[0].rsplit(b"time   algbw   busbw #wrong", 1)[0] + b"time   algbw   busbw #wrong",
     None, "no rows of message size and time"),
    (b"#" * (MAX_BYTES + 1), None, "over 1024 KiB"),
    (b"\xff\xfe", None, "not UTF-8 text"),
], ids=["not nccl-tests", "uneven hosts", "one rank", "another op given", "unknown op", "busbw of another op",
        "milliseconds", "a column short", "no header", "no rows", "too large", "not text"])
def test_what_is_not_one_nodes_nccl_tests_table_is_refused_by_name(data, op, said):
    with pytest.raises(ConfigError, match="^x.log") as refused:
        parse_nccl_tests(data, "x.log", op)
    assert said in str(refused.value)


def test_a_file_replaces_the_stores_curve_of_its_collective_and_keeps_the_others():
    stored = CollectiveCurves.from_records([CollectiveRecord("all_reduce", 8, 2**20, 1.0),
                                            CollectiveRecord("all_gather", 8, 2**20, 2.0)], "NVIDIA H100 (nccl)")
    curves = nccl_tests_curves([(parse_nccl_tests(log(), "a.log"), "a.log")], 8, stored)
    assert curves.seconds("all_gather", 2**20, 8) == 2.0 and curves.seconds("all_reduce", 2**20, 8) < 1e-3
    assert curves.source.endswith(", else NVIDIA H100 (nccl)")
    with pytest.raises(ConfigError, match=r"^a.log: 8 ranks on one host, more than the 4 GPUs a node"):
        nccl_tests_curves([(parse_nccl_tests(log(), "a.log"), "a.log")], 4)
    across = parse_nccl_tests(log(ranks=16, hosts=("node1", "node2")), "b.log")
    with pytest.raises(ConfigError, match=r"^b.log: 8 ranks on one host, more than the 4 GPUs a node"):
        nccl_tests_curves([(across, "b.log")], 4)


TWO_NODES = ("node1", "node2")
INTRA, INTER = 3.4e-6, 14e-6  # an NVLink hop's and a network hop's, as NCCL's tuning model has them
HOPS = (INTRA, INTER)


def _spanning(binary: str = "all_reduce_perf", ranks: int = 16, gb_per_s: float = 40.0):
    run = parse_nccl_tests(log(binary, ranks=ranks, hosts=TWO_NODES, gb_per_s=gb_per_s), "x.log")
    curves = nccl_tests_curves([(run, "x.log")], 8)
    return run, curves.across_nodes, {r.message_bytes: r.median_s for r in run.records}


def test_a_run_across_hosts_is_the_networks_curve_for_groups_that_span_nodes():
    """16 ranks on two hosts, 8 on each: no curve inside a node (the planner keeps its link there), one across
    nodes; a group like the run's reads the printed time at a measured size."""
    run, across, printed = _spanning()
    assert (run.nodes, run.ranks_a_node, run.host) == (2, 8, "node1")
    curves = nccl_tests_curves([(run, "x.log")], 8)
    assert curves.curves == {} and curves.seconds("all_reduce", 2**20, 8) is None
    assert across.runs() == (("all_reduce", 16, 8),) and across.text() == "all_reduce over 16, 8 a node"
    assert curves.source == f"by nccl-tests on {GPU} (x.log: all_reduce over 16 on 2 hosts)"
    assert across.seconds("all_reduce", 2**20, 16, 8, 2, *HOPS) == printed[2**20]
    assert across.seconds("all_gather", 2**20, 16, 8, 2, *HOPS) is None


def test_other_groups_across_nodes_load_the_network_as_the_run_did():
    """A ring's node-crossing hops share its members' NICs: a group of 32 with 8 a node is read at the run's curve
    at S x bus_factor(32) / bus_factor(16), plus the latency its ring waits for beyond the run's, as NCCL's tuning
    model counts it (62 steps, 6 between its 4 nodes, against the run's 30 and 2: 28 NVLink hops and 4 network hops
    more); one member a node (16 nodes) at 8 times the bytes, every one of its 30 hops between nodes; a smaller
    group (4, 2 a node), whose ring waits less, at its bus bytes x 8 / 2, no latency taken off. An all-to-all sends
    (n - k) / n of a rank's buffer off the node, its sends to every peer at once; a send/recv its bytes through
    one NIC."""
    _, across, _ = _spanning()
    size = 2**22

    def run(message: float) -> float:  # the run's own curve at a message: 16 ranks, 8 a node, 2 nodes
        return across.seconds("all_reduce", message, 16, 8, 2, *HOPS)

    bigger = size * bus_factor("all_reduce", 32) / bus_factor("all_reduce", 16)
    assert across.seconds("all_reduce", size, 32, 8, 4, *HOPS) == pytest.approx(
        run(bigger) + 28 * INTRA + 4 * INTER, rel=1e-12)
    assert across.seconds("all_reduce", size, 16, 1, 16, *HOPS) == pytest.approx(
        run(8 * size) + 30 * INTER - (28 * INTRA + 2 * INTER), rel=1e-12)
    assert across.seconds("all_reduce", size, 4, 2, 2, *HOPS) == pytest.approx(
        run(size * bus_factor("all_reduce", 4) / bus_factor("all_reduce", 16) * 4), rel=1e-12)
    _, alltoall, _ = _spanning("alltoall_perf")
    # 64 ranks, 8 a node: 56/64 of a rank's buffer leaves its node, against the run's 8/16; one hop either way
    assert alltoall.seconds("all_to_all", size, 64, 8, 8, *HOPS) == pytest.approx(
        alltoall.seconds("all_to_all", size * 56 / 64 * 16 / 8, 16, 8, 2, *HOPS), rel=1e-12)
    _, sendrecv, printed = _spanning("sendrecv_perf")
    assert sendrecv.seconds("send_recv", 2**20, 2, 1, 2, *HOPS) == printed[2**20]


PLAN = ("plan", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "64", "--hardware", "h100-sxm",
        "--tp", "8", "--dp", "1", "--json")

def test_plan_prices_tensor_parallel_all_reduces_at_the_files_times(run_cli, tmp_path):
    path = tmp_path / "all_reduce.log"
    path.write_bytes(log(gb_per_s=30.0))  # a slow node: its all-reduces cost more than NVLink 4's datasheet
    datasheet, measured = (json.loads(run_cli(*PLAN, *extra).stdout) for extra in ((), ("--nccl-tests", str(path))))
    assert measured["hardware"]["cluster"]["measured"] == {
        "source": f"by nccl-tests on {GPU} ({path}: all_reduce over 8)", "group_sizes": [8], "across_nodes": None}

    def all_reduce(plan):
        terms = [t for t in plan["recommendation"]["communication"] if t["op"] == "all_reduce"]
        return {t["link"] for t in terms}, sum(t["seconds"] for t in terms)

    (links, seconds), (datasheet_links, datasheet_seconds) = all_reduce(measured), all_reduce(datasheet)
    assert links == {"measured"} and datasheet_links == {"nvlink4"} and seconds > 2 * datasheet_seconds
    refused = run_cli(*PLAN, "--nccl-tests", str(tmp_path / "missing.log"))
    assert refused.returncode == 2 and f"--nccl-tests {tmp_path / 'missing.log'}: no such file" in refused.stderr


def test_plan_prices_data_parallel_traffic_across_nodes_at_a_spanning_runs_times(run_cli, tmp_path):
    """tp 8 x dp 2 over two nodes: the gradients' all-reduce crosses nodes, one member a node, and takes the
    spanning run's times (slow here); tp's collectives stay on the node's datasheet NVLink, which no file measured."""
    path = tmp_path / "all_reduce_2nodes.log"
    path.write_bytes(log(ranks=16, hosts=TWO_NODES, gb_per_s=5.0))
    args = ("plan", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "64", "--hardware", "h100-sxm",
            "--tp", "8", "--dp", "2", "--zero", "0", "--json")
    datasheet, measured = (json.loads(run_cli(*args, *extra).stdout) for extra in ((), ("--nccl-tests", str(path))))
    assert measured["hardware"]["cluster"]["measured"] == {
        "source": f"by nccl-tests on {GPU} ({path}: all_reduce over 16 on 2 hosts)", "group_sizes": [],
        "across_nodes": [{"op": "all_reduce", "ranks": 16, "ranks_per_node": 8}]}

    def links(plan, axis):
        terms = [t for t in plan["recommendation"]["communication"] if t["axis"] == axis]
        return {t["link"] for t in terms}, sum(t["seconds"] for t in terms)

    (dp_links, dp_s), (dp_sheet_links, dp_sheet_s) = links(measured, "dp"), links(datasheet, "dp")
    assert dp_links == {"measured"} and dp_sheet_links == {"ib-ndr"} and dp_s > 2 * dp_sheet_s
    assert links(measured, "tp")[0] == {"nvlink4"}
    text = " ".join(run_cli(*args[:-1], "--nccl-tests", str(path)).stdout.split())  # as words: the text wraps
    assert "nodes on collectives measured across nodes (all_reduce over 16, 8 a node), else InfiniBand NDR" in text


def test_a_spanning_run_faster_than_the_nodes_own_link_is_held_to_that_link():
    """A run across nodes that claims more than the node's NVLink moves (here 100 TB/s) prices a crossing group
    no faster than the node's own link would: the group's bytes still pass through it."""
    from dataclasses import replace

    from headroom.core.specs.config import TrainConfig
    from headroom.core.specs.interconnect import cluster_for
    from headroom.core.specs.layout import Layout
    from headroom.core.specs.presets import get_preset
    from headroom.core.timing.comm import (
        DEFAULT_COLLECTIVE_EFFICIENCY,
        collective_seconds,
        step_communication,
    )

    run = parse_nccl_tests(log(ranks=16, hosts=TWO_NODES, gb_per_s=1e5), "fast.log")
    cluster = replace(cluster_for("h100-sxm"), measured=nccl_tests_curves([(run, "fast.log")], 8))
    config = TrainConfig(seq_len=4096, layout=Layout(dp=16))  # gradients all-reduced over two nodes, 8 a node
    (term,) = [t for t in step_communication(get_preset("llama3-8b"), config, 1, cluster) if t.axis == "dp"]
    floor = collective_seconds("all_reduce", term.message_bytes, 16, cluster.intra.for_group("all_reduce", 16),
                               DEFAULT_COLLECTIVE_EFFICIENCY)
    assert term.link_key == "measured" and term.seconds == pytest.approx(term.calls * floor, rel=1e-12)


def test_a_row_that_failed_its_own_check_or_took_no_time_is_refused_by_line():
    """nccl-tests counts the wrong values of each result (#wrong, "N/A" without -c 1): a run whose out-of-place
    result was wrong is no measurement; nor is a negative or NaN time. Refused naming the line."""
    lines = log().decode().splitlines()
    row = next(i for i, line in enumerate(lines) if line.split() and line.split()[0] == str(2**20))
    cells = lines[row].split()
    cells[8] = "5"  # the out-of-place #wrong (a root column: size count type redop root time algbw busbw #wrong)
    bad = "\n".join([*lines[:row], "  ".join(cells), *lines[row + 1:]]).encode()
    with pytest.raises(ConfigError, match=rf"^a.log, line {row + 1}: 5 wrong values in the out-of-place result"):
        parse_nccl_tests(bad, "a.log")
    cells[8] = "N/A"
    assert len(parse_nccl_tests("\n".join([*lines[:row], "  ".join(cells), *lines[row + 1:]]).encode(),
                                "a.log").records) == len(SIZES)
    cells[8], cells[5] = "0", "-5.00"
    with pytest.raises(ConfigError, match=rf"^a.log, line {row + 1}: a time of -5.00 us, which no collective takes"):
        parse_nccl_tests("\n".join([*lines[:row], "  ".join(cells), *lines[row + 1:]]).encode(), "a.log")
