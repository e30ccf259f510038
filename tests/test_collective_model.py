"""Measured collective curves in the planner, the topology the agent records, and exposed communication.

Each number below is worked by hand from the inputs written next to it.
"""

from __future__ import annotations

import math

import pytest

from headroom.agent.comm_time import host_exposed_s, kernel_exposed_s, overlap, union
from headroom.agent.topology import parse_topology
from headroom.core.errors import ConfigError
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.interconnect import cluster_for
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.timing.collective_curves import CollectiveCurves, CollectiveRecord
from headroom.core.timing.comm import MEASURED, step_communication

KiB, MiB = 2**10, 2**20
# A made-up all-reduce over 2 ranks: 10 us at 1 KiB, 100 us at 1 MiB, 400 us at 4 MiB; two runs at 1 MiB.
RECORDS = [
    CollectiveRecord("all_reduce", 2, KiB, 10e-6),
    CollectiveRecord("all_reduce", 2, MiB, 90e-6),
    CollectiveRecord("all_reduce", 2, MiB, 110e-6),
    CollectiveRecord("all_reduce", 2, 4 * MiB, 400e-6),
]
CURVES = CollectiveCurves.from_records(RECORDS, "test box")


def test_a_curve_holds_the_median_of_each_size():
    assert CURVES.curves == {("all_reduce", 2): ((KiB, 10e-6), (MiB, 100e-6), (4 * MiB, 400e-6))}


def test_measured_sizes_read_back_exactly_and_between_them_log_log():
    assert CURVES.seconds("all_reduce", MiB, 2) == 100e-6
    # 2 MiB is half-way between 1 and 4 MiB in log size: sqrt(100 x 400) us
    assert math.isclose(CURVES.seconds("all_reduce", 2 * MiB, 2), 200e-6)


def test_below_the_smallest_size_latency_above_the_largest_bandwidth():
    assert CURVES.seconds("all_reduce", 16, 2) == 10e-6
    assert math.isclose(CURVES.seconds("all_reduce", 16 * MiB, 2), 4 * 400e-6)


def test_another_group_size_reads_the_curve_at_equal_bus_bytes():
    # all-reduce over 4: bus factor 2 x 3/4 = 1.5; over 2: 1. So 1 MiB over 4 ranks moves the bus bytes
    # of 1.5 MiB over 2: sqrt-interpolated between 1 and 4 MiB at log4(1.5).
    w = math.log(1.5) / math.log(4)
    expected = math.exp(math.log(100e-6) + w * (math.log(400e-6) - math.log(100e-6)))
    assert math.isclose(CURVES.seconds("all_reduce", MiB, 4), expected)


def test_an_op_never_measured_has_no_curve_and_nothing_moves_for_one_rank():
    assert CURVES.seconds("all_gather", MiB, 2) is None
    assert CURVES.seconds("all_reduce", MiB, 1) == 0.0
    with pytest.raises(ConfigError):
        CURVES.seconds("all_reduce", -1, 2)


def test_the_planner_times_groups_inside_a_node_from_the_curve():
    spec = get_preset("bench-llama-tiny")
    config = TrainConfig(seq_len=64, micro_batch=2, precision="fp32", layout=Layout(dp=2))
    (term,) = step_communication(spec, config, 1, cluster_for("cpu", 8, measured=CURVES))
    assert (term.op, term.link_key) == ("all_reduce", MEASURED)
    assert term.seconds == CURVES.seconds("all_reduce", term.message_bytes, 2)
    # Across nodes the box measured nothing: datasheet links time it (the slower of PCIe and the NIC here).
    (across,) = step_communication(spec, config, 1, cluster_for("cpu", 1, measured=CURVES))
    assert across.link_key == "pcie4-x16"


# ---- topology -------------------------------------------------------------------------------------------

# `nvidia-smi topo -m` on a DGX H100 (8 x H100 SXM), as printed in the kubernetes.recipes guide
# "DGX H100 nvidia-smi topo -m Guide" (L. Berton); NIC rows and legend added as nvidia-smi prints them.
DGX_H100 = """\
        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    NIC0    CPU Affinity    NUMA Affinity
GPU0     X      NV18    NV18    NV18    NV18    NV18    NV18    NV18    PXB     0-51    0
GPU1    NV18     X      NV18    NV18    NV18    NV18    NV18    NV18    SYS     0-51    0
GPU2    NV18    NV18     X      NV18    NV18    NV18    NV18    NV18    SYS     0-51    0
GPU3    NV18    NV18    NV18     X      NV18    NV18    NV18    NV18    SYS     0-51    0
GPU4    NV18    NV18    NV18    NV18     X      NV18    NV18    NV18    SYS     52-103  1
GPU5    NV18    NV18    NV18    NV18    NV18     X      NV18    NV18    SYS     52-103  1
GPU6    NV18    NV18    NV18    NV18    NV18    NV18     X      NV18    SYS     52-103  1
GPU7    NV18    NV18    NV18    NV18    NV18    NV18    NV18     X      SYS     52-103  1
NIC0    PXB     SYS     SYS     SYS     SYS     SYS     SYS     SYS      X

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
"""


def test_the_topology_matrix_is_read_pair_by_pair():
    topology = parse_topology(DGX_H100)
    assert sorted(topology["links"]) == [f"GPU{i}" for i in range(8)]
    assert topology["links"]["GPU0"] == {**{f"GPU{i}": "NV18" for i in range(1, 8)}, "NIC0": "PXB"}
    assert topology["links"]["GPU5"]["NIC0"] == "SYS"
    assert topology["nvlinks_per_gpu"] == {f"GPU{i}": 18 for i in range(8)}
    assert topology["nics"] == {"NIC0": "mlx5_0"}


def test_no_matrix_no_topology():
    assert parse_topology("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.") == {}


# ---- exposed communication -------------------------------------------------------------------------------


def test_intervals_are_counted_once():
    assert union([(0, 2), (1, 3), (5, 6), (6, 6)]) == [(0, 3), (5, 6)]
    assert overlap([(0, 3), (5, 6)], [(2, 5.5)]) == 1.5


def test_kernels_expose_what_no_compute_covers():
    # NCCL kernels 0-4 and 6-8 s; compute 1-3 and 7-10: exposed 0-1, 3-4 and 6-7 = 3 s.
    assert kernel_exposed_s([(0, 4), (6, 8)], [(1, 3), (7, 10)]) == 3


def test_the_training_thread_waits_in_collectives_and_fsdp_waits():
    events = [
        ("c10d::allreduce_", 1, 0.0, 2.0),
        ("c10d::wait", 1, 1.0, 3.0),  # nested and overlapping: counted once
        ("FSDP::post_backward_rs_wait (blocks.0)", 1, 4.0, 4.5),
        ("aten::mm", 1, 5.0, 9.0),
        ("gloo:all_reduce", 2, 0.0, 9.0),  # gloo's own thread: not the step's wait
    ]
    assert host_exposed_s(events, thread=1) == 3.5
