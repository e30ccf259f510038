"""Altair chart builders: plain DataFrames in, charts out; no Streamlit, no store.

Units on every axis: GB = 1e9 bytes, TFLOP/s = 1e12 FLOP/s, GB/s = 1e9 bytes/s.
Rooflines and size sweeps are log-log (the only way a 1e-3 to 1e3 range reads).

Every chart reads in full: axis labels are never cut (Streamlit's theme cuts them at 100 pixels), legends sit
under the plot in columns with every entry, and charts render as SVG so their text is text in the page. Every
colour comes from headroom.dashboard.colours, one colour per meaning across the charts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import altair as alt
import numpy as np
import pandas as pd

from headroom.core.timing.roofline import attainable_flop_per_s
from headroom.dashboard import colours

Chart = alt.Chart | alt.LayerChart

AXIS = alt.Axis(labelLimit=0)
"""Axis labels at full length (0: no limit)."""
SVG = {"embedOptions": {"renderer": "svg"}}
"""Vega-Embed options (Streamlit reads them from the spec's ``usermeta``): draw as SVG, so labels and legend
entries are <text> a browser test can read; Streamlit would switch a chart of many points to a canvas."""
FIT_WIDTH = alt.AutoSizeParams(type="fit-x", contains="padding")
"""Fit the page's width only: a legend under the plot adds to the chart's height instead of squeezing the plot
(Streamlit's theme fits both, so a legend of three rows left a roofline a third of its height)."""
MARKER = {"filled": True, "size": 110, "opacity": 1}
"""Markers that stand out on a light background: solid, opaque, large enough to tell shapes apart."""


def legend(title: str, columns: int, orient: str = "bottom") -> alt.Legend:
    """A legend under the plot (or above it: ``orient``), ``columns`` entries a row, every entry and label in full.

    Legends on one side sit in one row, so two of them share the chart's width: a half-page chart gives
    each its own side."""
    return alt.Legend(title=title, orient=orient, direction="horizontal", columns=columns, symbolLimit=0,
                      labelLimit=0)


PADDING = {"top": 8, "left": 5, "right": 8, "bottom": 5}
"""Pixels around a chart, so the top tick's label, the last one (label flush) and the y title are not clipped."""
ROOM_ABOVE = {**PADDING, "top": 22}
"""A chart whose rule is labelled above the plot: Vega leaves no room for text drawn there."""


def svg(chart: Chart, padding: dict[str, int] = PADDING) -> Chart:
    """The chart, drawn as SVG (`SVG`), as wide as the page and as tall as its plot and legends (`FIT_WIDTH`)."""
    return chart.properties(usermeta=SVG, autosize=FIT_WIDTH, padding=padding)


def colour_scale(meaning: Mapping[str, str], present: Iterable[str] | None = None) -> alt.Scale:
    """The colour scale of one meaning (a headroom.dashboard.colours table) over the names ``present`` (every
    name of the table when None), in the table's order: a name means the same colour in every chart."""
    domain, colour_range = colours.domain_range(meaning, present)
    return alt.Scale(domain=domain, range=colour_range)


def plain_name(name: str) -> str:
    """A code name as a legend shows it: "weight_copies" -> "weight copies"."""
    return name.replace("_", " ")


def build_peak_bar_chart(components: pd.DataFrame, budget_gb: float, row: str = "candidate") -> alt.LayerChart:
    """Stacked horizontal bars of peak memory by component per ``row`` (a candidate, or a rank kind: ``row``,
    ``order``, ``component``, ``gb``), and the budget as a labelled rule.

    Components of 0 GB in every bar are left out, so the legend lists only what the bars hold."""
    shown = components[components.groupby("component")["gb"].transform("max") > 0]
    shown = shown.assign(component=shown["component"].map(plain_name))
    scale = colour_scale(colours.MEMORY, shown["component"])  # a component the table lacks comes last
    names = scale.domain
    shown = shown.assign(stack_order=shown["component"].map(names.index))
    bars = alt.Chart(shown).mark_bar().encode(
        x=alt.X("sum(gb):Q", title="memory per GPU (GB = 1e9 bytes)", stack="zero", axis=AXIS),
        y=alt.Y(f"{row}:N", sort=alt.EncodingSortField("order"), title=None, axis=AXIS),
        color=alt.Color("component:N", legend=legend("component", columns=4), scale=scale),
        order=alt.Order("stack_order:Q"),
        tooltip=[f"{row}:N", "component:N", alt.Tooltip("gb:Q", title="GB", format=",.2f")],
    )
    longest = float(shown.groupby(row)["gb"].sum().max()) if len(shown) else budget_gb
    return svg(alt.layer(bars, *budget_rule(budget_gb, 0.0, max(longest, budget_gb))), ROOM_ABOVE)


def build_candidates_chart(candidates: pd.DataFrame, budget_gb: float, window: tuple[float, float],
                           cloud: bool = False) -> alt.LayerChart:
    """Throughput vs memory required over ``window`` (GB of required memory: where the choice is made,
    headroom.dashboard.plan_tables.decision_window), with the budget line: the Pareto front (``front``:
    headroom.dashboard.plan_tables.pareto_front), fitting and rejected, joined by a step line; with ``cloud``,
    every other candidate in grey behind it.

    ``candidates`` holds the rows inside the window (headroom.dashboard.plan_tables.in_window). The line steps
    after each point (the most tokens/s that much memory buys holds until the next point). Tokens/s starts
    where the points drawn do, not at 0, so candidates a few percent apart stand apart."""
    x = alt.X("required_gb:Q", title="required memory per GPU (GB)", axis=AXIS,
              scale=alt.Scale(domain=list(window), nice=False))
    y = alt.Y("tokens_per_s:Q", title="tokens/s (all ranks)", axis=AXIS, scale=alt.Scale(zero=False))
    tooltip = ["candidate:N", *(["layout:N"] if "layout" in candidates else []), "fits:N",
               alt.Tooltip("tokens_per_s:Q", title="tokens/s", format=",.0f"),
               alt.Tooltip("required_gb:Q", title="required GB", format=",.1f"), "rejection:N"]
    on_front = candidates["front"].astype(bool)
    front = candidates[on_front].sort_values(["required_gb", "tokens_per_s"], ascending=[True, False])
    step = alt.Chart(front).mark_line(interpolate="step-after", strokeWidth=1.5,
                                      color=colours.MARK["front"]).encode(x=x, y=y)
    points = alt.Chart(front).mark_point(filled=True, size=90, opacity=1).encode(
        x=x, y=y,
        color=alt.Color("fits:N", legend=legend("fits the budget", columns=2), scale=colour_scale(colours.FIT)),
        shape=alt.Shape("recompute:N", legend=legend("recompute", columns=4)),
        tooltip=tooltip,
    )
    behind = [alt.Chart(candidates[~on_front]).mark_point(
        filled=True, size=30, opacity=0.7, color=colours.MARK["other candidates"]).encode(x=x, y=y, tooltip=tooltip)
    ] if cloud else []
    return svg(alt.layer(*behind, step, points, *budget_rule(budget_gb, *window)), ROOM_ABOVE)


def budget_text(budget_gb: float) -> str:
    """The budget rule's label: "budget 80 GB", "budget 25.77 GB" (24 GiB)."""
    return f"budget {budget_gb:,.2f}".rstrip("0").rstrip(".") + " GB"


def budget_rule(budget_gb: float, low: float, high: float) -> tuple[alt.Chart, alt.Chart]:
    """The budget as a dashed rule in the red of a limit across a plot from ``low`` to ``high`` GB, labelled at
    its top ("budget 80 GB"): left of the rule in the plot's right half, right of it otherwise, so the label stays
    on the chart."""
    right_half = budget_gb - low > 0.5 * (high - low)
    return labelled_rule("budget_gb", budget_gb, budget_text(budget_gb), "x", "left" if right_half else "right")


def labelled_rule(field: str, value: float, text: str, channel: str, side: str = "left") -> tuple[alt.Chart, alt.Chart]:
    """A dashed rule in the red of a limit (headroom.dashboard.colours.MARK) at ``value`` on the ``channel``
    ("x": vertical, "y": horizontal) axis, and its label: above the plot on the rule's ``side`` for a vertical
    rule, over the rule's right end for a horizontal one."""
    at = alt.Chart(pd.DataFrame({field: [value]}))
    rule = at.mark_rule(color=colours.MARK["limit"], strokeDash=[6, 3], size=2).encode(
        **{channel: f"{field}:Q"}, tooltip=[alt.Tooltip(f"{field}:Q", title=text, format=",.1f")],
    )
    beside = {"left": {"align": "right", "dx": -4}, "right": {"align": "left", "dx": 4}}[side]
    place = {**beside, "dy": -4, "y": 0} if channel == "x" else {"align": "right", "dy": -4, "x": "width"}
    label = at.mark_text(color=colours.MARK["limit"], baseline="bottom", fontWeight="bold", text=text,
                         **place).encode(**{channel: f"{field}:Q"})
    return rule, label


TIME_UNITS = ((0.1, "seconds", 1.0), (1e-4, "milliseconds", 1e3), (0.0, "microseconds", 1e6))
"""(shortest longest bar, unit, factor): a step-time axis in the unit headroom.dashboard.plan_tables.seconds_text would pick,
so a tiny model's axis does not read 0.000020, 0.000040, ..."""


def build_step_time_chart(terms: pd.DataFrame) -> alt.Chart:
    """Stacked horizontal bars of one step's time by term per row (``row``, ``order``, ``term``,
    ``term_order``, ``seconds``): compute, recompute, offload, exposed communication and the pipeline bubble.

    The axis takes the unit (`TIME_UNITS`) that reads at the longest bar; ``seconds`` stays in the data."""
    longest = float(terms.groupby("row")["seconds"].sum().max()) if len(terms) else 1.0
    unit, factor = next((unit, factor) for least, unit, factor in TIME_UNITS if longest >= least)
    shown = terms.assign(time=terms["seconds"] * factor)
    return svg(alt.Chart(shown).mark_bar().encode(
        x=alt.X("sum(time):Q", title=f"{unit} per optimizer step", stack="zero", axis=AXIS),
        y=alt.Y("row:N", sort=alt.EncodingSortField("order"), title=None, axis=AXIS),
        color=alt.Color("term:N", legend=legend("term", columns=4), scale=colour_scale(colours.TIME)),
        order=alt.Order("term_order:Q"),
        tooltip=["row:N", "term:N", alt.Tooltip("time:Q", title=unit, format=".3g")],
    ))


ROOF_DASHES = {"datasheet": [1, 0], "measured": [6, 3]}
"""A roof's line by where its numbers come from: the datasheet's solid, the measured one dashed."""


def roof_frame(roofs: pd.DataFrame, intensities: np.ndarray | None = None) -> pd.DataFrame:
    """Points along each roof of ``roofs`` (headroom.dashboard.roofs.roof_table: ``roof``, ``source``,
    ``dtype``, ``peak_flop_per_s``, ``bytes_per_s``): FLOP/s = min(peak, I x bandwidth), at each intensity of
    the grid and at the roof's ridge, so the corner is drawn where it is."""
    grid = intensities if intensities is not None else np.logspace(-2, 4, 61)
    rows = []
    for roof in roofs.itertuples(index=False):
        peak, bandwidth = float(roof.peak_flop_per_s), float(roof.bytes_per_s)
        for intensity in sorted({*map(float, grid), peak / bandwidth}):
            rows.append({"roof": roof.roof, "source": roof.source, "dtype": roof.dtype, "intensity": intensity,
                         "tflop_per_s": attainable_flop_per_s(intensity, peak, bandwidth) / 1e12})
    return pd.DataFrame(rows, columns=["roof", "source", "dtype", "intensity", "tflop_per_s"])


def build_roofline_chart(roofs: pd.DataFrame, points: pd.DataFrame) -> alt.LayerChart:
    """Log-log roofline: each dtype's measurements drawn against its own roofs, in that dtype's colour.

    Roofs are lines (`roof_frame`: ``roof``, ``source``, ``dtype``, ``intensity``, ``tflop_per_s``; the
    datasheet's solid, the measured dashed), measurements points shaped by kind (``kind``, ``dtype``, ``label``,
    ``intensity``, ``tflop_per_s``): an fp8 matmul sits under the fp8 roof, not the bf16 one."""
    x = alt.X("intensity:Q", scale=alt.Scale(type="log"), title="arithmetic intensity (FLOP/byte)", axis=AXIS)
    y = alt.Y("tflop_per_s:Q", scale=alt.Scale(type="log"), title="TFLOP/s", axis=AXIS)
    dtype = alt.Color("dtype:N", legend=legend("dtype", columns=5),
                      scale=colour_scale(colours.DTYPE, [*roofs["dtype"], *points["dtype"]]))
    sources = [source for source in ROOF_DASHES if source in set(roofs["source"])]
    lines = alt.Chart(roofs).mark_line(strokeWidth=2).encode(
        x=x, y=y, color=dtype, detail="roof:N",
        strokeDash=alt.StrokeDash("source:N", legend=legend("roof", columns=2),
                                  scale=alt.Scale(domain=sources, range=[ROOF_DASHES[s] for s in sources])),
        tooltip=["roof:N", alt.Tooltip("intensity:Q", format=".3g"), alt.Tooltip("tflop_per_s:Q", format=".4g")],
    )
    dots = alt.Chart(points).mark_point(**MARKER).encode(
        x=x, y=y, color=dtype, shape=alt.Shape("kind:N", legend=legend("measured", columns=4)),
        tooltip=["kind:N", "dtype:N", "label:N", alt.Tooltip("intensity:Q", format=".3g"),
                 alt.Tooltip("tflop_per_s:Q", format=".4g")],
    )
    return svg(alt.layer(lines, dots))


def build_matmul_size_chart(matmul: pd.DataFrame) -> alt.Chart:
    """Median TFLOP/s by GEMM size (FLOPs of one product, log) per dtype (``dtype``, ``flops``, ``tflop_per_s``)."""
    return svg(alt.Chart(matmul).mark_line(strokeWidth=2.5, point=alt.OverlayMarkDef(**MARKER)).encode(
        x=alt.X("flops:Q", scale=alt.Scale(type="log"), title="FLOPs per product (2 m n k x batch)",
                axis=alt.Axis(labelLimit=0, format="~s")),
        y=alt.Y("median(tflop_per_s):Q", scale=alt.Scale(type="log"), title="TFLOP/s (median over runs)", axis=AXIS),
        color=alt.Color("dtype:N", legend=legend("dtype", columns=5),
                        scale=colour_scale(colours.DTYPE, matmul["dtype"])),
        tooltip=["dtype:N", alt.Tooltip("flops:Q", format=",.3g"), alt.Tooltip("median(tflop_per_s):Q", format=".4g")],
    ))


def build_bandwidth_chart(elementwise: pd.DataFrame, datasheet_gb_per_s: float | None = None) -> Chart:
    """Best GB/s by elementwise op and dtype (``op``, ``dtype``, ``gb_per_s``), and the datasheet bandwidth."""
    bars = alt.Chart(elementwise).mark_bar().encode(
        x=alt.X("op:N", title="op", axis=alt.Axis(labelLimit=0, labelAngle=0)),
        xOffset="dtype:N",
        y=alt.Y("max(gb_per_s):Q", title="GB/s (1e9 bytes/s, best run)", axis=AXIS),
        color=alt.Color("dtype:N", legend=legend("dtype", columns=5),
                        scale=colour_scale(colours.DTYPE, elementwise["dtype"])),
        tooltip=["op:N", "dtype:N", alt.Tooltip("max(gb_per_s):Q", format=",.1f")],
    )
    if datasheet_gb_per_s is None:
        return svg(bars)
    text = f"datasheet {datasheet_gb_per_s:,.0f} GB/s"
    return svg(alt.layer(bars, *labelled_rule("gb_per_s", datasheet_gb_per_s, text, "y")))


def device_scale(devices: Iterable[str], every: Iterable[str] = ()) -> alt.Scale:
    """The colour scale of the devices a chart draws, each in its colour among ``every`` device of the store
    (headroom.dashboard.colours.device_colours)."""
    found = colours.device_colours(devices, every)
    return alt.Scale(domain=list(found), range=list(found.values()))


TIME_FORMAT = "%Y-%m-%d %H:%M"
"""Dates on a time axis: to the minute, never a bare millisecond (".138")."""
MIN_TIME_SPAN = pd.Timedelta(hours=2)
"""The narrowest time axis: one run, or runs minutes apart, sit inside two hours instead of milliseconds."""


def time_domain(times: pd.Series) -> list[str]:
    """The timeline's x range: the runs' span, widened to `MIN_TIME_SPAN` around its middle when narrower."""
    low, high = pd.Timestamp(times.min()), pd.Timestamp(times.max())
    if high - low < MIN_TIME_SPAN:
        middle = low + (high - low) / 2
        low, high = middle - MIN_TIME_SPAN / 2, middle + MIN_TIME_SPAN / 2
    return [low.isoformat(), high.isoformat()]


def build_timeline_chart(timeline: pd.DataFrame, every: Iterable[str] = ()) -> alt.LayerChart:
    """One key figure over time per device (``device``, ``started_at``, ``value``, ``drop``), drops circled in
    the colour of a drop; ``every``: the store's devices, which decide each device's colour."""
    base = alt.Chart(timeline).encode(
        x=alt.X("started_at:T", title="run started (UTC)", scale=alt.Scale(domain=time_domain(timeline["started_at"])),
                axis=alt.Axis(labelLimit=0, format=TIME_FORMAT, tickCount=5, labelOverlap=True)),
        y=alt.Y("value:Q", title=timeline["figure"].iloc[0] if len(timeline) else "value", axis=AXIS),
        color=alt.Color("device:N", legend=legend("device", columns=3), scale=device_scale(timeline["device"], every)),
    )
    lines = base.mark_line(strokeWidth=2.5, point=alt.OverlayMarkDef(**MARKER)).encode(
        tooltip=["device:N", "hostname:N", alt.Tooltip("started_at:T", format=TIME_FORMAT),
                 alt.Tooltip("value:Q", format=",.4g"), "uuid:N"]
    )
    drops = base.transform_filter(alt.datum.drop).mark_point(size=260, strokeWidth=2.5).encode(
        color=alt.value(colours.MARK["drop"]),
        tooltip=["device:N", alt.Tooltip("started_at:T", format=TIME_FORMAT), alt.Tooltip("change:Q", format="+.1%")]
    )
    return svg(alt.layer(lines, drops))


def build_calibration_chart(points: pd.DataFrame, unit: str, every: Iterable[str] = ()) -> alt.LayerChart:
    """Predicted vs measured (``predicted``, ``measured``, ``device``, ``policy``), log-log, with y = x;
    ``every``: the store's devices, which decide each device's colour."""
    low = float(min(points["predicted"].min(), points["measured"].min())) if len(points) else 1.0
    high = float(max(points["predicted"].max(), points["measured"].max())) if len(points) else 10.0
    scale = alt.Scale(type="log")
    dots = alt.Chart(points).mark_point(**MARKER).encode(
        x=alt.X("measured:Q", scale=scale, title=f"measured ({unit})", axis=AXIS),
        y=alt.Y("predicted:Q", scale=scale, title=f"predicted ({unit})", axis=AXIS),
        # Half a page wide (the Calibration page puts two side by side): devices above, policies below.
        color=alt.Color("device:N", legend=legend("device", columns=2, orient="top"),
                        scale=device_scale(points["device"], every)),
        shape=alt.Shape("policy:N", legend=legend("policy", columns=3)),
        tooltip=["device:N", "label:N", alt.Tooltip("predicted:Q", format=".4g"),
                 alt.Tooltip("measured:Q", format=".4g"), alt.Tooltip("error:Q", format="+.1%")],
    )
    diagonal = alt.Chart(pd.DataFrame({"measured": [low, high], "predicted": [low, high]})).mark_line(
        color=colours.MARK["reference"], strokeDash=[4, 4]
    ).encode(x=alt.X("measured:Q", scale=scale), y=alt.Y("predicted:Q", scale=scale))
    return svg(alt.layer(diagonal, dots))
