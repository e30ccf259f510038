"""The Plan page's logic: inputs <-> URL query string, the plan, and its tables.

Inputs live in the query string (``?model=llama2-7b&seq_len=4096&budget=80GB``)
so a plan can be shared by its URL. `PlanInputs.from_query` reads them,
falling back to the defaults below for anything missing or unreadable;
`PlanInputs.to_query` writes them back.

The layout axes are pins: ``?gpus=64&tp=8`` searches every layout of 64 GPUs
with tp fixed at 8; ``auto`` (the default) leaves an axis to the search. Without
a GPU count (``gpus=0``) the page plans one layout, the auto axes taking
`ONE_LAYOUT`. `build_request` is the one place inputs become a TrainConfig,
a Layout and a Cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import pandas as pd

from core.advice import plan_and_advise
from core.calibration import Calibration
from core.config import TrainConfig
from core.errors import ConfigError
from core.hardware import HARDWARE
from core.interconnect import (
    DEFAULT_INTER_NODE_LINK,
    LINKS_BY_KEY,
    Cluster,
)
from core.layout import SCHEDULES, Layout
from core.layout_search import PINNABLE, pinned_layout
from core.model import ModelSpec
from core.planner import Candidate, LayoutOutcome, Plan, PlanRequest
from core.presets import get_preset
from core.stack import stack_name
from core.timing import HardwareProfile
from core.units import GB, parse_budget
from db.hardware import resolve_hardware

MODEL_SOURCES = ("preset", "dimensions", "config.json")
DATASHEET_PREFIX = "datasheet: "
MEASURED_PREFIX = "measured: "
AUTO = "auto"
MAX_GPUS = 4096
"""The page's cap on a search, which grows with the GPU count's divisors (64 GPUs of llama2-7b: 469 layouts,
6-9 s on one quiet core); `headroom plan --gpus` has none."""
PAGE_TIME_LIMIT_S = 10.0
"""A search on the page tries layouts, simplest first, for this long at most (core.planner.plan's time
limit): 4096 GPUs of llama2-7b take 31 s and 0.73 GB in full on the 2-core CI machine, and a page that a URL
can keep busy for minutes is a denial of service once it is exposed."""
ONE_LAYOUT: dict[str, Any] = {"tp": 1, "sp": False, "pp": 1, "schedule": "1f1b", "virtual_stages": 1, "cp": 1,
                              "dp": 1, "zero": 0}
"""What an axis left on auto takes without a GPU count: what ``headroom plan`` takes for a flag left out
without ``--gpus`` (cli.plan.SINGLE_GPU and cli.train_flags: one GPU, sp off, 1f1b; virtual stages 2 under
the interleaved schedule), so the page and the command plan the same layout from the same inputs
(tests/test_dashboard_defaults.py holds them together)."""
AXIS_CHOICES: dict[str, tuple[str, ...]] = {"sp": (AUTO, "on", "off"), "schedule": (AUTO, *SCHEDULES)}
"""Axes picked from a list; the others are typed (auto or a whole number)."""


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """Everything the Plan page asks for; each field is one query-string key."""

    source: str = "preset"
    model: str = "llama3.2-1b"
    """A model that fits the default layout, one GPU (llama2-7b's 16 bytes per parameter do not)."""
    block: str = "llama"
    n_layers: int = 32
    hidden: int = 4096
    n_heads: int = 32
    n_kv_heads: int = 32
    ffn_hidden: int = 11008
    vocab_size: int = 32000
    n_experts: int = 0
    """Routed experts of a llama block's MLP (a mixture of experts); 0: a dense MLP."""
    experts_per_token: int = 2
    expert_ffn_hidden: int = 0
    """Inner width of each expert; 0: ffn_hidden."""
    capacity_factor: float = 0.0
    """Each expert's capacity, ceil(t k / E x C) rows, padded; 0: dropless (core.model.ModelSpec)."""
    seq_len: int = 2048
    """``headroom plan --seq-len``'s default."""
    global_batch: int = 64
    budget: str = "80GB"
    hardware: str = DATASHEET_PREFIX + "h100-sxm"
    gpus: int = 0
    """Search every layout of this many GPUs; 0 plans the one layout the axes give."""
    gpus_per_node: int = 8
    interconnect: str = DEFAULT_INTER_NODE_LINK
    """core.interconnect key of the link between nodes."""
    # The Layout's fields (core.layout_search.PINNABLE), each AUTO or a value that pins it.
    tp: str = AUTO
    sp: str = AUTO
    pp: str = AUTO
    schedule: str = AUTO
    virtual_stages: str = AUTO
    cp: str = AUTO
    dp: str = AUTO
    zero: str = AUTO
    ep: str = AUTO
    precision: str = "amp-bf16"
    optimizer: str = "adamw"
    attention: str = "flash"
    stack: str = "reference"
    """The training stack whose kernels and checkpointing the plan follows (core.stack)."""
    offload: bool = False

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> PlanInputs:
        """Inputs from a query string; a missing or malformed value keeps its default."""
        values = {}
        for f in fields(cls):
            if f.name not in query:
                continue
            raw = str(query[f.name])
            default = getattr(cls(), f.name)
            try:
                if f.name in PINNABLE:
                    values[f.name] = _axis_text(f.name, raw)
                elif f.name == "stack":
                    values[f.name] = stack_name(raw)  # a shared link from before a rename reads as today's name
                elif isinstance(default, bool):
                    values[f.name] = raw.lower() in ("1", "true", "yes", "on")
                elif isinstance(default, int):
                    values[f.name] = int(raw)
                elif isinstance(default, float):
                    values[f.name] = float(raw)
                else:
                    values[f.name] = raw
            except (ValueError, ConfigError):
                continue
        return cls(**values)

    def to_query(self) -> dict[str, str]:
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in asdict(self).items()}

    def with_(self, **changes) -> PlanInputs:
        return replace(self, **changes)


def dimensions_spec(inputs: PlanInputs) -> ModelSpec:
    """A model from its dimensions (llama: RMSNorm + SwiGLU, no bias, and with ``n_experts`` a Mixtral-style
    mixture of experts in every block; gpt: LayerNorm + GELU, biases)."""
    llama = inputs.block == "llama"
    experts = dict(n_experts=inputs.n_experts, experts_per_token=inputs.experts_per_token,
                   expert_ffn_hidden=inputs.expert_ffn_hidden, normalize_expert_weights=True,
                   capacity_factor=inputs.capacity_factor) \
        if llama and inputs.n_experts else {}
    return ModelSpec(
        name="custom", block=inputs.block, n_layers=inputs.n_layers, hidden=inputs.hidden, n_heads=inputs.n_heads,
        n_kv_heads=inputs.n_kv_heads if llama else inputs.n_heads, ffn_hidden=inputs.ffn_hidden,
        vocab_size=inputs.vocab_size, max_seq_len=max(inputs.seq_len, 1), tied_embeddings=not llama,
        bias="none" if llama else "all", **experts,
    )


def hardware_options(measured: list[str]) -> list[str]:
    """Measured devices first (the planner prefers a box's own numbers), then every datasheet row."""
    return [MEASURED_PREFIX + name for name in measured] + [DATASHEET_PREFIX + hw.key for hw in HARDWARE]


def datasheet_hardware(option: str) -> tuple[HardwareProfile, Calibration | None]:
    """A "datasheet: KEY" option's profile (db.hardware.resolve_hardware; the store is never read)."""
    return resolve_hardware(option.removeprefix(DATASHEET_PREFIX), source="datasheet")


def _axis_text(axis: str, raw: str) -> str:
    """An axis as the query string and the widgets hold it: AUTO, or its value normalised ("02" -> "2")."""
    text = str(raw).strip().lower()
    if text in ("", AUTO):
        return AUTO
    if axis in AXIS_CHOICES:
        text = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}.get(text, text)
        if text not in AXIS_CHOICES[axis]:
            raise ConfigError(f"{axis} {raw!r} is not one of {', '.join(AXIS_CHOICES[axis])}")
        return text
    try:
        return str(int(text))
    except ValueError:
        raise ConfigError(f"{axis.replace('_', ' ')} {raw!r} is neither auto nor a whole number") from None


def pinned_axes(inputs: PlanInputs) -> frozenset[str]:
    """Layout fields the inputs set (not AUTO)."""
    return frozenset(axis for axis in PINNABLE if _axis_text(axis, getattr(inputs, axis)) != AUTO)


def pins_text(request: PlanRequest) -> str:
    """The request's pinned axes with their values, in the Layout's field order: "tp 2, sp off, zero 1"."""
    def value(axis: str) -> str:
        held = getattr(request.layout, axis)
        return ("on" if held else "off") if isinstance(held, bool) else str(held)

    return ", ".join(f"{axis.replace('_', ' ')} {value(axis)}" for axis in PINNABLE if axis in request.pinned)


def build_layout(inputs: PlanInputs) -> Layout:
    """The layout the axes give: a pinned axis its value, an AUTO one `ONE_LAYOUT`'s without a GPU count (sp off,
    as ``headroom plan --tp 2`` plans it) and the Layout default (what the search ignores) with one. ConfigError
    names the bad axis."""
    search = inputs.gpus > 0
    values: dict[str, Any] = {}
    for axis in PINNABLE:
        text = _axis_text(axis, getattr(inputs, axis))
        if text != AUTO:
            values[axis] = text == "on" if axis == "sp" else text if axis == "schedule" else int(text)
    if search and values.get("sp") and "tp" not in values:
        raise ConfigError("sp on needs tp pinned above 1; leave sp on auto: the search turns it on whenever tp > 1")
    if values.get("schedule") == "interleaved":
        values.setdefault("virtual_stages", 2)
    elif values.get("virtual_stages", 1) > 1:
        values.setdefault("schedule", "interleaved")
    if not search:
        for axis, value in ONE_LAYOUT.items():
            values.setdefault(axis, value)
        if values["pp"] == 1:  # one stage runs no pipeline: a pinned schedule is dropped (dashboard.plan_notes says so)
            values.update(schedule="1f1b", virtual_stages=1)
    return pinned_layout(values) if search else Layout(**values)


def build_cluster(inputs: PlanInputs, profile: HardwareProfile) -> Cluster:
    """The hardware's own link inside a node (a stated stand-in when it has no datasheet row), the chosen
    interconnect between nodes (HardwareProfile.cluster: datasheet links, with the device's measured
    collectives inside a node where the store has them)."""
    if inputs.interconnect not in LINKS_BY_KEY:
        raise ConfigError(f"interconnect {inputs.interconnect!r} is not one of {', '.join(LINKS_BY_KEY)}")
    return profile.cluster(inputs.gpus_per_node, inputs.interconnect)


def build_request(inputs: PlanInputs, spec: ModelSpec, profile: HardwareProfile | None = None) -> PlanRequest:
    """The planner's request; ConfigError (shown as is) when an input is invalid.

    With a GPU count the pinned axes are kept and the others searched; without one the
    request plans exactly `build_layout`. ``profile`` names the hardware whose link joins a
    node's GPUs; without it the planner takes the hardware's default cluster.
    """
    if isinstance(inputs.gpus, bool) or not isinstance(inputs.gpus, int) or inputs.gpus < 0:
        raise ConfigError(f"GPUs to search must be 0 (plan the one layout) or a positive count, got {inputs.gpus!r}")
    if inputs.gpus > MAX_GPUS:
        raise ConfigError(f"{inputs.gpus} GPUs is over this page's cap of {MAX_GPUS} (every layout is tried, which "
                          f"takes minutes at that size); plan it with `headroom plan --gpus {inputs.gpus}`")
    layout = build_layout(inputs)
    train = TrainConfig(seq_len=inputs.seq_len, precision=inputs.precision, optimizer=inputs.optimizer,
                        attention=inputs.attention, stack=inputs.stack, layout=layout)
    search = inputs.gpus > 0
    cluster = build_cluster(inputs, profile) if profile is not None and (search or layout.world > 1) else None
    return PlanRequest(spec=spec, train=train, global_batch=inputs.global_batch,
                       budget_bytes=parse_budget(inputs.budget), allow_offload=inputs.offload,
                       gpus=inputs.gpus if search else None, pinned=pinned_axes(inputs) if search else frozenset(),
                       cluster=cluster)


def make_plan(inputs: PlanInputs, spec: ModelSpec, profile: HardwareProfile, calibration: Calibration | None) -> Plan:
    return plan_and_advise(build_request(inputs, spec, profile), profile, calibration,
                           time_limit_s=PAGE_TIME_LIMIT_S)


def resolve_preset(name: str) -> ModelSpec:
    return get_preset(name)


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
            where = f" on the {count(len(result.layouts), 'layout')} of {result.request.gpus} GPUs tried in time"
        return f"Nothing fits the {result.request.budget_bytes / GB:.1f} GB budget{where}"
    return (
        f"micro-batch {best.config.micro_batch} x accumulation {best.accumulation_steps} x "
        f"{best.layout.dp} data-parallel rank(s), recompute {best.config.recompute}, on {best.layout} "
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
    end of core.planner.rejection_reason's text), so a table can show both without cutting the reason short."""
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
    """The rejected candidate needing the least memory: the one core.advice names "the closest candidate"."""
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


# --- Layouts: the chosen one, every one searched, and two side by side -------------------------------------------

TIME_TERMS: tuple[str, ...] = ("forward", "backward", "recompute", "offload", "accumulation", "optimizer",
                               "communication", "bubble")
"""core.timing.StepTime.by_term's keys, in the order the stacked bar draws them."""


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


def time_terms_frame(result: Plan, shown: Mapping[str, Candidate]) -> pd.DataFrame:
    """Each candidate's step by term, calibrated (core.planner.Candidate.time_by_term), seconds.

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
    factor, fragmentation = result.calibration.memory.correction, result.profile.fragmentation
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
                         "gb": (round(peak * fragmentation) + reserve - peak) / GB})
            order += 1
    return pd.DataFrame(rows)


def communication_frame(candidate: Candidate) -> pd.DataFrame:
    """Every collective of the candidate's step (core.comm.CommTerm), before overlap."""
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


# --- Another plan: the same inputs with another model preset, budget or hardware, side by side ----------------------

SAME = "same as this plan"
"""The compare form's choice that keeps this plan's model or hardware (an empty budget keeps its budget)."""


def compared_inputs(inputs: PlanInputs, model: str = SAME, budget: str = "", hardware: str = SAME) -> PlanInputs | None:
    """This plan's inputs with another model preset, budget or hardware; None when nothing differs."""
    changes: dict[str, Any] = {}
    if model != SAME:
        changes.update(source="preset", model=model)
    if budget.strip():
        changes["budget"] = budget.strip()
    if hardware != SAME:
        changes["hardware"] = hardware
    other = inputs.with_(**changes)
    return None if other == inputs else other


def plan_title(result: Plan) -> str:
    """What sets a plan apart in a comparison: "llama2-7b on h100-sxm (datasheet), budget 80.0 GB"."""
    return (f"{result.request.spec.name} on {result.profile.name} ({result.profile.source}), "
            f"budget {result.request.budget_bytes / GB:,.1f} GB")


def plan_figures(result: Plan) -> dict[str, str]:
    """What two plans are compared by, as text: what runs, its step time, memory and tokens/s."""
    best = result.recommendation
    if best is None:
        return {"recommendation": recommendation_text(result), "tokens/s": "nothing fits", "step time": "-",
                "needs per GPU": "-"}
    return {
        "recommendation": recommendation_text(result),
        "tokens/s": tokens_text(best.tokens_per_s),
        "step time": seconds_text(best.step_time_s),
        "needs per GPU": f"{best.required_bytes / GB:,.1f} GB",
    }


def tokens_per_s_change(result: Plan, other: Plan) -> str | None:
    """The other plan's tokens/s against this one's ("+12.3%"); None unless both fit."""
    if result.recommendation is None or other.recommendation is None:
        return None
    return f"{other.recommendation.tokens_per_s / result.recommendation.tokens_per_s - 1:+.1%}"
