"""The Plan page's results as text and tables: what a plan recommends, its candidates, layouts, time terms,
each rank's memory and communication, and two plans or two layouts side by side.

Each function takes a headroom.core.planning.planner.Plan (what headroom.dashboard.planning.make_plan returns) and gives what the page
shows: a sentence, a figure's text or a pandas frame a chart or table draws (dashboard/charts.py,
dashboard/views/plan.py). Nothing here plans.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from headroom.core.errors import ConfigError
from headroom.core.planning.planner import Candidate, LayoutOutcome, Plan
from headroom.core.timing.step import HardwareProfile
from headroom.core.units import GB


def unit(profile: HardwareProfile) -> str:
    """What one rank of this hardware is called: a GPU, or a device (a CPU, which the page plans ranks of too)."""
    return "GPU" if profile.device == "cuda" else "device"


def count(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless one."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def recommendation_text(result: Plan) -> str:
    """One line: what to run. Tests compare it across inputs."""
    best = result.recommendation
    if best is None:
        where = f" on any layout of {result.request.gpus} GPUs" if result.request.gpus is not None else ""
        if result.unsearched:
            where = f" on the {count(len(result.layouts), 'layout')} of {result.request.gpus} GPUs tried"
        return f"Nothing fits the {result.request.budget_bytes / GB:.1f} GB budget{where}"
    return (
        f"micro-batch {best.config.micro_batch} x accumulation {best.accumulation_steps} x "
        f"{best.layout.dp} data-parallel rank(s), recompute {best.config.recompute}"
        f"{f', fp8 {best.config.fp8}' if best.config.float8 is not None else ''}"
        f"{f', {best.config.precision}' if result.request.precision_search else ''}, on {best.layout} "
        f"({count(best.layout.world, unit(result.profile))})"
    )


def seconds_text(seconds: float) -> str:
    """A step time that reads at any size: "1.234 s", "12.3 ms", "45.6 us" (a tiny model's step is microseconds)."""
    if seconds >= 0.1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-4:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def tokens_text(tokens_per_s: float) -> str:
    """Tokens/s that fit a narrow metric: "57,085" below a million, "9.17 M" from there."""
    return f"{tokens_per_s:,.0f}" if tokens_per_s < 1e6 else f"{tokens_per_s / 1e6:,.3g} M"


def candidate_label(result: Plan, candidate: Candidate) -> str:
    """The candidate's label, with its layout when several layouts were searched (labels repeat across them)."""
    return f"{candidate.label} on {candidate.layout}" if result.request.gpus is not None else candidate.label


def candidates_frame(result: Plan) -> pd.DataFrame:
    """Every candidate, fitting ones ranked first (rank 1 = recommendation), rejected ones with their reason.

    ``over_gb`` is how far a rejected candidate is over the budget and ``broken_by`` the term that broke it (the
    end of headroom.core.planning.planner.rejection_reason's text), so a table can show both without cutting the reason short."""
    budget = result.request.budget_bytes
    rows = []
    for rank, c in enumerate((*result.candidates, *result.rejected), 1):
        fits = c.rejection is None
        rows.append({
            "rank": rank if fits else None,
            "candidate": c.label,
            "layout": str(c.layout),
            "micro_batch": c.config.micro_batch,
            "accumulation": c.accumulation_steps,
            "recompute": str(c.config.recompute),
            "tokens_per_s": c.tokens_per_s,
            "step_time_s": c.step_time_s,
            "peak_gb": c.calibrated_peak_bytes / GB,
            "required_gb": c.required_bytes / GB,
            "headroom_gb": (budget - c.required_bytes) / GB,
            "over_gb": None if fits else (c.required_bytes - budget) / GB,
            "fits": "fits" if fits else "rejected",
            "rejection": c.rejection or "",
            "broken_by": "" if fits else (c.rejection or "").rpartition(": ")[2],
        })
    frame = pd.DataFrame(rows)
    return frame.astype({"rank": "Int64"}) if len(frame) else frame


def peak_components_frame(result: Plan, candidates: list[Candidate]) -> pd.DataFrame:
    """Peak memory by component (GB) of each candidate, scaled by the calibration, plus the margin.

    The components are the core's estimate times the memory calibration factor,
    so they add up to the calibrated peak; ``margin`` is fragmentation plus the
    CUDA context reserve, so each bar ends at what must fit in the budget.
    """
    factor = result.calibration.memory.correction
    rows = []
    for order, c in enumerate(candidates):
        label = candidate_label(result, c)
        for name, size in c.estimate.peak_components.items():  # at the moment the peak happens
            rows.append({"candidate": label, "order": order, "component": name, "gb": size * factor / GB})
        rows.append({"candidate": label, "order": order, "component": "margin",
                     "gb": (c.required_bytes - c.calibrated_peak_bytes) / GB})
    return pd.DataFrame(rows)


def closest_rejected(result: Plan) -> Candidate | None:
    """The rejected candidate needing the least memory: the one headroom.core.planning.advice names "the closest candidate"."""
    return min(result.rejected, key=lambda c: c.required_bytes) if result.rejected else None


def shown_candidates(result: Plan, fitting: int = 5) -> list[Candidate]:
    """What the stacked bar shows: the fastest fitting candidates and the closest rejected one, which shows what
    the budget cuts off without the heaviest candidates squashing every other bar."""
    closest = closest_rejected(result)
    return [*result.candidates[:fitting], *([closest] if closest is not None else [])]


def shown_text(result: Plan, shown: list[Candidate]) -> str:
    """What the stacked bar shows, in words: how many fitting candidates, and the closest rejected one by name."""
    fitting = sum(c.rejection is None for c in shown)
    fastest = "The fastest fitting candidate" if fitting == 1 else f"The {fitting} fastest fitting candidates"
    closest = closest_rejected(result)
    if closest is None:
        return f"{fastest}; none was rejected."
    over = (closest.required_bytes - result.request.budget_bytes) / GB
    named = (f"the closest rejected candidate, {candidate_label(result, closest)}, needs "
             f"{closest.required_bytes / GB:,.1f} GB, {over:,.1f} GB over the budget")
    return f"{fastest}, and {named}." if fitting else f"Nothing fits: {named}."


WINDOW_BELOW, WINDOW_ABOVE = 0.1, 0.5
"""The scatter's margins, as fractions of its span: from the lightest fitting candidate to the budget (from the
budget to the closest rejected candidate when nothing fits)."""


def decision_window(result: Plan) -> tuple[float, float]:
    """The throughput-vs-memory scatter's x range (GB of required memory): where the choice is made.

    From a bit below the lightest fitting candidate to a bit beyond the budget, so the fitting candidates spread
    out and the nearest rejected ones show; when nothing fits, from a bit below the budget to a bit beyond the
    closest rejected candidate. A span under a tenth of the budget is widened to that.
    """
    budget = result.request.budget_bytes / GB
    closest = closest_rejected(result)
    if result.candidates:
        left, right = min(c.required_bytes for c in result.candidates) / GB, budget
    else:
        left, right = budget, closest.required_bytes / GB if closest is not None else budget
    span = max(right - left, 0.1 * budget)
    return max(0.0, left - WINDOW_BELOW * span), right + WINDOW_ABOVE * span


def in_window(table: pd.DataFrame, window: tuple[float, float]) -> pd.Series:
    """Which rows of `candidates_frame` lie inside ``window`` (GB of required memory)."""
    low, high = window
    return table["required_gb"].between(low, high)


def pareto_front(table: pd.DataFrame, memory: str = "required_gb", throughput: str = "tokens_per_s") -> pd.Series:
    """Which rows of ``table`` are Pareto-optimal: no other row needs no more ``memory`` and delivers no less
    ``throughput``, better in one of the two.

    Of rows needing the same memory only the fastest can be on the front; a row is on it when it is faster
    than every row needing less. Rows equal in both (two layouts, the same numbers) are on it together. The
    Plan page's scatter takes required memory (the calibrated peak x fragmentation + the context reserve, so
    ordered as the peak is) against tokens/s. A boolean Series on ``table``'s index.
    """
    if not len(table):
        return pd.Series(False, index=table.index, dtype=bool)
    fastest_at = table.groupby(memory)[throughput].max()  # ascending memory
    faster_than_lighter = fastest_at > fastest_at.cummax().shift(1, fill_value=float("-inf"))
    best = table[memory].map(fastest_at)
    return (table[throughput] == best) & table[memory].map(faster_than_lighter).astype(bool)


# --- Layouts: the chosen one, every one searched, and two side by side -------------------------------------------

TIME_TERMS: tuple[str, ...] = ("forward", "backward", "recompute", "offload", "host", "accumulation", "optimizer",
                               "communication", "bubble")
"""headroom.core.timing.step.StepTime.by_term's keys, in the order the stacked bar draws them."""


def shown_candidate(outcome: LayoutOutcome) -> Candidate:
    """What a layout is shown by: its fastest fitting candidate, else the lightest one it tried."""
    candidate = outcome.best or outcome.closest
    assert candidate is not None, f"layout {outcome.layout} has no candidate"
    return candidate


def layout_options(result: Plan) -> list[str]:
    """Every layout planned, best first, by its string (what the compare view offers)."""
    return [str(o.layout) for o in result.layouts]


def find_layout(result: Plan, label: str) -> LayoutOutcome:
    """The outcome of the layout whose string is ``label``."""
    for outcome in result.layouts:
        if str(outcome.layout) == label:
            return outcome
    raise ConfigError(f"layout {label!r} was not planned; planned: {'; '.join(layout_options(result))}")


def layouts_frame(result: Plan) -> pd.DataFrame:
    """Every layout planned, best first: its fastest fitting candidate, or why nothing on it fits."""
    winner = result.recommendation
    rows = []
    for rank, outcome in enumerate(result.layouts, 1):
        shown = shown_candidate(outcome)
        rows.append({
            "rank": rank if outcome.fits else None,
            "layout": str(outcome.layout),
            "gpus": outcome.layout.world,
            "fits": "fits" if outcome.fits else "does not fit",
            "candidate": shown.label,
            "tokens_per_s": shown.tokens_per_s if outcome.fits else None,
            "step_time_s": shown.step_time_s if outcome.fits else None,
            "required_gb": shown.required_bytes / GB,
            "why": outcome.why_lost(winner),
        })
    return pd.DataFrame(rows).astype({"rank": "Int64"})


def pruned_frame(result: Plan) -> pd.DataFrame:
    """The layouts a search left out (headroom.core.planning.pruning), the fastest each could be first."""
    tokens = result.request.global_batch * result.request.seq_len
    fits = {True: "fits", False: "does not fit", None: "not tried"}
    return pd.DataFrame([{"layout": str(p.layout), "gpus": p.layout.world, "max_tokens_per_s": p.max_tokens_per_s(tokens),
                          "floor_step_s": p.floor_s, "lightest": fits[p.fits]} for p in result.pruned])


def time_terms_frame(result: Plan, shown: Mapping[str, Candidate]) -> pd.DataFrame:
    """Each candidate's step by term, calibrated (headroom.core.planning.planner.Candidate.time_by_term), seconds.

    The terms add up to ``step_time_s``: forward, backward, recompute and offload of every
    micro-batch, gradient accumulation, the optimizer, communication left exposed after
    overlap, and the pipeline bubble. ``shown`` maps a row label to its candidate.
    """
    rows = []
    for order, (label, c) in enumerate(shown.items()):
        terms = c.time_by_term()
        for index, term in enumerate(TIME_TERMS):
            rows.append({"row": label, "order": order, "term": term, "term_order": index,
                         "seconds": terms[term]})
    return pd.DataFrame(rows)


def rank_memory_frame(result: Plan, shown: Mapping[str, Candidate]) -> pd.DataFrame:
    """Peak memory by component (GB) of every rank kind of each candidate, plus its margin.

    One row per pipeline stage kind ("first stage", "middle stage", "last stage"; "every rank"
    without a pipeline): each is the core's estimate for that rank times the memory calibration,
    and ``margin`` (fragmentation and the CUDA context) makes the bar end at what that rank needs.
    The most loaded rank's bar ends at the candidate's ``required_bytes``.
    """
    factor = result.calibration.memory.correction
    reserve = result.request.context_reserve_bytes
    rows = []
    order = 0
    for label, c in shown.items():
        for rank in c.estimate.ranks or (c.estimate,):
            name = "every rank" if rank.rank.name == "only" else rank.rank.name
            row = f"{label}: {name}" if label else name
            for component, size in rank.peak_components.items():
                rows.append({"row": row, "order": order, "component": component, "gb": size * factor / GB})
            peak = round(rank.peak_bytes * factor)
            rows.append({"row": row, "order": order, "component": "margin",
                         "gb": (round(peak * c.fragmentation) + reserve - peak) / GB})
            order += 1
    return pd.DataFrame(rows)


def communication_frame(candidate: Candidate) -> pd.DataFrame:
    """Every collective of the candidate's step (headroom.core.timing.comm.CommTerm), before overlap."""
    return pd.DataFrame([
        {"axis": t.axis, "op": t.op, "message_mb": t.message_bytes / 1e6, "calls": t.calls, "group": t.group_size,
         "link": t.link_key, "seconds": t.seconds, "overlappable": t.overlappable, "note": t.note}
        for t in candidate.time.communication
    ], columns=["axis", "op", "message_mb", "calls", "group", "link", "seconds", "overlappable", "note"])


def comparison(result: Plan, first: str, second: str) -> dict[str, tuple[LayoutOutcome, Candidate, str]]:
    """Two layouts side by side: for "A" and "B", the outcome, the candidate shown and why it lost."""
    winner = result.recommendation
    pairs = {}
    for tag, label in (("A", first), ("B", second)):
        outcome = find_layout(result, label)
        pairs[tag] = (outcome, shown_candidate(outcome), outcome.why_lost(winner))
    return pairs


def plan_title(result: Plan) -> str:
    """What sets a plan apart in a comparison: "llama2-7b on h100-sxm (datasheet), budget 80.0 GB"."""
    return (f"{result.request.spec.name} on {result.profile.name} ({result.profile.source}), "
            f"budget {result.request.budget_bytes / GB:,.1f} GB")


def utilization_figures(candidate: Candidate, unit: str) -> list[tuple[str, str, str]]:
    """(label, value, what it means) of a candidate's speed against its hardware: model TFLOP/s per GPU, MFU and
    HFU, and whether the host or the device sets the pace."""
    use = candidate.utilization
    flops = "model FLOPs: every matmul of forward and backward, causal attention counted in full"
    return [
        (f"model TFLOP/s per {unit}", f"{use.tflop_per_s_per_gpu:,.1f}", flops),
        ("MFU / HFU", "-" if use.mfu is None else f"{use.mfu:.1%} / {use.hfu:.1%}",
         "model FLOPs (HFU: with recompute) over the dense datasheet peak of the compute dtype"),
        ("compute a step", seconds_text(candidate.compute_s),
         "the device's kernels: forward, backward, recompute and offload"),
        ("host a step", seconds_text(candidate.host_s) + (" (host-bound)" if candidate.time.host_bound else ""),
         "dispatching the kernels from Python; when longer than compute the step waits on it"),
    ]


def plan_figures(result: Plan) -> dict[str, str]:
    """What two plans are compared by, as text: what runs, its tokens/s, step time, MFU and memory."""
    best = result.recommendation
    if best is None:
        return {"recommendation": recommendation_text(result), "tokens/s": "nothing fits", "step time": "-",
                "MFU": "-", "needs per GPU": "-"}
    mfu = best.utilization.mfu
    return {
        "recommendation": recommendation_text(result),
        "tokens/s": tokens_text(best.tokens_per_s),
        "step time": seconds_text(best.step_time_s),
        "MFU": "-" if mfu is None else f"{mfu:.1%}",
        "needs per GPU": f"{best.required_bytes / GB:,.1f} GB",
    }


def tokens_per_s_change(result: Plan, other: Plan) -> str | None:
    """The other plan's tokens/s against this one's ("+12.3%"); None unless both fit."""
    if result.recommendation is None or other.recommendation is None:
        return None
    return f"{other.recommendation.tokens_per_s / result.recommendation.tokens_per_s - 1:+.1%}"
