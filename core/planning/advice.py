"""When nothing fits: say what dominates and find the smallest change that would fit.

``plan_and_advise`` is the planner's front door: a plan, and when nothing fits,
advice. Changes are tried from least to most disruptive, and the first that
fits is reported with the plan it would give:

1. a higher sharding stage on the same ranks (when there are several);
   for a mixture of experts, more expert-parallel ranks among them (every
   larger ep that divides dp x cp and the experts);
2. more GPUs, doubling up to 64x: at each count every axis that could take
   them (more data-parallel ranks with a sharding stage, since more ranks
   alone do not shrink per-rank state; tensor parallelism within a node with
   sequence parallelism; more pipeline stages; context parallelism), the
   fastest that fits; with a GPU count to search (``--gpus``), the search
   itself over twice, four times ... the GPUs;
3. a shorter sequence (halved, down to 256 tokens);
4. offloading activations to host memory.

A change is screened by its least-memory candidates (micro-batch 1 under the
memory-lightest policies) before a full plan is made for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from headroom.core.divisors import divisors
from headroom.core.errors import ConfigError
from headroom.core.measured.calibration import Calibration
from headroom.core.planning.layout_search import candidate_layouts
from headroom.core.planning.planner import (
    Plan,
    PlanRequest,
    SearchProgress,
    evaluate,
    plan,
    policies_worth_trying,
)
from headroom.core.planning.search_work import bounded_search, current_work
from headroom.core.specs.stack import get_stack
from headroom.core.timing.step import HardwareProfile
from headroom.core.units import GB

MAX_GPU_MULTIPLIER = 64
MIN_SEQ_LEN = 256
MOMENTS = {"forward": "the forward's end", "loss backward": "the loss's backward",
           "recompute": "a recomputed segment's backward", "optimizer step": "the optimizer's step"}
"""headroom.core.memory.estimate's peak moments, as a sentence says them."""


def plan_and_advise(request: PlanRequest, profile: HardwareProfile, calibration: Calibration | None = None, *,
                    time_limit_s: float | None = None, progress: SearchProgress | None = None,
                    prune: bool = True) -> Plan:
    """The plan, with advice when nothing fits (``time_limit_s``, ``progress``, ``prune``: see
    headroom.core.planning.planner.plan). A
    search cut short gets no advice: what the untried layouts would do is unknown, so the plan says how many
    are left. ``progress`` also hears of the searches the advice makes, each named by the change it tries."""
    with bounded_search():  # the plan and its advice share one work bound
        result = plan(request, profile, calibration, time_limit_s=time_limit_s, progress=progress, prune=prune)
        if result.recommendation is None and not result.unsearched:
            result = replace(result, advice=advise_nothing_fits(result, progress))
    return result


Variant = Callable[[], PlanRequest]
"""Builds a changed request; raises ConfigError when the model cannot be split that way."""


def _more_gpus(request: PlanRequest, multiplier: int, gpus_per_node: int) -> Iterator[tuple[str, Variant]]:
    """Every way of spending ``multiplier`` times the GPUs on one axis of the request's layout."""
    layout = request.layout
    dp = layout.dp * multiplier
    batch = -(-request.global_batch // dp) * dp  # the global batch must split over the ranks
    suffix = f" --global-batch {batch}" if batch != request.global_batch else ""
    for stage in range(max(layout.zero, 1), 4):
        yield (f"--dp {dp} --zero {stage}{suffix}",
               lambda stage=stage: request.with_layout(dp=dp, zero=stage, global_batch=batch))
    tp = layout.tp * multiplier
    if tp <= gpus_per_node:
        yield f"--tp {tp} --sp on", lambda: request.with_layout(tp=tp, sp=True)
    yield f"--pp {layout.pp * multiplier}", lambda: request.with_layout(pp=layout.pp * multiplier)
    yield f"--cp {layout.cp * multiplier}", lambda: request.with_layout(cp=layout.cp * multiplier)


def _more_sharding(request: PlanRequest) -> Iterator[tuple[str, Variant]]:
    """The sharding steps beyond the request's, least first: each stage its stack runs, and where its ZeRO-2 is FSDP
    kept gathered (Stack.fsdp_zero2), that between ZeRO-1 and FSDP resharding; a shard kept over k ranks comes
    before resharding whole."""
    layout, stack = request.layout, get_stack(request.train.stack)

    def rank(zero: int, reshard: bool | int | None) -> float:
        return zero if zero < 3 or reshard in (None, True) else 2 if reshard is False else 2.5

    steps: list[tuple[int, bool | None]] = [(zero, None) for zero in stack.sharding_stages if 0 < zero < 3]
    if stack.fsdp_zero2:
        steps.append((3, False))
    if 3 in stack.sharding_stages:
        steps.append((3, True if layout.zero == 3 and layout.reshard_after_forward is not None else None))
    here = rank(layout.zero, layout.reshard_after_forward)
    for zero, reshard in steps:
        if rank(zero, reshard) > here:
            flag = "" if reshard is None else f" --reshard-after-forward {str(reshard).lower()}"
            yield (f"--zero {zero}{flag}",
                   lambda zero=zero, reshard=reshard: request.with_layout(zero=zero, reshard_after_forward=reshard))


def _could_fit(request: PlanRequest, base: Plan) -> bool:
    """Does the lightest candidate of some layout of the request fit? (Bad splits, or no work left: no.)"""
    if current_work().exhausted:
        return False
    try:
        if request.gpus is not None:
            cluster = request.cluster_for(base.profile)
            layouts = candidate_layouts(request.spec, request.train, request.global_batch, request.gpus,
                                        cluster.gpus_per_node, request.pinned)
            return any(_could_fit(replace(request.on_layout(layout), cluster=cluster), base) for layout in layouts)
        return any(
            evaluate(request, base.profile, base.calibration, 1, policy).rejection is None
            for policy in policies_worth_trying(request) if policy.kind in ("full", "every", "block", "offload")
        )
    except ConfigError:
        return False


def _fitting_plans(base: Plan, progress: SearchProgress | None = None) -> Iterator[tuple[str, Plan]]:
    """The changes, least disruptive first, that fit, each with its plan (one at a time, lazily), until the
    work bound is spent (headroom.core.planning.search_work)."""
    request = base.request
    work = current_work()

    def planned(label: str, make: Variant) -> Iterator[tuple[str, Plan]]:
        if work.exhausted:
            return
        try:
            variant = make()
            if not _could_fit(variant, base):
                return
            told = None if progress is None else (
                lambda done, total, what: progress(done, total, f"{what}, for advice: {label}"))
            result = plan(variant, base.profile, base.calibration, progress=told)
        except ConfigError:
            return
        if result.recommendation is not None and not result.unsearched:  # a variant's search cut short: unknown
            yield label, result

    if request.gpus is None and request.dp > 1:
        for label, make in _more_sharding(request):
            yield from planned(label, make)
    if request.gpus is None and request.spec.is_moe:
        for ep in divisors(request.dp * request.layout.cp):
            if ep > request.layout.ep and request.spec.n_experts % ep == 0:
                yield from planned(f"--ep {ep}", lambda ep=ep: request.with_layout(ep=ep))
    gpus_per_node = request.cluster_for(base.profile).gpus_per_node if request.layout.world > 1 or request.gpus \
        else 8
    multiplier = 2
    while multiplier <= MAX_GPU_MULTIPLIER:
        if request.gpus is not None:
            gpus = request.gpus * multiplier
            yield from planned(f"--gpus {gpus}", lambda gpus=gpus: replace(request, gpus=gpus))
        else:
            variants = [*_more_gpus(request, multiplier, gpus_per_node),
                        (f"--gpus {request.layout.world * multiplier}",  # every layout: axes together
                         lambda gpus=request.layout.world * multiplier: replace(request, gpus=gpus))]
            options = [found for label, make in variants for found in planned(label, make)]
            if options:  # keep the global batch (a training hyperparameter) where one can, then the fastest
                yield max(options, key=lambda o: (o[1].request.global_batch == request.global_batch,
                                                  o[1].recommendation.tokens_per_s))  # type: ignore[union-attr]
        multiplier *= 2
    seq_len = request.seq_len // 2
    while seq_len >= MIN_SEQ_LEN:
        yield from planned(f"--seq-len {seq_len}",
                           lambda seq_len=seq_len: replace(request, train=replace(request.train, seq_len=seq_len)))
        seq_len //= 2
    if not request.allow_offload:
        yield from planned("--offload", lambda: replace(request, allow_offload=True))


def advise_nothing_fits(base: Plan, progress: SearchProgress | None = None) -> tuple[str, ...]:
    request = base.request
    closest = min(base.rejected, key=lambda c: c.required_bytes)
    est = closest.estimate
    where = f" on {closest.layout}" if request.gpus is not None else ""
    held = ", ".join(f"{name.replace('_', ' ')} {size / GB:.1f}" for name, size in est.peak_components.items() if size)
    lines = [
        f"nothing fits in {request.budget_bytes / GB:.1f} GB: the closest candidate ({closest.label}{where}) "
        f"needs {closest.required_bytes / GB:.1f} GB",
        f"its peak, at {MOMENTS[est.peak_moment]}, is {est.peak_bytes / GB:.1f} GB before calibration and margin: "
        f"{held} GB",
    ]
    for label, result in _fitting_plans(base, progress):
        best = result.recommendation
        assert best is not None
        layout = f" on {best.layout}" if best.layout.world > 1 else ""
        lines.append(
            f"smallest change that fits: {label} (then {best.label}{layout}, "
            f"{best.required_bytes / GB:.1f} GB, {best.tokens_per_s:,.0f} tokens/s)"
        )
        return tuple(lines)
    if (work := current_work()).exhausted:
        lines.append(f"the advice stopped at the search's work bound ({work.limit:,} candidates) before a change "
                     "that fits: try more GPUs (--gpus) or a shorter --seq-len by hand")
        return tuple(lines)
    lines.append(
        f"no single change tried fits (up to {MAX_GPU_MULTIPLIER}x the GPUs on any parallel axis"
        + (", expert parallelism" if request.spec.is_moe else "") + ", "
        f"sequences down to {MIN_SEQ_LEN}, offload)"
    )
    return tuple(lines)
