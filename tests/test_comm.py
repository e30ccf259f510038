"""Communication model: nccl-tests definitions, placement, and per-step traffic worked by hand."""

import dataclasses
from collections import Counter

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.pipeline import rank_kinds
from headroom.core.memory.static import (
    fsdp_sharding_units,
    rank_parameters,
    rank_tensors,
)
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import HARDWARE
from headroom.core.specs.interconnect import (
    DEFAULT_INTER_NODE_LINK,
    INTER_NODE_LINK,
    INTRA_NODE_LINK,
    LINKS,
    Cluster,
    Link,
    cluster_for,
    default_cluster,
    get_link,
    network,
)
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import RecomputePolicy
from headroom.core.specs.stages import chunk_layers
from headroom.core.timing.collective_ops import OPS, ring_latency_s
from headroom.core.timing.comm import (
    DEFAULT_COLLECTIVE_EFFICIENCY,
    bus_factor,
    collective_seconds,
    crosses_nodes,
    crossing_latency_s,
    exposed_seconds,
    group_link,
    largest_rank,
    largest_rank_parameters,
    members_per_node,
    nodes_spanned,
    overlaps,
    ring_steps,
    step_communication,
    total_seconds,
)
from headroom.core.timing.gradient_buckets import (
    DDP_BUCKET_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    DDP_STACKS,
    greedy_buckets,
)
from headroom.core.units import GB, GiB

IDEAL = Link(key="ideal", name="450 GB/s, no latency", bytes_per_s=450e9, latency_s=0.0, source="test")
SLOW = Link(key="slow", name="50 GB/s, no latency", bytes_per_s=50e9, latency_s=0.0, source="test")
FLAT = Cluster(gpus_per_node=8, intra=IDEAL, inter=SLOW)
SPEC = get_preset("bench-llama-small")  # 4 layers, h 256, 8 heads, 4 kv heads (kv_dim 128), vocab 4096, untied


def config(**layout) -> TrainConfig:
    return TrainConfig(seq_len=128, micro_batch=2, precision="bf16-pure", layout=Layout(**layout))


def terms_of(layout: dict, m: int = 1, **train) -> dict[tuple[str, str], list]:
    cfg = dataclasses.replace(config(**layout), **train)
    out: dict[tuple[str, str], list] = {}
    for term in step_communication(SPEC, cfg, m, FLAT, efficiency=1.0):
        out.setdefault((term.axis, term.op), []).append(term)
    return out


# ---- nccl-tests definitions (doc/PERFORMANCE.md) ----------------------------------------


def test_bus_factors_are_the_nccl_tests_definitions():
    n = 8
    assert bus_factor("all_reduce", n) == 2 * (n - 1) / n
    assert bus_factor("all_gather", n) == (n - 1) / n
    assert bus_factor("reduce_scatter", n) == (n - 1) / n
    assert bus_factor("all_to_all", n) == (n - 1) / n
    assert bus_factor("send_recv", n) == 1
    assert all(bus_factor(op, 1) == 0 and ring_steps(op, 1) == 0 for op in OPS)


def test_all_reduce_of_one_gib_over_eight_ranks_at_450_gb_per_s():
    assert collective_seconds("all_reduce", GiB, 8, IDEAL, 1.0) == pytest.approx(2 * 7 / 8 * 2**30 / 450e9, rel=1e-12)
    assert collective_seconds("all_gather", GiB, 8, IDEAL, 1.0) == pytest.approx(7 / 8 * 2**30 / 450e9, rel=1e-12)
    # An all-reduce moves what a reduce-scatter plus an all-gather of the same S move.
    both = sum(collective_seconds(op, GiB, 8, IDEAL, 1.0) for op in ("reduce_scatter", "all_gather"))
    assert collective_seconds("all_reduce", GiB, 8, IDEAL, 1.0) == pytest.approx(both, rel=1e-12)


def test_latency_is_one_link_latency_per_ring_step_and_efficiency_divides_bandwidth():
    link = dataclasses.replace(IDEAL, latency_s=1e-5)
    assert ring_steps("all_reduce", 8) == 14 and ring_steps("all_gather", 8) == 7 and ring_steps("send_recv", 8) == 1
    assert ring_steps("all_to_all", 8) == 1  # its sends to every peer go at once, as nccl-tests' alltoall issues them
    assert collective_seconds("all_reduce", 0, 8, link) == pytest.approx(14e-5)
    assert collective_seconds("all_gather", GB, 4, IDEAL, 0.5) == pytest.approx(3 / 4 * 1e9 / 225e9)
    assert collective_seconds("all_reduce", GiB, 1, link) == 0.0


@pytest.mark.parametrize("bad", [0, 1.5, -0.1, True])
def test_bad_efficiency_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="efficiency"):
        collective_seconds("all_reduce", GB, 8, IDEAL, bad)


def test_unknown_op_names_the_valid_ones():
    with pytest.raises(ConfigError, match="all_reduce"):
        bus_factor("allreduce", 8)


# ---- interconnect table ---------------------------------------------------------------


def test_every_link_has_a_source_and_a_per_direction_rate():
    for link in LINKS:
        assert link.source and 1e9 <= link.bytes_per_s <= 1e12 and 0 < link.latency_s < 1e-4, link.key
    assert get_link("nvlink4").bytes_per_s == 900e9 / 2  # H100/H200 datasheet 900 GB/s both directions
    assert get_link("nvlink3").bytes_per_s == 600e9 / 2
    assert get_link("nvlink5").bytes_per_s == 1.8e12 / 2
    assert get_link("ib-ndr").bytes_per_s == 400e9 / 8 and get_link("ib-hdr").bytes_per_s == 200e9 / 8


def test_every_gpu_has_a_default_cluster():
    assert set(INTRA_NODE_LINK) == {hw.key for hw in HARDWARE}
    assert set(INTER_NODE_LINK) == {hw.key for hw in HARDWARE}
    generation = {"a100": "ib-hdr", "h100": "ib-ndr", "h200": "ib-ndr", "b200": "ib-ndr", "mi300x": "roce-400g",
                  "l40s": "roce-200g", "rtx-4090": "roce-200g",
                  "h100-hbm2e": "roce-400g"}  # Grand Teton's: torchtitan's performance runs
    for hw in HARDWARE:
        cluster = default_cluster(hw.key)
        family = hw.key if hw.key in generation else hw.key.split("-sxm")[0].split("-pcie")[0]
        assert cluster.gpus_per_node == 8 and cluster.inter.key == generation[family], hw.key
    assert default_cluster("NVIDIA A100-SXM4-80GB").inter.key == "ib-hdr"  # a name torch reports
    assert cluster_for("AMD EPYC 9454").inter.key == DEFAULT_INTER_NODE_LINK  # no datasheet row
    assert default_cluster("a100-sxm-80gb", inter="ib-ndr").inter.key == "ib-ndr"  # --interconnect wins
    assert default_cluster("h100-sxm").intra.key == "nvlink4"
    assert default_cluster("NVIDIA H100 PCIe").intra.key == "pcie5-x16"
    assert default_cluster("l40s", 4).intra.key == "pcie4-x16"


def test_unknown_link_suggests_close_keys():
    with pytest.raises(ConfigError, match="nvlink4"):
        get_link("nvlink-4")


@pytest.mark.parametrize("bad", [0, -8, 2.5, True, "8"])
def test_gpus_per_node_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigError, match="gpus-per-node"):
        Cluster(gpus_per_node=bad, intra=IDEAL, inter=SLOW)


# ---- placement (tp-cp-dp-pp) ----------------------------------------------------------------


def test_tp_eight_stays_in_an_eight_gpu_node_and_dp_crosses_on_the_nic():
    layout = Layout(tp=8, dp=4)
    assert group_link("tp", layout, FLAT) is IDEAL
    assert group_link("dp", layout, FLAT) is SLOW


def test_small_groups_share_a_node_and_a_group_that_does_not_divide_the_node_crosses():
    layout = Layout(tp=2, cp=2, dp=2, pp=2)  # tp stride 1, cp 2, dp 4, pp 8
    assert [crosses_nodes(axis, layout, FLAT) for axis in ("tp", "cp", "dp", "pp")] == [False, False, False, True]
    assert crosses_nodes("tp", Layout(tp=3, dp=3), FLAT)  # ranks 6, 7, 8 straddle two nodes
    assert crosses_nodes("tp", Layout(tp=16), FLAT)
    assert not crosses_nodes("dp", Layout(dp=1), FLAT)


def test_a_run_inside_one_node_crosses_none_however_large_the_node():
    """8 ranks on a node of 12 (or 16 on one of 17): every group is inside the one node, though its ranks do not
    divide the node; a run of 16 on nodes of 12 has groups across two."""
    for gpus, node in ((8, 12), (16, 17), (3, 8)):
        cluster = dataclasses.replace(FLAT, gpus_per_node=node)
        for layout in (Layout(dp=gpus), Layout(tp=gpus)):
            axis = "dp" if layout.dp > 1 else "tp"
            assert (crosses_nodes(axis, layout, cluster), nodes_spanned(axis, layout, cluster)) == (False, 1)
            assert group_link(axis, layout, cluster) is IDEAL
    spread = dataclasses.replace(FLAT, gpus_per_node=12)
    assert (crosses_nodes("dp", Layout(dp=16), spread), nodes_spanned("dp", Layout(dp=16), spread)) == (True, 2)


def test_a_crossing_group_runs_at_the_slower_of_nic_and_node_link():
    pcie = get_link("pcie4-x16")  # 32 GB/s, slower than an NDR NIC
    cluster = Cluster(gpus_per_node=8, intra=pcie, inter=get_link("ib-ndr"))
    assert group_link("dp", Layout(dp=16), cluster) is pcie


def test_a_crossing_group_drives_one_nic_for_each_of_its_members_on_a_node():
    """NCCL runs a ring per NIC and only a ring's node-crossing hop uses one: dp over 4 nodes with tp 1 has 8
    members a node (8 NICs, 400 GB/s, under the node's 450); with tp 2, 4 (200 GB/s); with tp 8, one."""
    assert members_per_node("dp", Layout(dp=32), FLAT) == 8
    assert group_link("dp", Layout(dp=32), FLAT).bytes_per_s == 8 * SLOW.bytes_per_s
    assert members_per_node("dp", Layout(tp=2, dp=16), FLAT) == 4
    assert group_link("dp", Layout(tp=2, dp=16), FLAT).bytes_per_s == 4 * SLOW.bytes_per_s
    assert group_link("pp", Layout(tp=2, cp=2, dp=2, pp=2), FLAT) is SLOW  # stride 8: one member a node
    ib = Cluster(gpus_per_node=8, intra=get_link("nvlink4"), inter=get_link("ib-ndr"))
    assert group_link("dp", Layout(dp=16), ib).bytes_per_s == 400e9  # 8 x 50 GB/s, below NVLink's 450
    assert group_link("dp", Layout(dp=16), Cluster(gpus_per_node=8, intra=IDEAL, inter=IDEAL)) is IDEAL


def test_point_to_point_traffic_across_nodes_leaves_through_each_members_own_nic():
    """A ring drives a NIC per member a node; a send/recv does not: the pipeline's or ring attention's hop across
    nodes moves at one NIC (50 GB/s on NDR), whatever the node holds of the group. An all-to-all over n = 16 ranks,
    8 a node, sends 8 of each rank's 16 slices off the node through its NIC while its bus bytes count 15:
    50 x 15 / 8 = 93.75 GB/s of bus bandwidth; over 64 ranks 50 x 63 / 56 = 56.25, towards one NIC's 50 as the
    nodes grow (DeepSeek-V3's cross-node all-to-all at IB's 50 GB/s a GPU)."""
    ib = Cluster(gpus_per_node=8, intra=get_link("nvlink4"), inter=get_link("ib-ndr"))
    assert members_per_node("cp", Layout(cp=16), ib) == 8
    assert group_link("cp", Layout(cp=16), ib, "all_gather").bytes_per_s == 400e9  # a ring: 8 NICs
    assert group_link("cp", Layout(cp=16), ib, "send_recv") is ib.inter
    assert group_link("pp", Layout(pp=16), ib, "send_recv") is ib.inter
    assert group_link("ep", Layout(dp=16, ep=16), ib, "all_to_all").bytes_per_s == 50e9 * 15 / 8
    assert group_link("ep", Layout(dp=64, ep=64), ib, "all_to_all").bytes_per_s == 50e9 * 63 / 56
    assert group_link("ep", Layout(tp=8, dp=2, ep=2), ib, "all_to_all").bytes_per_s == 50e9 * 1 / 1  # one a node
    shared = default_cluster("h100-sxm", inter="4x200g")  # half a 200 Gb/s NIC a GPU
    assert group_link("pp", Layout(pp=16), shared, "send_recv").bytes_per_s == 12.5e9
    assert group_link("ep", Layout(dp=16, ep=16), shared, "all_to_all").bytes_per_s == 12.5e9 * 15 / 8


def test_across_nodes_only_the_hops_between_nodes_wait_for_the_network():
    """NCCL's tuning model (src/graph/tuning.cc): a ring's nInterSteps hops between its N nodes at the network's
    latency (14 us), the others at the node link's (NVLink 3's 3.4 us), but in a ring across nodes no less than
    the network's post overhead, three times getNetOverhead's 2 us on the AMD hosts of a DGX A100 (1 us on
    Intel's: DGX H100's 3 us is under NVLink 4's 3.4): an all-gather over 1,536 A100s, 8 a node, waits 191
    network hops and 1,344 of 6 us, not 1,535 network ones; an all-reduce over 4 nodes, one member each, 6
    network hops; a send/recv and an all-to-all one."""
    a100 = default_cluster("a100-sxm-80gb")
    assert (a100.net_overhead_s, a100.spanning_hop_s) == (2e-6, 6e-6)
    assert default_cluster("h100-sxm").spanning_hop_s == 3.4e-6
    assert crossing_latency_s("all_gather", "dp-cp", Layout(dp=1536, zero=3), a100) == pytest.approx(
        191 * 14e-6 + 1344 * 6e-6, rel=1e-12)
    assert crossing_latency_s("all_reduce", "dp-cp", Layout(tp=8, dp=4), a100) == pytest.approx(6 * 14e-6, rel=1e-12)
    assert crossing_latency_s("send_recv", "pp", Layout(tp=8, pp=4), a100) == 14e-6
    assert crossing_latency_s("all_to_all", "ep", Layout(dp=16, ep=16), a100) == 14e-6
    assert ring_latency_s("all_gather", 8, 1, 3.4e-6, 14e-6) == pytest.approx(7 * 3.4e-6, rel=1e-12)
    # a plan's gradient all-reduce over 16 A100s, 8 a node, each of DDP's buckets: 2 of its 30 hops on the
    # network, 28 inside the nodes
    terms = step_communication(get_preset("llama3-8b"), TrainConfig(seq_len=2048, layout=Layout(dp=16)), 1, a100)
    (dp,) = [t for t in terms if t.axis == "dp"]
    link = group_link("dp-cp", Layout(dp=16), a100, "all_reduce")
    bandwidth = collective_seconds("all_reduce", dp.message_bytes, 16, link, latency_s=0.0)
    assert dp.calls > 1 and dp.seconds == pytest.approx(dp.calls * (bandwidth + 2 * 14e-6 + 28 * 6e-6), rel=1e-12)
    assert dp.seconds < dp.calls * collective_seconds("all_reduce", dp.message_bytes, 16, link)  # 30 network hops'
    assert (nodes_spanned("dp-cp", Layout(dp=11, pp=8), a100), members_per_node("dp-cp", Layout(dp=11, pp=8), a100)) \
        == (3, 1)  # groups of 11 consecutive ranks on nodes of 8: ranks 22-32 touch three nodes, 1 of them on the last


# ---- parameters per rank ------------------------------------------------------------------


def test_gradient_traffic_counts_the_most_loaded_stage():
    pp2 = Layout(pp=2)
    kinds = rank_kinds(pp2, chunk_layers(pp2, SPEC.n_layers), 1)
    assert largest_rank_parameters(SPEC, pp2) == max(rank_parameters(SPEC, pp2, k) for k in kinds)
    assert largest_rank_parameters(SPEC, Layout()) == SPEC.parameters


# ---- traffic of one step ------------------------------------------------------------------------

B, S, H, E = 2, 128, 256, 2  # micro-batch, seq_len, hidden, bf16
BSHE = B * S * H * E


def test_one_gpu_communicates_nothing():
    assert step_communication(SPEC, config(), 4, FLAT) == ()


def tp_calls(layout: dict, m: int = 1, **train) -> Counter:
    """The step's tensor-parallel calls by (op, message bytes)."""
    calls: Counter = Counter()
    for (axis, op), terms in terms_of(layout, m, **train).items():
        for term in terms:
            if axis == "tp":
                calls[op, term.message_bytes] += term.calls
    return calls


LOSS = ("all_reduce", B * S * 4)  # the loss's fp32 all-reduces over the vocabulary's slices, one value a token
L = SPEC.n_layers


def test_tp_all_reduces_four_times_b_s_h_e_per_layer():
    """Megatron-LM's block: each of attention and MLP reads one input (Shoeybi et al. 2019, Sec. 3). The
    vocabulary's layers add the embedding's and the head's reductions and the loss's three all-reduces."""
    assert tp_calls({"tp": 2}, stack="megatron") == Counter({("all_reduce", BSHE): 4 * L + 2, LOSS: 3})
    terms = [t for terms in terms_of({"tp": 2}, stack="megatron").values() for t in terms if t.axis == "tp"]
    assert not any(t.overlappable for t in terms)
    assert sum(t.seconds for t in terms) == pytest.approx(((4 * L + 2) * BSHE + 3 * B * S * 4) / 450e9)  # bus factor 1


def test_sequence_parallel_moves_the_same_bus_bytes_as_all_reduce():
    """Exposed, the same bytes as the all-reduces (Korthikanti et al. 2022, Sec. 4.2.2); and Megatron-LM, which
    keeps the norms' outputs sharded, gathers them again in backward beside the input-gradient GEMMs: two more
    all-gathers a block, hidden (megatron/core/tensor_parallel/layers.py)."""
    sp = tp_calls({"tp": 4, "sp": True}, stack="megatron")
    assert sp == Counter({("all_gather", BSHE): 6 * L + 2, ("reduce_scatter", BSHE): 4 * L + 2, LOSS: 3})

    def seconds(overlappable: bool, **layout):
        return sum(t.seconds for terms in terms_of(layout, stack="megatron").values() for t in terms
                   if t.overlappable == overlappable)

    assert seconds(False, tp=4, sp=True) == pytest.approx(seconds(False, tp=4))
    regathered = [t for terms in terms_of({"tp": 4, "sp": True}, stack="megatron").values() for t in terms
                  if t.overlappable]
    assert [(t.op, t.calls, t.window) for t in regathered] == [("all_gather", 2 * L, "matmuls")]
    # reference keeps the gathered tensor itself: nothing to gather again
    assert not any(t.overlappable for terms in terms_of({"tp": 4, "sp": True}).values() for t in terms
                   if t.axis == "tp")


def test_the_last_pipeline_stage_reduces_the_head_not_the_embedding():
    assert tp_calls({"tp": 2, "pp": 2}, stack="megatron") == Counter({("all_reduce", BSHE): 4 * L // 2 + 1, LOSS: 3})
    assert tp_calls({"tp": 2, "pp": 2, "sp": True}, stack="megatron") == Counter(
        {("all_gather", BSHE): 6 * L // 2 + 1, ("reduce_scatter", BSHE): 4 * L // 2 + 1, LOSS: 3})


def test_under_autocast_the_residual_streams_collectives_are_fp32():
    """An fp32 model under autocast: the row-parallel outputs are bf16 matmul outputs, but the embedding's
    rows, the norms' outputs and every gradient of the residual stream are fp32, as two gloo ranks measure
    (tests/test_distributed_memory.py). Under FSDP's mixed precision (zero 3) the stream is bf16."""
    amp = {"precision": "amp-bf16"}
    assert tp_calls({"tp": 2}, **amp) == Counter({("all_reduce", BSHE): 2 * L, ("all_reduce", 2 * BSHE): 5 * L + 2,
                                                  LOSS: 3})
    assert tp_calls({"tp": 2, "sp": True}, **amp) == Counter(
        {("all_gather", 2 * BSHE): 2 * L + 2, ("reduce_scatter", BSHE): 2 * L, ("all_gather", BSHE): 2 * L,
         ("all_reduce", 2 * BSHE): 5 * L, ("reduce_scatter", 2 * BSHE): 2, LOSS: 3})
    assert tp_calls({"tp": 2, "dp": 2, "zero": 3}, **amp) == Counter({("all_reduce", BSHE): 7 * L + 2, LOSS: 3})


def test_the_hf_stack_gathers_the_logits_instead_of_reducing_the_loss():
    assert tp_calls({"tp": 2}, stack="hf") == Counter({("all_reduce", BSHE): 7 * L + 2,
                                                       ("all_gather", B * S * SPEC.vocab_size * E): 1})


def test_block_recompute_adds_a_forwards_tp_traffic():
    """Megatron's recompute reruns a block's forward whole; torch's checkpoint stops before the closing
    all-reduce, whose output nothing saved reads."""
    def calls(stack: str, policy: RecomputePolicy) -> int:
        return tp_calls({"tp": 2}, stack=stack, recompute=policy)["all_reduce", BSHE]

    full, selective, none = RecomputePolicy("full"), RecomputePolicy("selective"), RecomputePolicy("none")
    assert (calls("megatron", full), calls("megatron", selective)) == (6 * L + 2, 4 * L + 2)
    assert calls("reference", full) - calls("reference", none) == L
    assert calls("reference", RecomputePolicy("every", 3)) - calls("reference", none) \
        == 2 * L - 2  # segments of 3 and 1 layers: two closings


def test_op_selective_reruns_a_blocks_collectives_but_the_reduce_scatters_torchtitan_keeps():
    """Selective checkpointing keeps matmul outputs, not collectives: each block reruns its forward's, as under
    full recompute, but for the reduce-scatters torchtitan's save list names (two gloo ranks,
    tests/test_distributed_memory.py)."""
    sp = {"tp": 2, "sp": True}
    op_selective, full = RecomputePolicy("op-selective"), RecomputePolicy("full")
    assert tp_calls(sp, recompute=op_selective) == tp_calls(sp, recompute=full)
    titan = {policy: tp_calls(sp, stack="torchtitan", recompute=RecomputePolicy(policy))
             for policy in ("none", "full", "op-selective")}
    for policy in ("full", "op-selective"):
        titan[policy].subtract(titan["none"])  # what the recompute adds; a count below zero would stay
    assert titan["full"] == Counter({("all_gather", BSHE): 2 * L, ("reduce_scatter", BSHE): 2 * L})
    assert titan["op-selective"] == Counter({("all_gather", BSHE): 2 * L})


def test_tp_calls_scale_with_micro_batches_and_context_parallel_halves_the_message():
    assert tp_calls({"tp": 2, "cp": 2}, m=3, stack="megatron") == Counter(
        {("all_reduce", BSHE // 2): 3 * (4 * L + 2), ("all_reduce", B * S // 2 * 4): 3 * 3})


def test_transformer_engines_ring_passes_k_and_v():
    """Megatron-LM's default --cp-comm-type p2p (torch's variants: tests/test_context_parallel.py)."""
    terms = terms_of({"cp": 4, "tp": 2}, stack="megatron")[("cp", "send_recv")]
    forward, backward = terms
    kv = B * (S // 4) * (SPEC.kv_dim // 2) * E * 2
    assert forward.message_bytes == kv and forward.calls == 3 * SPEC.n_layers
    assert backward.message_bytes == 2 * kv and backward.calls == 3 * SPEC.n_layers
    assert forward.overlappable and backward.overlappable


def test_pipeline_sends_activation_and_gradient_per_micro_batch_and_virtual_stage():
    (plain,) = terms_of({"pp": 2}, m=8)[("pp", "send_recv")]
    assert plain.message_bytes == BSHE and plain.calls == 2 * 8 and not plain.overlappable
    (inter,) = terms_of({"pp": 2, "tp": 2, "sp": True, "schedule": "interleaved", "virtual_stages": 2},
                        m=8)[("pp", "send_recv")]
    assert inter.message_bytes == BSHE // 2 and inter.calls == 2 * 8 * 2
    (amp,) = terms_of({"pp": 2}, m=8, precision="amp-bf16")[("pp", "send_recv")]
    assert amp.message_bytes == 2 * BSHE  # an fp32 model's residual stream, autocast or not


def test_ddp_all_reduces_gradients_when_the_stack_syncs_them():
    """The agent's loop reduces every micro-batch; Megatron-LM and the HF Trainer run all but the last under
    no_sync; a pipeline on torch's pipelining defers too; the layout's setting overrides. Each reduction one call a
    bucket where torch's DDP makes them (headroom.core.timing.gradient_buckets), else one."""
    for stack, layout, calls in (("reference", {}, 8), ("megatron", {}, 1), ("hf", {}, 1),
                                 ("reference", {"pp": 2}, 1), ("megatron", {"defer_gradient_sync": False}, 8),
                                 ("reference", {"defer_gradient_sync": True}, 1)):
        (term,) = terms_of({"dp": 4} | layout, m=8, stack=stack)[("dp", "all_reduce")]
        lay = Layout(dp=4, **layout)
        message = largest_rank_parameters(SPEC, lay) * 2
        buckets = len(greedy_buckets([2 * n for n in reversed(rank_tensors(SPEC, lay, largest_rank(SPEC, lay)))],
                                     (DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES))) if stack in DDP_STACKS else 1
        assert buckets > 1 or stack not in DDP_STACKS
        after = stack == "megatron"  # DistributedDataParallelConfig.overlap_grad_reduce: off by default
        assert (term.message_bytes, term.calls, term.window) == (-(-message // buckets), calls * buckets,
                                                                 "" if after else "backward"), stack
        assert term.overlappable is not after
        assert term.note.startswith("gradients " + ("once per step" if calls == 1 else "every micro-batch")
                                    + (", after backward" if after else ""))


def test_torchtitan_replicates_through_fsdp_one_all_reduce_a_unit():
    """torchtitan's data parallelism without sharding is FSDP2 over a replicating mesh dimension: every
    micro-batch each unit's gradients are all-reduced in a call of their own, all of them the rank's gradients."""
    lay = Layout(dp=4)
    terms = terms_of({"dp": 4}, m=8, stack="torchtitan")[("dp", "all_reduce")]
    (runs, _) = fsdp_sharding_units(SPEC, lay, largest_rank(SPEC, lay))
    assert [(t.calls, t.window) for t in terms] == [(8 * n, "backward") for _, n in runs]
    assert sum(t.message_bytes * t.calls for t in terms) == 8 * largest_rank_parameters(SPEC, lay) * 2
    assert all(", a call a unit (" in t.note for t in terms)


def test_megatron_reduces_and_gathers_after_the_pass_unless_asked_to_overlap():
    """Megatron-LM's DDP: gradients reduced after the last backward and ZeRO-1's updated parameters gathered after
    the optimizer step, exposed, unless --overlap-grad-reduce and --overlap-param-gather say otherwise (its ZeRO-2's
    parameters then behind the next step's first forward); DeepSpeed's (the hf stack's) gathers inside its step
    whatever the setting."""
    exposed = terms_of({"dp": 4, "zero": 1}, m=8, stack="megatron")
    assert [(t.op, t.window, t.overlappable) for t in exposed[("dp", "reduce_scatter")] + exposed[("dp", "all_gather")]] \
        == [("reduce_scatter", "", False), ("all_gather", "", False)]
    asked = terms_of({"dp": 4, "zero": 1, "overlap_grad_reduce": True, "overlap_param_gather": True}, m=8,
                     stack="megatron")
    assert [(t.window, t.overlappable) for t in asked[("dp", "reduce_scatter")] + asked[("dp", "all_gather")]] \
        == [("backward", True), ("forward", True)]
    overlapped = {"dp": 4, "zero": 2, "overlap_grad_reduce": True, "overlap_param_gather": True}
    assert terms_of(overlapped, m=8, stack="megatron")[("dp", "all_gather")][0].window == "forward"
    assert [t.window for t in terms_of({"dp": 4, "zero": 1}, m=8, stack="hf")[("dp", "all_gather")]] == ["", ""]
    with pytest.raises(ConfigError, match="overlap-grad-reduce applies to zero 0, 1, 2, not zero 3: FSDP"):
        Layout(dp=4, zero=3, overlap_grad_reduce=True)
    with pytest.raises(ConfigError, match="overlap-param-gather applies to zero 1, 2, not zero 0"):
        Layout(dp=4, overlap_param_gather=False)


def test_zero_1_and_2_reduce_scatter_gradients_and_all_gather_parameters():
    z1 = terms_of({"dp": 4, "zero": 1}, m=8, stack="megatron")
    assert z1[("dp", "reduce_scatter")][0].calls == 1 and z1[("dp", "all_gather")][0].calls == 1
    z2 = terms_of({"dp": 4, "zero": 2}, m=8, stack="megatron")
    assert z2[("dp", "reduce_scatter")][0].calls == 8 and z2[("dp", "all_gather")][0].calls == 1
    assert z2[("dp", "all_gather")][0].message_bytes == SPEC.parameters * 2


def test_the_reference_stacks_zero_1_all_reduces_in_ddps_buckets_and_broadcasts_each_parameter():
    """Plain PyTorch's ZeRO-1, DDP under ZeroRedundancyOptimizer (held call for call against two gloo ranks in
    tests/test_distributed_memory.py): the gradients all-reduced whole every micro-batch, beside backward, in
    DDP's buckets; each updated parameter broadcast from its owner inside the step, exposed, whatever the stack's
    overlap default; --overlap-param-gather refused."""
    terms = terms_of({"dp": 4, "zero": 1}, m=8)
    (reduce,), (broadcast,) = terms[("dp", "all_reduce")], terms[("dp", "broadcast")]
    lay = Layout(dp=4, zero=1)
    buckets = len(greedy_buckets([2 * n for n in reversed(rank_tensors(SPEC, lay, largest_rank(SPEC, lay)))],
                                 (DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES)))
    assert (reduce.calls, reduce.window) == (8 * buckets, "backward")
    assert (broadcast.calls, broadcast.window, broadcast.overlappable) == (len(SPEC.parameter_shapes()), "", False)
    assert broadcast.calls * broadcast.message_bytes - SPEC.parameters * 2 in range(broadcast.calls)
    assert set(terms) == {("dp", "all_reduce"), ("dp", "broadcast")}
    with pytest.raises(ConfigError, match="--overlap-param-gather under --stack reference: its ZeRO-1 is torch's "
                                          "ZeroRedundancyOptimizer.*leave it out \\(the reference stack's ZeRO-2 is "
                                          "FSDP's, zero 3"):
        config(dp=4, zero=1, overlap_param_gather=True).check_sharding()
    # its ZeRO-2 is FSDP's SHARD_GRAD_OP: zero 3 kept gathered from forward to backward, named where zero 2 is asked
    with pytest.raises(ConfigError, match="no ZeRO-2; it shards at --zero 0, 1, 3 .*SHARD_GRAD_OP.*: --zero 3 "
                                          "--reshard-after-forward false$"):
        config(dp=4, zero=2).check_sharding()


HEAD_UNIT = SPEC.norm_parameters() + SPEC.vocab_size * SPEC.hidden
"""The final norm and head's FSDP unit, never resharded after forward."""


def _fsdp_terms(m: int = 4, stack: str = "reference", **layout) -> list:
    """The step's FSDP collectives by kind: (op, window, bytes a pass, calls a pass, passes, group size), each
    kind's one call a unit summed over its units (SPEC's six: the embedding's, four blocks', the head's)."""
    cfg = TrainConfig(seq_len=128, micro_batch=2, precision="amp-bf16", stack=stack,
                      layout=Layout(dp=8, zero=3, **layout))
    kinds: dict[tuple[str, str, int], list] = {}
    for t in step_communication(SPEC, cfg, m, FLAT, efficiency=1.0):
        if t.axis == "dp":
            kinds.setdefault((t.op, t.window, t.group_size), []).append(t)
    out = []
    for (op, window, size), terms in kinds.items():
        units = [int(t.note.split("a call a unit (")[1].split(" of ")[0]) for t in terms]
        passes = {t.calls // n for t, n in zip(terms, units, strict=True)}
        assert len(passes) == 1, terms  # every unit gathered or reduced in every pass
        (each,) = passes
        out.append((op, window, sum(t.message_bytes * n for t, n in zip(terms, units, strict=True)), sum(units), each,
                    size))
    return out


def test_zero_3_gathers_in_forward_and_again_in_backward_and_reduce_scatters_every_micro_batch():
    """FSDP2 issues one all-gather and one reduce-scatter a unit (``foreach_all_gather``, ``foreach_reduce``): six
    units of SPEC gathered in each of the four micro-batches' forwards, the five resharded after forward again in
    their backwards, all six reduced."""
    p = SPEC.parameters
    assert _fsdp_terms() == [("all_gather", "forward", p * 2, 6, 4, 8),  # bf16 gathers
                             ("all_gather", "backward", (p - HEAD_UNIT) * 2, 5, 4, 8),  # not the head's unit
                             ("reduce_scatter", "backward", p * 4, 6, 4, 8)]  # fp32 gradients
    cfg = TrainConfig(seq_len=128, micro_batch=2, precision="amp-bf16", layout=Layout(dp=8, zero=3))
    gathers = [t for t in step_communication(SPEC, cfg, 4, FLAT, efficiency=1.0)
               if t.op == "all_gather" and t.window == "forward"]
    assert sum(t.seconds for t in gathers) == pytest.approx(4 * 7 / 8 * p * 2 / 450e9)  # no latency on FLAT


def test_fsdp_resharding_and_gradient_sync_settings_change_the_calls():
    p = SPEC.parameters
    kept = _fsdp_terms(reshard_after_forward=False)
    assert kept == [("all_gather", "forward", p * 2, 6, 4, 8), ("reduce_scatter", "backward", p * 4, 6, 4, 8)]
    shard = _fsdp_terms(reshard_after_forward=4)  # backward gathers over the 4 ranks a shard was kept over
    assert shard[1] == ("all_gather", "backward", (p - HEAD_UNIT) * 2, 5, 4, 4)
    assert _fsdp_terms(defer_gradient_sync=True)[-1] == ("reduce_scatter", "backward", p * 4, 6, 1, 8)
    assert _fsdp_terms(stack="hf")[-1] == ("reduce_scatter", "backward", p * 4, 6, 1, 8)  # the Trainer's no_sync


def test_torchtitan_under_a_pipeline_gathers_each_unit_once_per_step():
    """torchtitan keeps its units gathered under a pipeline (reshard_after_forward = not pp) and torch's
    pipelining keeps them from one micro-batch to the next and reduces once, in the last backward."""
    cfg = TrainConfig(seq_len=128, micro_batch=2, precision="amp-bf16", stack="torchtitan",
                      layout=Layout(pp=2, dp=4, zero=3))
    def calls(train: TrainConfig) -> list[tuple[str, str, int]]:  # a stage's calls by kind, its 3 units summed
        kinds: dict[tuple[str, str], int] = {}
        for t in step_communication(SPEC, train, 8, FLAT):
            if t.axis == "dp":
                kinds[t.op, t.window] = kinds.get((t.op, t.window), 0) + t.calls
        return [(op, window, n) for (op, window), n in kinds.items()]

    assert calls(cfg) == [("all_gather", "forward", 3), ("reduce_scatter", "backward", 3)]
    reference = dataclasses.replace(cfg, stack="reference")  # resharded after forward, kept between micro-batches
    # the last stage, the largest (two blocks and the head): its head's unit, never resharded, not gathered again
    assert calls(reference) == [("all_gather", "forward", 8 * 3), ("all_gather", "backward", 8 * 2),
                                ("reduce_scatter", "backward", 3)]


def test_context_parallel_ranks_join_the_gradient_reduction():
    (term,) = terms_of({"cp": 2})[("dp", "all_reduce")]
    assert term.group_size == 2
    (term,) = terms_of({"cp": 2, "dp": 4, "tp": 2})[("dp", "all_reduce")]
    assert term.group_size == 8 and term.link_key == "slow"  # tp 2 x cp 2 x dp 4 = 16 ranks > one node


def test_exposed_time_hides_overlappable_terms_up_to_their_compute():
    terms = step_communication(SPEC, config(tp=2, dp=4), 1, FLAT)
    tp = sum(t.seconds for t in terms if t.axis == "tp")
    dp = sum(t.seconds for t in terms if t.axis == "dp")
    assert total_seconds(terms) == pytest.approx(tp + dp)
    assert exposed_seconds(terms, {}) == pytest.approx(tp + dp)
    assert exposed_seconds(terms, {("dp", "backward"): dp / 4}) == pytest.approx(tp + 3 * dp / 4)
    assert exposed_seconds(terms, {("dp", "backward"): 10 * dp, ("tp", ""): 10 * tp}) == pytest.approx(tp)
    assert exposed_seconds(terms, {("dp", "forward"): 10 * dp}) == pytest.approx(tp + dp)  # not its window
    with pytest.raises(ConfigError, match="dp backward"):
        exposed_seconds(terms, {("dp", "backward"): -1.0})


def test_each_hidden_axis_says_how_close_it_came_to_being_exposed():
    """The slack of hidden collectives: a window four times the dp traffic is 25% full with three quarters to
    spare; a window of a quarter leaves three quarters exposed; tp never overlaps and has no entry."""
    terms = step_communication(SPEC, config(tp=2, dp=4), 1, FLAT)
    dp = sum(t.seconds for t in terms if t.axis == "dp")
    (roomy,) = overlaps(terms, {("dp", "backward"): 4 * dp})
    assert (roomy.axis, roomy.window, roomy.communication_s, roomy.window_s) == ("dp", "backward", dp, 4 * dp)
    assert (roomy.exposed_s, roomy.slack_s, roomy.fill) == (0.0, pytest.approx(3 * dp), pytest.approx(0.25))
    assert roomy.text() == (f"dp backward {dp:.3f} s of collectives under {4 * dp:.3f} s of compute (25%): "
                            f"{3 * dp:.3f} s to spare")
    (tight,) = overlaps(terms, {("dp", "backward"): dp / 4})
    assert (tight.exposed_s, tight.slack_s) == (pytest.approx(3 * dp / 4), pytest.approx(-3 * dp / 4))
    assert tight.text().endswith(f"(400%): {3 * dp / 4:.3f} s exposed")
    (none,) = overlaps(terms, {})
    assert (none.window_s, none.fill, none.exposed_s) == (0.0, None, dp)


def test_default_efficiency_is_the_nccl_ring_figure():
    assert DEFAULT_COLLECTIVE_EFFICIENCY == pytest.approx(370 / 450, abs=0.03)


def test_accumulation_steps_must_be_positive():
    with pytest.raises(ConfigError, match="accumulation-steps"):
        step_communication(SPEC, config(dp=2), 0, FLAT)


# ---- a mesh without a switch (MI300X) -----------------------------------------------------------


def test_on_infinity_fabric_a_group_reaches_one_64_gb_link_per_peer():
    """MI300X: 7 links of 128 GB/s both ways (64 each way), one to each peer; a group of n uses n - 1."""
    fabric = default_cluster("mi300x")
    assert fabric.intra.key == "infinity-fabric" and fabric.intra.bytes_per_s == 448e9
    per_link = 128e9 / 2
    seen = {size: group_link("tp", Layout(tp=size), fabric, "all_gather").bytes_per_s for size in (2, 4, 8)}
    assert seen == {2: per_link, 4: 3 * per_link, 8: 7 * per_link}
    assert group_link("tp", Layout(tp=2), fabric, "all_gather").name.endswith(": 1 of its 7 links")
    assert group_link("pp", Layout(pp=8), fabric, "send_recv").bytes_per_s == per_link  # one neighbour
    assert group_link("cp", Layout(cp=4), fabric, "all_to_all").bytes_per_s == 3 * per_link
    # Across nodes the NIC (50 GB/s) is slower than the 7 links a 16-rank ring drives inside each node.
    assert group_link("dp", Layout(dp=16), fabric).key == "roce-400g"  # MI300X nodes on 400 GbE
    # NVSwitch gives any group all of NVLink.
    switch = default_cluster("h100-sxm")
    assert group_link("tp", Layout(tp=2), switch, "all_gather") is switch.intra


def test_a_pairs_all_gather_on_infinity_fabric_takes_four_times_an_eight_gpu_groups():
    """Bus time S x (n-1)/n / B: tp 2 on one 64 GB/s link (S/128 GB/s) against tp 8 on all seven (S/512 GB/s)."""
    fabric = default_cluster("mi300x")
    pair = collective_seconds("all_gather", 2**30, 2, group_link("tp", Layout(tp=2), fabric, "all_gather"))
    eight = collective_seconds("all_gather", 2**30, 8, group_link("tp", Layout(tp=8), fabric, "all_gather"))
    latency = fabric.intra.latency_s
    assert pair - latency == pytest.approx(2**30 * (1 / 2) / (64e9 * 0.8), rel=1e-12)
    assert eight - 7 * latency == pytest.approx(2**30 * (7 / 8) / (448e9 * 0.8), rel=1e-12)
    assert (pair - latency) / (eight - 7 * latency) == pytest.approx(4, rel=1e-12)


# ---- a network given as NICs x Gb/s a node ----------------------------------------------------------


def test_a_network_is_named_or_given_by_its_nics_and_line_rate():
    link, nics = network("4x200g")
    assert (link.key, link.bytes_per_s, nics) == ("4x200g", 25e9, 4)
    assert network(" 8 X 400 Gb/s ")[0].key == "8x400g" and network("2x100gbe")[0].bytes_per_s == 12.5e9
    assert network("ib-ndr") == (get_link("ib-ndr"), 0)
    for bad, message in (("0x200g", "NICs a node must be 1-64"), ("4x0g", "line rate"),
                         ("4x200tb", "unknown interconnect '4x200tb'")):
        with pytest.raises(ConfigError, match=message):
            network(bad)


def test_the_groups_of_a_node_share_its_nics():
    """Four 200 Gb/s NICs for eight GPUs, half a NIC a GPU: eight dp members a node drive the four (100 GB/s,
    against 200 with a NIC each); under tp 8 the node's eight dp groups, one member each, share them too (12.5
    GB/s each, against a NIC each); sixteen NICs for eight GPUs give a node's eight members all sixteen."""
    shared = default_cluster("h100-sxm", inter="4x200g")
    own = default_cluster("h100-sxm", inter="roce-200g")
    assert shared.nics_per_node == 4 and own.nics_per_node == 0
    wide, narrow = Layout(dp=16), Layout(tp=8, dp=2)
    assert [group_link("dp", wide, c).bytes_per_s for c in (shared, own)] == [100e9, 200e9]
    assert [group_link("dp", narrow, c).bytes_per_s for c in (shared, own)] == [12.5e9, 25e9]
    assert group_link("dp", Layout(tp=4, dp=4), shared).bytes_per_s == 25e9  # two members a node, one NIC's worth
    assert group_link("dp", wide, default_cluster("h100-sxm", inter="16x200g")).bytes_per_s == 400e9
