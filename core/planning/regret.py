"""Regret: what following the planner costs, in measured throughput.

For one budget the planner recommends a micro-batch, accumulation and
checkpoint policy. A box that trained the same model, sequence and global
batch under several configurations knows which of them really fit the
budget and how fast each really ran; the best is the fastest that fit.

    regret = 1 - measured tokens/s of the recommendation / best measured tokens/s

A recommendation that ran out of memory, or took more than the budget, is a
failure whatever its speed: its outcome says so and it has no regret.

A measured configuration fits when its peak reserved bytes (what the
allocator took from the device, fragmentation included) plus the planner's
context reserve are within the budget. Without allocator statistics (a CPU)
fit is the planner's prediction, and regret measures the time ranking alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from headroom.core.planning.planner import Candidate, Plan
from headroom.core.specs.run_config import RunConfig
from headroom.core.units import MB


@dataclass(frozen=True, slots=True)
class MeasuredConfig:
    """One configuration as the box ran it, and what became of it."""

    run: RunConfig
    status: str
    """``ok``, ``oom``, ``error`` or ``skipped``, as the store records it."""
    tokens_per_s: float | None
    peak_reserved_bytes: int | None
    """None where the device has no allocator statistics (CPU)."""

    @property
    def key(self) -> tuple[int, int, str]:
        return self.run.choice

    @property
    def label(self) -> str:
        return self.run.label


@dataclass(frozen=True, slots=True)
class Regret:
    budget_bytes: int
    recommended: str | None
    """The planner's choice, or None when it found nothing that fits."""
    outcome: str
    """``ok``; ``oom``; ``over budget`` (ran, but took more than the budget); ``not measured``; ``nothing fits``."""
    recommended_tokens_per_s: float | None
    best: str | None
    """The fastest measured configuration that fit, or None when none did."""
    best_tokens_per_s: float | None
    fit_by: str
    """``measured`` (peak reserved + context reserve) or ``predicted`` (no allocator statistics)."""

    @property
    def regret(self) -> float | None:
        if self.outcome != "ok" or not self.best_tokens_per_s or self.recommended_tokens_per_s is None:
            return None
        return 1 - self.recommended_tokens_per_s / self.best_tokens_per_s


def _key(candidate: Candidate) -> tuple[int, int, str]:
    return candidate.run_config.choice


def _fits(plan: Plan, measured: MeasuredConfig) -> bool:
    if measured.status != "ok":
        return False
    if measured.peak_reserved_bytes is not None:
        return measured.peak_reserved_bytes + plan.request.context_reserve_bytes <= plan.request.budget_bytes
    return any(_key(c) == measured.key for c in plan.candidates)


def regret(plan: Plan, measured: list[MeasuredConfig]) -> Regret:
    """How the plan's recommendation fared against the best of ``measured`` under the plan's budget."""
    by_key = {m.key: m for m in measured}
    fit_by = "measured" if any(m.peak_reserved_bytes is not None for m in measured) else "predicted"
    fitting = [m for m in measured if _fits(plan, m)]
    best = max(fitting, key=lambda m: m.tokens_per_s or 0.0, default=None)
    common = dict(budget_bytes=plan.request.budget_bytes, best=best.label if best else None,
                  best_tokens_per_s=best.tokens_per_s if best else None, fit_by=fit_by)
    choice = plan.recommendation
    if choice is None:
        return Regret(recommended=None, outcome="nothing fits", recommended_tokens_per_s=None, **common)
    ran = by_key.get(_key(choice))
    if ran is None:
        outcome = "not measured"
    elif ran.status == "oom":
        outcome = "oom"
    elif ran.status != "ok":
        outcome = ran.status
    else:
        outcome = "ok" if _fits(plan, ran) else "over budget"
    return Regret(recommended=choice.label, outcome=outcome,
                  recommended_tokens_per_s=ran.tokens_per_s if ran else None, **common)


PLAIN = ("none", "selective")
"""Policies that keep (nearly) every activation: selective recomputes only the attention core, which
a fused kernel keeps no s x s tensor of anyway."""


def tight_budget(plan: Plan, measured: list[MeasuredConfig]) -> int | None:
    """A budget (whole MB) just under the smallest configuration that keeps every activation.

    No ``none`` or ``selective`` configuration fits it, so the planner must
    choose what to recompute or offload. Required bytes are measured (peak
    reserved + context reserve) where the box has allocator statistics, else
    the plan's prediction. None when nothing else would fit either.
    """
    reserve = plan.request.context_reserve_bytes
    required = {m.key: m.peak_reserved_bytes + reserve for m in measured
                if m.status == "ok" and m.peak_reserved_bytes is not None}
    if not required:
        required = {_key(c): c.required_bytes for c in (*plan.candidates, *plan.rejected)}
    plain = [need for key, need in required.items() if key[2] in PLAIN]
    if not plain:
        return None
    budget = (min(plain) - 1) // MB * MB
    others = [need for key, need in required.items() if key[2] not in PLAIN]
    return budget if budget > reserve and any(need <= budget for need in others) else None
