"""Regret: the planner's recommendation against the best measured configuration, by hand-made measurements."""

import dataclasses

import pytest

from headroom.core.planning.planner import PlanRequest, plan
from headroom.core.planning.regret import MeasuredConfig, regret, tight_budget
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.presets import get_preset
from headroom.core.timing.step import datasheet_profile
from headroom.core.units import GB, MB

PROFILE = datasheet_profile(get_hardware("h100-sxm"))
REQUEST = PlanRequest(spec=get_preset("llama3.2-1b"), train=TrainConfig(seq_len=2048), global_batch=8, budget_bytes=80 * GB)


def _measured(result, tokens_per_s, reserved=None, status="ok"):
    """Every candidate of the plan as if measured: tokens/s and reserved bytes from the given functions."""
    out = []
    for c in (*result.candidates, *result.rejected):
        key = (c.config.micro_batch, c.accumulation_steps, str(c.config.recompute))
        out.append(MeasuredConfig(c.run_config, status(key) if callable(status) else status, tokens_per_s(key),
                                  reserved(key) if reserved else None))
    return out


def test_regret_is_the_measured_shortfall_of_the_recommendation():
    result = plan(REQUEST, PROFILE)
    best = result.recommendation
    best_key = (best.config.micro_batch, best.accumulation_steps, str(best.config.recompute))
    # Measured: the recommendation ran at 900 tokens/s, one other fitting configuration at 1000.
    other = next(c for c in result.candidates[1:])
    other_key = (other.config.micro_batch, other.accumulation_steps, str(other.config.recompute))
    speeds = {best_key: 900.0, other_key: 1000.0}
    measured = _measured(result, lambda k: speeds.get(k, 100.0), reserved=lambda k: 10 * GB)
    outcome = regret(result, measured)
    assert outcome.outcome == "ok" and outcome.fit_by == "measured"
    assert outcome.best_tokens_per_s == 1000.0 and outcome.recommended_tokens_per_s == 900.0
    assert outcome.regret == pytest.approx(0.1)


def test_a_recommendation_that_ran_out_of_memory_or_over_budget_has_no_regret():
    result = plan(REQUEST, PROFILE)
    best = result.recommendation
    best_key = (best.config.micro_batch, best.accumulation_steps, str(best.config.recompute))
    oom = _measured(result, lambda k: 100.0, reserved=lambda k: 10 * GB, status=lambda k: "oom" if k == best_key else "ok")
    assert regret(result, oom).outcome == "oom" and regret(result, oom).regret is None
    # It ran, but the allocator took 79.5 GB: with the 1 GB context reserve it is over the 80 GB budget.
    over = _measured(result, lambda k: 100.0, reserved=lambda k: int(79.5 * GB) if k == best_key else 10 * GB)
    assert regret(result, over).outcome == "over budget"
    missing = [m for m in over if m.key != best_key]
    assert regret(result, missing).outcome == "not measured"


def test_without_allocator_statistics_fit_is_the_prediction():
    result = plan(dataclasses.replace(REQUEST, budget_bytes=30 * GB), PROFILE)
    measured = _measured(result, lambda k: 1000.0 * k[0])  # faster with larger micro-batches, no reserved bytes
    outcome = regret(result, measured)
    assert outcome.fit_by == "predicted"
    fitting = {(c.config.micro_batch, c.accumulation_steps, str(c.config.recompute)) for c in result.candidates}
    assert outcome.best_tokens_per_s == max(1000.0 * k[0] for k in fitting)


def test_tight_budget_rules_out_every_plain_configuration_and_keeps_another():
    result = plan(REQUEST, PROFILE)
    plain = ("none", "selective")  # selective with fused attention keeps nearly what none keeps
    reserved = {(micro, accum, policy): (20 + micro * (8 if policy in plain else 1)) * GB + (MB if policy == "none" else 0)
                for micro, accum, policy in (m.key for m in _measured(result, lambda k: 1.0))}
    measured = _measured(result, lambda k: 1.0, reserved=lambda k: reserved[k])
    budget = tight_budget(result, measured)
    smallest_plain = min(r for k, r in reserved.items() if k[2] in plain) + GB  # + the context reserve
    assert budget == (smallest_plain - 1) // MB * MB
    assert budget < smallest_plain and any(r + GB <= budget for k, r in reserved.items() if k[2] not in plain)
