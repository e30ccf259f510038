"""DeepEP's and HybridEP's dispatch of a mixture of experts' tokens across nodes (``--ep-comm``,
headroom.core.timing.expert_dispatch): the other nodes a token reaches against every routing counted out, the
traffic it puts on a NIC and on NVLink, what is refused with it, and where the setting goes (search, exports,
flags, the Plan page). The traffic is the model's, from DeepSeek-V3's report and Megatron-LM's MoE guide: DeepEP
has no CPU path to measure it on."""

from __future__ import annotations

import dataclasses
import itertools
import json
from fractions import Fraction

import pytest

from headroom.core.errors import ConfigError
from headroom.core.planning.layout_search import candidate_layouts
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.interconnect import cluster_for
from headroom.core.specs.layout import Layout
from headroom.core.specs.precision import DTYPE_BYTES
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.timing.comm import (
    collective_seconds,
    group_link,
    members_per_node,
    step_communication,
)
from headroom.core.timing.expert_dispatch import remote_nodes
from headroom.dashboard.planning import PlanInputs, build_layout

QWEN = get_preset("qwen3-30b-a3b")  # 128 experts, 8 a token, 48 expert layers
CLUSTER = cluster_for("h100-sxm")  # 8 GPUs a node on NVLink 4, one NDR NIC a GPU


@pytest.mark.parametrize(("experts", "k", "nodes"), [(8, 2, 2), (12, 3, 3), (16, 4, 4), (8, 8, 4), (6, 1, 3)])
def test_the_other_nodes_a_token_reaches_are_every_routing_counted_out(experts, k, nodes):
    """Every set of k experts out of E, alike (balanced routing), E / N on each node, the token on node 0: the
    mean count of other nodes its experts are on, exactly, is the formula's."""
    per_node = experts // nodes
    routings = list(itertools.combinations(range(experts), k))
    reached = sum(len({e // per_node for e in chosen} - {0}) for chosen in routings)
    assert remote_nodes(experts, k, nodes) == pytest.approx(float(Fraction(reached, len(routings))), rel=1e-12)


def test_one_node_reaches_no_other_and_a_token_on_every_expert_reaches_them_all():
    assert remote_nodes(128, 8, 1) == 0
    assert remote_nodes(16, 16, 4) == 3
    # Qwen3-30B-A3B over two nodes: 1 - C(64, 8) / C(128, 8)
    assert remote_nodes(128, 8, 2) == pytest.approx(0.99690, abs=1e-5)
    for args, message in (((128, 8, 3), "do not spread evenly over 3 nodes"), ((8, 9, 2), "with 9 a token"),
                          ((0, 8, 2), "experts must be a positive integer")):
        with pytest.raises(ConfigError, match=message):
            remote_nodes(*args)


def _config(comm: str | None, ep: int = 16, dp: int = 16, **changes) -> TrainConfig:
    fields = {"seq_len": 4096, "micro_batch": 1, "stack": "megatron", "precision": "bf16-master",
              "layout": Layout(dp=dp, zero=1, ep=ep, ep_comm=comm)} | changes
    config = TrainConfig(**fields)
    config.check_model(QWEN)
    return config


def _ep_terms(config: TrainConfig, micro_batches: int = 4):
    return [t for t in step_communication(QWEN, config, micro_batches, CLUSTER) if t.axis == "ep"]


def test_across_nodes_a_token_crosses_once_to_each_other_node_and_fans_out_over_nvlink():
    """ep 16 over two nodes: each of a rank's 4,096 tokens goes to the other node 0.997 times on average, 2,048 x 2
    bytes each, through the rank's NIC (one NDR NIC: 50 GB/s), while its 8 copies reach their GPUs over NVLink as
    an all-to-all among the node's 8; one kernel does both, the slower sets the call. The all-to-all instead sends
    8 of every 16 copies off the node through that NIC: four times the RDMA bytes."""
    (plain,), (deep,) = _ep_terms(_config(None)), _ep_terms(_config("deepep"))
    tokens, token_bytes = 4096, QWEN.hidden * DTYPE_BYTES["bf16"]
    rdma = round(tokens * remote_nodes(128, 8, 2) * token_bytes)
    nic = group_link("ep", _config("deepep").layout, CLUSTER, "send_recv")
    assert nic.bytes_per_s == 50e9
    across = collective_seconds("send_recv", rdma, 2, nic)
    inside = collective_seconds("all_to_all", tokens * 8 * token_bytes, 8, CLUSTER.intra.for_group("all_to_all", 8))
    assert across > inside
    assert (deep.message_bytes, deep.calls, deep.link_key) == (rdma, plain.calls, "ib-ndr")
    assert deep.seconds == pytest.approx(deep.calls * across, rel=1e-12)
    assert plain.seconds > 3.5 * deep.seconds
    assert "deepep: each token once to each other node of its experts (1.00 of 1 on average)" in deep.note


def test_inside_a_node_deepep_is_the_all_to_all_and_hybridep_prices_as_deepep():
    """ep 8 on one node's GPUs never crosses nodes: DeepEP's intranode kernel is an NVLink all-to-all, priced as
    the all-to-all is; HybridEP sends what DeepEP sends (its guide names faster kernels, not other traffic)."""
    assert _ep_terms(_config("deepep", ep=8)) == _ep_terms(_config(None, ep=8))
    (deep,), (hybrid,) = _ep_terms(_config("deepep")), _ep_terms(_config("hybridep"))
    assert (hybrid.message_bytes, hybrid.seconds) == (deep.message_bytes, deep.seconds)
    assert "hybridep: each token once" in hybrid.note


def test_beside_another_micro_batch_it_splits_as_the_all_to_all_does():
    alone, beside = _ep_terms(_config("deepep", layout=Layout(dp=16, ep=16, ep_comm="deepep", ep_overlap=True),
                                      recompute=parse_policy("selective")))
    (whole,) = _ep_terms(_config("deepep", recompute=parse_policy("selective")))
    assert (alone.overlappable, beside.overlappable, beside.window) == (False, True, "other micro-batch")
    assert alone.seconds + beside.seconds == pytest.approx(whole.seconds, rel=1e-12)


def test_what_runs_it_and_what_it_runs_without_are_refused_by_name():
    with pytest.raises(ConfigError, match="--stack reference --ep-comm deepep: only torchtitan and megatron"):
        _config("deepep", stack="reference")
    dropping = dataclasses.replace(QWEN, capacity_factor=1.25)
    with pytest.raises(ConfigError, match="--ep-comm hybridep with capacity factor 1.25: its dispatch is dropless"):
        TrainConfig(seq_len=4096, stack="megatron", layout=Layout(dp=16, ep=16, ep_comm="hybridep")).check_model(
            dropping)
    with pytest.raises(ConfigError, match="ep-comm deepep says how expert-parallel ranks exchange tokens: it needs ep"):
        Layout(dp=2, ep_comm="deepep")
    with pytest.raises(ConfigError, match="ep-comm must be one of all-to-all, deepep, hybridep, got 'nccl'"):
        Layout(dp=2, ep=2, ep_comm="nccl")  # type: ignore[arg-type]
    assert str(Layout(dp=16, ep=16, ep_comm="deepep")).endswith("ep 16, ep by deepep")


def test_a_pinned_dispatcher_goes_only_where_experts_are_split():
    train = TrainConfig(seq_len=4096, stack="megatron", layout=Layout(ep=2, dp=2, ep_comm="deepep"))
    layouts = candidate_layouts(QWEN, train, 64, 16, 8, frozenset({"ep_comm"}))
    assert {layout.ep_comm for layout in layouts if layout.ep > 1} == {"deepep"}
    assert {layout.ep_comm for layout in layouts if layout.ep == 1} == {None}


PLAN = ["plan", "--model", "qwen3-30b-a3b", "--hardware", "h100-sxm", "--dp", "16", "--zero", "1", "--ep", "16",
        "--seq-len", "4096", "--global-batch", "1024", "--micro-batch", "1", "--precision", "bf16-master",
        "--budget", "200GB"]


def test_plans_and_exports_carry_it(run_cli):
    planned = json.loads(run_cli(*PLAN, "--stack", "megatron", "--ep-comm", "deepep", "--json").stdout)
    assert planned["recommendation"]["layout"]["ep_comm"] == "deepep"
    megatron = run_cli(*PLAN, "--stack", "megatron", "--ep-comm", "hybridep", "--export", "megatron")
    assert megatron.returncode == 0, megatron.stderr
    assert ("--expert-model-parallel-size 16 --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep"
            in megatron.stdout)
    titan = run_cli(*PLAN, "--stack", "torchtitan", "--zero", "3", "--ep-comm", "deepep", "--export", "torchtitan")
    assert titan.returncode == 0, titan.stderr
    assert 'call it with moe_comm_backend="deepep"' in " ".join(titan.stdout.split())
    speed = run_cli(*PLAN, "--stack", "megatron", "--ep-comm", "deepep", "--export", "deepspeed")
    assert speed.returncode == 0, speed.stderr
    assert "DeepSpeed's MoE exchanges the experts' tokens by all-to-all, not deepep" in " ".join(speed.stderr.split())


def test_the_plan_page_pins_it_and_its_links_keep_it():
    inputs = PlanInputs(gpus=16, ep="16", ep_comm="deepep")
    layout = build_layout(inputs)
    assert (layout.ep, layout.ep_comm) == (16, "deepep")
    assert PlanInputs.from_query(inputs.to_query()).ep_comm == "deepep"


def test_nics_shared_by_a_nodes_gpus_and_one_member_a_node():
    """Four 200 Gb/s NICs for eight GPUs: the RDMA part goes through half a NIC, 12.5 GB/s. On nodes of one GPU the
    ep group holds one a node: 16 nodes, a token reaching 15 (1 - C(120, 8) / C(128, 8)) of them, no NVLink part."""
    shared = cluster_for("h100-sxm", inter="4x200g")
    config = _config("deepep")
    (term,) = [t for t in step_communication(QWEN, config, 4, shared) if t.axis == "ep"]
    nic = group_link("ep", config.layout, shared, "send_recv")
    assert nic.bytes_per_s == 12.5e9 and term.link_key == nic.key
    rdma = round(4096 * remote_nodes(128, 8, 2) * QWEN.hidden * 2)
    assert term.seconds == pytest.approx(term.calls * collective_seconds("send_recv", rdma, 2, nic), rel=1e-12)
    single = cluster_for("h100-sxm", gpus_per_node=1)  # a GPU a node: 16 nodes, nothing over NVLink
    (alone,) = [t for t in step_communication(QWEN, config, 4, single) if t.axis == "ep"]
    assert alone.message_bytes == round(4096 * remote_nodes(128, 8, 16) * QWEN.hidden * 2)
    assert alone.link_key == "ib-ndr" and "(6.18 of 15 on average)" in alone.note and "(1 a node)" in alone.note


def test_a_group_that_straddles_nodes_unevenly_is_priced_as_an_all_to_all_at_its_fewest_members():
    """ep 12 over nodes of 8: one group holds 8 and 4 of a node, another 4 and 8; the crossing runs at the 4's
    NICs' worth, 50 x 11 / 8 GB/s, no division by zero where a group's members once counted as all of it; DeepEP,
    whose peers are whole nodes, is priced as the all-to-all and says so."""
    layout = Layout(dp=24, zero=1, ep=12)
    assert members_per_node("ep", layout, CLUSTER) == 4
    assert group_link("ep", layout, CLUSTER, "all_to_all").bytes_per_s == 50e9 * 11 / 8
    assert members_per_node("ep", Layout(dp=24, ep=6), CLUSTER) == 2  # ranks 6-11: 2 on one node, 4 on the next
    ninety_six = dataclasses.replace(QWEN, n_experts=96)  # experts that split over 12 ranks

    def terms(comm: str | None):
        config = TrainConfig(seq_len=4096, stack="megatron", layout=Layout(dp=24, zero=1, ep=12, ep_comm=comm))
        config.check_model(ninety_six)
        return [t for t in step_communication(ninety_six, config, 4, CLUSTER) if t.axis == "ep"]

    (plain,), (deep,) = terms(None), terms("deepep")
    assert (deep.message_bytes, deep.seconds) == (plain.message_bytes, plain.seconds)
    assert "deepep over a group that straddles nodes unevenly priced as an all-to-all" in deep.note


def test_a_plan_across_nodes_by_all_to_all_says_what_deepep_would_give(run_cli):
    """ep 16 over two nodes under megatron, its all-to-all left as is: the plan evaluates its recommendation again by
    DeepEP and says so, the figures those of the same configuration planned with --ep-comm deepep; nothing to say
    where the dispatcher is chosen, the experts stay in a node, or the stack has no DeepEP."""
    pins = ["--micro-batch", "1", "--recompute", "block-6"]
    plain = json.loads(run_cli(*PLAN, "--stack", "megatron", *pins, "--json").stdout)
    deep = json.loads(run_cli(*PLAN, "--stack", "megatron", *pins, "--ep-comm", "deepep", "--json").stdout)
    hint = plain["dispatch_hint"]
    faster = deep["recommendation"]["tokens_per_s"] / plain["recommendation"]["tokens_per_s"] - 1
    assert hint.startswith("the experts' tokens cross nodes by all-to-all, ")
    assert f"{deep['recommendation']['tokens_per_s']:,.0f} tokens/s ({faster:+.0%})" in hint
    assert deep["dispatch_hint"] is None
    inside = json.loads(run_cli(*PLAN[:PLAN.index("--ep")], *PLAN[PLAN.index("--ep") + 2:], "--ep", "8",
                                "--stack", "megatron", *pins, "--json").stdout)
    assert inside["dispatch_hint"] is None
    text = " ".join(run_cli(*PLAN, "--stack", "megatron", *pins).stdout.split())
    assert f"expert parallel: {hint}" in text


def test_a_capacity_factor_leaves_the_plan_without_a_hint_rather_than_failing(run_cli):
    """DeepEP's dispatch is dropless: a plan of experts with a capacity factor across nodes says nothing of it, and
    plans as before."""
    planned = run_cli(*PLAN, "--stack", "megatron", "--micro-batch", "1", "--capacity-factor", "1.25", "--json")
    assert planned.returncode == 0, planned.stderr
    result = json.loads(planned.stdout)
    assert result["recommendation"] is not None and result["dispatch_hint"] is None
