"""A plan's work is bounded by a count, not a clock (headroom.core.planning.search_work): a search that reaches the bound stops
trying layouts, those that could be fastest first, says how many it left, and stops at the same layout on every machine; the
advice a plan gives when nothing fits shares the plan's bound."""

from __future__ import annotations

import dataclasses
import json

import pytest

import headroom.core.planning.search_work
from headroom.core.memory.estimate import estimate
from headroom.core.memory.flops import _unsaved_last_matmul, recompute_flops, step_flops
from headroom.core.memory.static import fsdp_units
from headroom.core.planning.advice import plan_and_advise
from headroom.core.planning.planner import PlanRequest, plan
from headroom.core.planning.search_work import bounded_search
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.timing.step import datasheet_profile
from headroom.core.units import GB

H100 = datasheet_profile(get_hardware("h100-sxm"))


def _request(gpus: int | None = 64, budget_gb: float = 80) -> PlanRequest:
    return PlanRequest(spec=get_preset("llama3-8b"), train=TrainConfig(seq_len=2048), global_batch=512,
                       budget_bytes=int(budget_gb * GB), gpus=gpus)


def test_a_search_past_its_bound_stops_where_it_stops_on_every_machine(monkeypatch):
    whole = plan(_request(), H100, prune=False)  # every candidate of every layout: 16,388
    assert whole.unsearched == 0 and whole.stopped_at == "" and not whole.pruned
    monkeypatch.setattr(headroom.core.planning.search_work, "LIMIT", 100)
    first, again = plan(_request(), H100, prune=False), plan(_request(), H100, prune=False)
    assert first.stopped_at == "work bound" and first.unsearched > 0
    assert len(first.layouts) + first.unsearched == len(whole.layouts)
    assert [o.layout for o in first.layouts] == [o.layout for o in again.layouts]  # counted, not timed
    assert len(first.candidates) + len(first.rejected) >= 100  # the layout that crossed the bound is whole


def test_the_bound_counts_every_candidate_of_a_plan_and_its_advice():
    with bounded_search(300) as work:
        result = plan_and_advise(_request(gpus=None, budget_gb=20), H100)
    assert result.recommendation is None and work.exhausted
    assert result.advice[-1] == ("the advice stopped at the search's work bound (300 candidates) before a change "
                                 "that fits: try more GPUs (--gpus) or a shorter --seq-len by hand")
    assert work.spent < 300 + 1000  # past the bound by at most the layout it was in


def test_the_command_line_says_where_a_search_stopped(run_cli, monkeypatch):
    monkeypatch.setattr(headroom.core.planning.search_work, "LIMIT", 5)  # the first layout tried spends more
    monkeypatch.setenv("COLUMNS", "1000")  # the line whole, not wrapped (tests/test_cli_wrap.py)
    text = run_cli("plan", "--model", "llama3-8b", "--gpus", "64", "--global-batch", "512")
    assert text.returncode == 0
    (line,) = [line for line in text.stdout.splitlines() if "work bound" in line]
    assert line.startswith("  the search stopped at its work bound (5 candidates) after 1 layout, those that could be "
                           "fastest first; ")
    assert line.endswith(" left untried: pin --tp, --pp or --cp, or plan fewer GPUs, to search them")
    payload = json.loads(run_cli("plan", "--model", "llama3-8b", "--gpus", "64", "--global-batch", "512",
                                 "--json").stdout)
    assert payload["unsearched"]["stopped_at"] == "work bound" and payload["unsearched"]["layouts"] > 0


@pytest.mark.parametrize("gpus", [None, 8])
def test_a_whole_search_says_nothing_of_a_bound(run_cli, gpus):
    args = ["plan", "--model", "llama3-8b", "--global-batch", "64", "--json"] + (["--gpus", str(gpus)] if gpus else [])
    assert json.loads(run_cli(*args).stdout)["unsearched"] is None


DEEP = dataclasses.replace(get_preset("bench-llama-tiny"), name="deep", n_layers=10_000)


@pytest.mark.parametrize("policy", ["full", "every-3", "every-7"])
def test_a_deep_models_candidate_does_not_walk_its_layers(policy, monkeypatch):
    """A candidate of 10,000 layers once walked them in three places (27 ms a candidate, a plan at every maximum
    past 120 s): its trace now replays the run of like segments in one step, its FSDP units are runs, and its
    recomputed FLOPs count segments by arithmetic. Counted, not timed."""
    import headroom.core.memory.forward_trace

    kinds = []
    counted = headroom.core.memory.forward_trace._segment_kinds
    monkeypatch.setattr(headroom.core.memory.forward_trace, "_segment_kinds", lambda *a: kinds.append(a) or counted(*a))
    config = TrainConfig(seq_len=64, recompute=parse_policy(policy), layout=Layout(dp=8, zero=3))
    result = estimate(DEEP, config)
    assert len(kinds) <= 10  # a handful of segments looked at (first, template, run, last), not 10,000
    assert len(fsdp_units(DEEP, config.layout, result.rank)) == 3  # the embedding, 10,000 blocks, the head
    assert result.ledger.repeats and result.ledger.repeats[-1].end <= DEEP.n_layers


@pytest.mark.parametrize(("n_layers", "dense"), [(10, 0), (10, 3), (61, 3), (7, 6)])
@pytest.mark.parametrize("every", [1, 2, 3, 4, 7])
def test_recomputed_flops_by_arithmetic_equal_those_counted_segment_by_segment(n_layers, dense, every):
    """Every segment of full or every-K recompute skips its last block's unsaved trailing matmul (headroom.core.memory.flops):
    counted per segment end, as the code once did, for dense models and mixtures with dense leading blocks."""
    spec = dataclasses.replace(get_preset("mixtral-8x7b"), n_layers=n_layers, dense_layers=dense) if dense else \
        dataclasses.replace(get_preset("bench-llama-tiny"), n_layers=n_layers)
    policy = parse_policy("full" if every == 1 else f"every-{every}")
    config = TrainConfig(seq_len=64, recompute=policy)
    size = policy.segment_layers(n_layers)
    ends = [min(start + size, n_layers) - 1 for start in range(0, n_layers, size)]
    blocks = step_flops(spec, config, "cuda", recompute=0).blocks_forward
    expected = blocks - sum(_unsaved_last_matmul(spec, 1, 64, spec.is_moe_layer(end)) for end in ends)
    assert recompute_flops(spec, config) == expected
