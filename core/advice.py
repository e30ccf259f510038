"""When nothing fits: say what dominates and find the smallest change that would fit.

Changes are tried from least to most disruptive, and the first that fits is
reported with the plan it would give:

1. a higher sharding stage on the same ranks (when there are several);
2. more data-parallel ranks (x2, x4, ... x64) with a sharding stage, since
   more ranks alone do not shrink per-rank state;
3. a shorter sequence (halved, down to 256 tokens);
4. offloading activations to host memory.

A change is screened by its least-memory candidate (micro-batch 1 under the
memory-lightest policy) before a full plan is made for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from core.planner import Plan, PlanRequest, evaluate, plan, policies_worth_trying
from core.units import GB

MAX_RANK_MULTIPLIER = 64
MIN_SEQ_LEN = 256


def _variants(request: PlanRequest) -> Iterator[tuple[str, PlanRequest]]:
    if request.dp > 1:
        for stage in range(request.zero + 1, 4):
            yield f"--zero {stage}", replace(request, zero=stage)
    multiplier = 2
    while multiplier <= MAX_RANK_MULTIPLIER:
        dp = request.dp * multiplier
        batch = -(-request.global_batch // dp) * dp  # the global batch must split over the ranks
        for stage in range(max(request.zero, 1), 4):
            label = f"--dp {dp} --zero {stage}" + (f" --global-batch {batch}" if batch != request.global_batch else "")
            yield label, replace(request, dp=dp, zero=stage, global_batch=batch)
        multiplier *= 2
    seq_len = request.seq_len // 2
    while seq_len >= MIN_SEQ_LEN:
        yield f"--seq-len {seq_len}", replace(request, seq_len=seq_len)
        seq_len //= 2
    if not request.allow_offload:
        yield "--offload", replace(request, allow_offload=True)


def _could_fit(request: PlanRequest, base: Plan) -> bool:
    return any(
        evaluate(request, base.profile, base.calibration, 1, policy).rejection is None
        for policy in policies_worth_trying(request)
    )


def advise_nothing_fits(base: Plan) -> tuple[str, ...]:
    request = base.request
    closest = min(base.rejected, key=lambda c: c.required_bytes)
    est = closest.estimate
    static = est.static
    lines = [
        f"nothing fits in {request.budget_bytes / GB:.1f} GB: the closest candidate ({closest.label}) "
        f"needs {closest.required_bytes / GB:.1f} GB",
        f"it holds {static.total / GB:.1f} GB of static state (parameters {static.parameters / GB:.1f}, "
        f"gradients {static.gradients / GB:.1f}, master weights {static.master_weights / GB:.1f}, "
        f"optimizer state {static.optimizer_states / GB:.1f}) and {est.activation_bytes / GB:.1f} GB of activations",
    ]
    for label, variant in _variants(request):
        if _could_fit(variant, base):
            best = plan(variant, base.profile, base.calibration, advise=False).recommendation
            assert best is not None
            lines.append(
                f"smallest change that fits: {label} (then {best.label}, "
                f"{best.required_bytes / GB:.1f} GB, {best.tokens_per_s:,.0f} tokens/s)"
            )
            return tuple(lines)
    lines.append(
        f"no single change tried fits (up to {MAX_RANK_MULTIPLIER}x the ranks with ZeRO-3, "
        f"sequences down to {MIN_SEQ_LEN}, offload): the model needs tensor or pipeline parallelism"
    )
    return tuple(lines)
