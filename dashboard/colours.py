"""One colour per meaning, across every chart of the dashboard.

A colour names one thing wherever it appears: orange is activations in every memory chart and nothing else in
any chart, recompute is olive in every step-time chart, bf16 is the same blue on the roofline, the matmul sizes
and the bandwidth bars. Every chart in dashboard/charts.py takes its colours from here (tests/test_colours.py
walks each chart's spec to check), and no hex value is given to two meanings.

The families: memory components in blues and purples (state), oranges (activations) and reds (what a step
allocates for a moment); step-time terms in greens (compute) and others; dtypes in dark, saturated colours that
read as lines; whether a candidate fits in teal against orange-red; and a few marks: the red of a limit (the
budget, a datasheet bandwidth), greys for what stands behind (a reference line, the candidates off the front).
Any two colours here are at least 10 apart in CIELAB (ΔE*ab; about 2.3 is a just-noticeable difference), so two
meanings never pass for one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

MEMORY: dict[str, str] = {
    "parameters": "#1f4e79", "gradients": "#4c78a8", "master weights": "#9ecae9", "optimizer states": "#6a51a3",
    "gradient buckets": "#b79fd8", "fp8 weights": "#6b8e23", "gathered parameters": "#8c564b", "weight copies": "#17becf",
    "activations": "#f58518", "logits": "#ffc875", "forward transient": "#e45756", "backward transient": "#ff9d98",
    "optimizer transient": "#a3324a", "margin": "#bab0ac",
}
"""Memory components (headroom.core.memory.estimate's peak components, underscores read as spaces, and the
margin), in stacking order: static state first, then what a step adds, the margin last."""

TIME: dict[str, str] = {
    "forward": "#2ca02c", "backward": "#98df8a", "recompute": "#bcbd22", "offload": "#7b4173", "host": "#b27d62",
    "accumulation": "#a6761d", "optimizer": "#e377c2", "communication": "#4a1486", "bubble": "#fff200",
}
"""Step-time terms (headroom.dashboard.plan_tables.TIME_TERMS), in the order the stacked bar draws them."""

DTYPE: dict[str, str] = {"fp32": "#003c30", "tf32": "#398080", "fp16": "#7f3b08", "bf16": "#0050ff",
                         "fp8": "#d01c8b"}
"""Compute dtypes (headroom.core.specs.hardware.DTYPES, in its order): a dtype's points, bars and roof alike."""

FIT: dict[str, str] = {"fits": "#009e73", "rejected": "#ff5a00"}
"""Whether a candidate fits the budget."""

MARK: dict[str, str] = {
    "limit": "#ff0000", "front": "#4d4d4d", "other candidates": "#d9d9d9", "reference": "#8a8a8a",
    "drop": "#000000",
}
"""Marks that are not categories: a limit's rule and label (the budget, a datasheet bandwidth), the Pareto
front's step line, the candidates behind the front, a reference line (y = x), a flagged drop in a timeline."""

DEVICES: tuple[str, ...] = ("#475900", "#bc3df2", "#590009", "#7b8053", "#594516", "#a66c83")
"""Devices (a timeline's lines, the calibration points), given in the order of their names; a seventh device
takes the first colour again (a chart of more devices than this tells them apart by its tooltip)."""

UNLISTED = "#333333"
"""A memory component the core reports and `MEMORY` does not list yet (tests/test_colours.py checks that every
component the core reports is listed, so it stays unused)."""

MEANINGS: dict[str, Mapping[str, str]] = {
    "memory component": MEMORY, "time term": TIME, "dtype": DTYPE, "fit": FIT, "mark": MARK,
    "device": {f"device {i}": colour for i, colour in enumerate(DEVICES, 1)},
    "unlisted": {"unlisted memory component": UNLISTED},
}
"""Every meaning a colour is given, by family: each hex value appears once in all of them."""


def domain_range(colours: Mapping[str, str], present: Iterable[str] | None = None) -> tuple[list[str], list[str]]:
    """A colour scale's domain and range: the names of ``colours`` (those in ``present`` only, when given) in
    their order, then any of ``present`` it does not list, in `UNLISTED`."""
    if present is None:
        return list(colours), list(colours.values())
    held = list(dict.fromkeys(present))
    names = [name for name in colours if name in held] + sorted(set(held) - set(colours))
    return names, [colours.get(name, UNLISTED) for name in names]


def device_colours(devices: Iterable[str], every: Iterable[str] = ()) -> dict[str, str]:
    """Each of ``devices``' colour, by name: `DEVICES` in the sorted order of ``every`` (every device the store
    holds, so that a device keeps its colour on each page and whichever others are drawn beside it) and of any
    of ``devices`` it does not name. A store of more devices than `DEVICES` has colours gives two of them one
    colour; where two such are drawn together, the drawn devices take `DEVICES` in their own order instead."""
    drawn = sorted(set(devices))
    order = {name: i for i, name in enumerate(sorted(set(every) | set(drawn)))}
    kept = {name: DEVICES[order[name] % len(DEVICES)] for name in drawn}
    if len(set(kept.values())) < len(kept) <= len(DEVICES):
        return {name: DEVICES[i] for i, name in enumerate(drawn)}
    return kept
