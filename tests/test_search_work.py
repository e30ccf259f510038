"""A plan's work is bounded by a count, not a clock (core.search_work): a search that reaches the bound stops
trying layouts, simplest first, says how many it left, and stops at the same layout on every machine; the
advice a plan gives when nothing fits shares the plan's bound."""

from __future__ import annotations

import json

import pytest

import core.search_work
from core.advice import plan_and_advise
from core.config import TrainConfig
from core.hardware import get_hardware
from core.planner import PlanRequest, plan
from core.presets import get_preset
from core.search_work import bounded_search
from core.timing import datasheet_profile
from core.units import GB

H100 = datasheet_profile(get_hardware("h100-sxm"))


def _request(gpus: int | None = 64, budget_gb: float = 80) -> PlanRequest:
    return PlanRequest(spec=get_preset("llama3-8b"), train=TrainConfig(seq_len=2048), global_batch=512,
                       budget_bytes=int(budget_gb * GB), gpus=gpus)


def test_a_search_past_its_bound_stops_where_it_stops_on_every_machine(monkeypatch):
    whole = plan(_request(), H100)
    assert whole.unsearched == 0 and whole.stopped_at == ""
    monkeypatch.setattr(core.search_work, "LIMIT", 100)
    first, again = plan(_request(), H100), plan(_request(), H100)
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
    monkeypatch.setattr(core.search_work, "LIMIT", 100)
    text = run_cli("plan", "--model", "llama3-8b", "--gpus", "64", "--global-batch", "512")
    assert text.returncode == 0
    (line,) = [line for line in text.stdout.splitlines() if "work bound" in line]
    assert line.startswith("  the search stopped at its work bound (100 candidates) after ")
    assert line.endswith(" left untried: pin --tp, --pp or --cp, or plan fewer GPUs, to search them")
    payload = json.loads(run_cli("plan", "--model", "llama3-8b", "--gpus", "64", "--global-batch", "512",
                                 "--json").stdout)
    assert payload["unsearched"]["stopped_at"] == "work bound" and payload["unsearched"]["layouts"] > 0


@pytest.mark.parametrize("gpus", [None, 8])
def test_a_whole_search_says_nothing_of_a_bound(run_cli, gpus):
    args = ["plan", "--model", "llama3-8b", "--global-batch", "64", "--json"] + (["--gpus", str(gpus)] if gpus else [])
    assert json.loads(run_cli(*args).stdout)["unsearched"] is None
