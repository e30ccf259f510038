"""A layout search leaves out what cannot tie with the fastest (headroom.core.planning.pruning): every candidate's
step is at least its floor (headroom.core.timing.step.step_floor_s), and a pruned search recommends what the
exhaustive one does, with the same near ties, on every stack, schedule and model kind the search tries."""

from __future__ import annotations

import dataclasses
import math

import pytest

from headroom.core.measured.calibration import uncalibrated
from headroom.core.planning.planner import NEAR, PlanRequest, layout_floor_s, plan
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.interconnect import default_cluster
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.timing.op_time import ops_time
from headroom.core.timing.step import datasheet_profile, step_floor_s
from headroom.core.timing.step_ops import forward_ops

H100 = datasheet_profile(get_hardware("h100-sxm"))
A100 = datasheet_profile(get_hardware("a100-sxm-80gb"))
SMALL = get_preset("bench-llama-small")
MIXED_MOE = dataclasses.replace(  # two dense blocks, then experts: a stage of two kinds, priced whole
    get_preset("bench-llama-small"), name="moe-small", n_layers=4, n_experts=4, experts_per_token=2,
    expert_ffn_hidden=256, dense_layers=2)


def _request(spec, gpus, batch, seq_len, hardware="h100-sxm", layout=Layout(), pinned=frozenset(), **train):
    return PlanRequest(spec=spec, train=TrainConfig(seq_len=seq_len, layout=layout, **train), global_batch=batch,
                       gpus=gpus, pinned=pinned, cluster=default_cluster(hardware))


SEARCHES = {
    "megatron, 1f1b and interleaved": (_request(SMALL, 8, 16, 256, stack="megatron"), H100),
    "reference, early stop, dropout": (_request(get_preset("bench-gpt-small"), 8, 8, 128, dropout=0.1), A100),
    "torchtitan, zbv": (_request(SMALL, 8, 16, 256, stack="torchtitan"), H100),
    "fp8 and precision searched": (dataclasses.replace(
        _request(SMALL, 4, 8, 256, stack="torchtitan"), fp8_search=True, precision_search=True), H100),
    "offload allowed, tight budget": (dataclasses.replace(
        _request(SMALL, 8, 16, 512), allow_offload=True, budget_bytes=int(2.2e9)), H100),
    "experts over ep, dense and moe blocks": (_request(MIXED_MOE, 4, 8, 128), H100),
    "te-current, bf16 end blocks": (_request(SMALL, 8, 16, 256, stack="megatron", precision="bf16-master",
                                             fp8="te-current", first_last_bf16=True), H100),
    "megatron's block-K at a tight budget": (dataclasses.replace(  # the pick: block-5 of 8 blocks
        _request(dataclasses.replace(SMALL, n_layers=8), 8, 16, 4096, stack="megatron"), budget_bytes=int(1.5e9)),
        H100),
}


@pytest.fixture(scope="module", params=list(SEARCHES))
def searched(request):
    """Each search, exhaustive and pruned."""
    plan_request, profile = SEARCHES[request.param]
    return plan_request, profile, plan(plan_request, profile, prune=False), plan(plan_request, profile)


def test_no_candidate_is_faster_than_its_floor_nor_its_layouts(searched):
    plan_request, profile, whole, _ = searched
    candidates = whole.candidates + whole.rejected
    assert len(candidates) > 20
    for c in candidates:
        floor = step_floor_s(plan_request.spec, c.config, profile, c.accumulation_steps)
        assert 0 < floor <= c.time.total_s * (1 + 1e-9), (c.layout, c.label)
    fastest_by_layout: dict[Layout, float] = {}
    for c in candidates:
        fastest_by_layout[c.layout] = min(fastest_by_layout.get(c.layout, math.inf), c.step_time_s)
    for layout, fastest in fastest_by_layout.items():
        sub = dataclasses.replace(plan_request.on_layout(layout), cluster=plan_request.cluster)
        assert layout_floor_s(sub, profile, uncalibrated(profile.name)) <= fastest * (1 + 1e-9), layout


def test_a_pruned_search_recommends_what_the_whole_one_does_with_the_same_ties(searched):
    _, _, whole, pruned = searched
    best = whole.recommendation
    assert best is not None
    assert (pruned.recommendation.layout, pruned.recommendation.config) == (best.layout, best.config)
    assert pruned.recommendation.step_time_s == best.step_time_s

    def band(result):
        return [(c.layout, c.config, c.step_time_s) for c in result.candidates[:result.band]]

    assert band(pruned) == band(whole)
    # Every layout is either searched or left out, and a left-out one is beyond a near tie by its floor, which
    # its fastest candidate does not beat.
    assert len(pruned.layouts) + len(pruned.pruned) == len(whole.layouts)
    fastest = {o.layout: o.best.step_time_s for o in whole.layouts if o.best is not None}
    for left in pruned.pruned:
        assert left.floor_s > best.step_time_s / (1 - NEAR)
        assert fastest.get(left.layout, math.inf) >= left.floor_s * (1 - 1e-9)
        if left.fits is not None:
            assert left.fits == (left.layout in fastest)


def test_pruning_saves_most_of_a_search_on_a_large_model():
    """GPT-3 175B over 1,536 A100s under Megatron-LM: the layouts and candidates a pruned search evaluates, out of
    those an exhaustive one does (benchmarks/bench_planner.py times both)."""
    spec = get_preset("gpt3-175b")
    request = _request(spec, 1536, 1536, 2048, hardware="a100-sxm-80gb", stack="megatron")
    pruned = plan(request, A100)
    assert len(pruned.pruned) > 2 * len(pruned.layouts)
    assert len(pruned.candidates) + len(pruned.rejected) < 1000  # the exhaustive search evaluates 24,820


def test_the_text_and_the_json_say_what_was_left_out(run_cli, plan_json):
    flags = ("--model", "bench-llama-small", "--seq-len", "256", "--global-batch", "16", "--gpus", "8",
             "--stack", "megatron", "--hardware", "h100-sxm")
    text = " ".join(run_cli("plan", *flags, "--top", "3").stdout.split())
    document = plan_json(*flags)
    left_out = document["pruned"]
    assert left_out and {tuple(entry) for entry in left_out} == {
        ("layout", "fits", "floor_step_s", "max_tokens_per_s", "why")}
    best = document["recommendation"]["tokens_per_s"]
    assert all(entry["max_tokens_per_s"] < best * (1 - NEAR) for entry in left_out)
    assert f"{len(left_out):,} more left out: no step of theirs can come within 1% of the fastest" in text
    assert f"layouts left out: {len(left_out):,}; the fastest each could be:" in text
    assert "left out: a step takes at least " in text
    whole = plan_json(*flags, "--exhaustive")
    assert whole["pruned"] == [] and whole["recommendation"] == document["recommendation"]
    assert len(whole["layouts"]) == len(document["layouts"]) + len(left_out)


def test_a_profile_prices_an_ops_tuple_once_and_a_copy_prices_afresh():
    ops = forward_ops(SMALL, TrainConfig(seq_len=256), "cuda", 1).dense_block
    first = H100.price(ops)
    assert first == ops_time(H100.rates, ops) and H100.price(ops) is first
    slower = dataclasses.replace(H100, hbm_bytes_per_s=H100.hbm_bytes_per_s / 2)
    assert slower.price(ops) == ops_time(slower.rates, ops) and slower.price(ops).memory_s > first.memory_s
