"""Altair chart builders: plain DataFrames in, charts out; no Streamlit, no store.

Units on every axis: GB = 1e9 bytes, TFLOP/s = 1e12 FLOP/s, GB/s = 1e9 bytes/s.
Rooflines and size sweeps are log-log (the only way a 1e-3 to 1e3 range reads).

Every chart reads in full: axis labels are never cut (Streamlit's theme cuts them at 100 pixels), legends sit
under the plot in columns with every entry, and charts render as SVG so their text is text in the page.
"""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from headroom.core.timing.roofline import attainable_flop_per_s

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


COMPONENT_COLORS = {
    "parameters": "#1f4e79", "gradients": "#4c78a8", "master weights": "#9ecae9", "optimizer states": "#6a51a3",
    "gradient buckets": "#b79fd8", "gathered parameters": "#8c564b", "weight copies": "#17becf",
    "activations": "#f58518", "logits": "#54a24b", "forward transient": "#e45756", "backward transient": "#ff9d98",
    "optimizer transient": "#d6616b", "margin": "#bab0ac",
}
"""One colour per memory component (headroom.core.memory.estimate's peak components, underscores read as spaces, and the margin),
in stacking order: static state first, then what a step adds, the margin last; fixed so every memory chart reads
alike."""


def plain_name(name: str) -> str:
    """A code name as a legend shows it: "weight_copies" -> "weight copies"."""
    return name.replace("_", " ")


def build_peak_bar_chart(components: pd.DataFrame, budget_gb: float, row: str = "candidate") -> alt.LayerChart:
    """Stacked horizontal bars of peak memory by component per ``row`` (a candidate, or a rank kind: ``row``,
    ``order``, ``component``, ``gb``), and the budget as a labelled rule.

    Components of 0 GB in every bar are left out, so the legend lists only what the bars hold."""
    shown = components[components.groupby("component")["gb"].transform("max") > 0]
    shown = shown.assign(component=shown["component"].map(plain_name))
    names = [name for name in COMPONENT_COLORS if name in set(shown["component"])]
    names += sorted(set(shown["component"]) - set(names))  # a component this list does not know yet
    shown = shown.assign(stack_order=shown["component"].map(names.index))
    bars = alt.Chart(shown).mark_bar().encode(
        x=alt.X("sum(gb):Q", title="memory per GPU (GB = 1e9 bytes)", stack="zero", axis=AXIS),
        y=alt.Y(f"{row}:N", sort=alt.EncodingSortField("order"), title=None, axis=AXIS),
        color=alt.Color("component:N", legend=legend("component", columns=4),
                        scale=alt.Scale(domain=names, range=[COMPONENT_COLORS.get(n, "#333333") for n in names])),
        order=alt.Order("stack_order:Q"),
        tooltip=[f"{row}:N", "component:N", alt.Tooltip("gb:Q", title="GB", format=",.2f")],
    )
    longest = float(shown.groupby(row)["gb"].sum().max()) if len(shown) else budget_gb
    return svg(alt.layer(bars, *budget_rule(budget_gb, 0.0, max(longest, budget_gb))), ROOM_ABOVE)


def build_candidates_chart(candidates: pd.DataFrame, budget_gb: float,
                           window: tuple[float, float]) -> alt.LayerChart:
    """Throughput vs memory required of the candidates, fitting and rejected, over ``window`` (GB of required
    memory: where the choice is made, headroom.dashboard.plan_tables.decision_window), with the budget line.

    ``candidates`` holds the rows inside the window (headroom.dashboard.plan_tables.in_window); tokens/s starts where they
    do, not at 0, so candidates a few percent apart stand apart."""
    points = alt.Chart(candidates).mark_point(filled=True, size=90, opacity=0.9).encode(
        x=alt.X("required_gb:Q", title="required memory per GPU (GB)", axis=AXIS,
                scale=alt.Scale(domain=list(window), nice=False)),
        y=alt.Y("tokens_per_s:Q", title="tokens/s (all ranks)", axis=AXIS, scale=alt.Scale(zero=False)),
        color=alt.Color("fits:N", legend=legend("fits the budget", columns=2),
                        scale=alt.Scale(domain=["fits", "rejected"], range=["#2a9d8f", "#e76f51"])),
        shape=alt.Shape("recompute:N", legend=legend("recompute", columns=4)),
        tooltip=["candidate:N", *(["layout:N"] if "layout" in candidates else []), "fits:N",
                 alt.Tooltip("tokens_per_s:Q", title="tokens/s", format=",.0f"),
                 alt.Tooltip("required_gb:Q", title="required GB", format=",.1f"), "rejection:N"],
    )
    return svg(alt.layer(points, *budget_rule(budget_gb, *window)), ROOM_ABOVE)


def budget_text(budget_gb: float) -> str:
    """The budget rule's label: "budget 80 GB", "budget 25.77 GB" (24 GiB)."""
    return f"budget {budget_gb:,.2f}".rstrip("0").rstrip(".") + " GB"


def budget_rule(budget_gb: float, low: float, high: float) -> tuple[alt.Chart, alt.Chart]:
    """The budget as a dashed red rule across a plot from ``low`` to ``high`` GB, labelled at its top ("budget
    80 GB"): left of the rule in the plot's right half, right of it otherwise, so the label stays on the chart."""
    right_half = budget_gb - low > 0.5 * (high - low)
    return labelled_rule("budget_gb", budget_gb, budget_text(budget_gb), "x", "left" if right_half else "right")


def labelled_rule(field: str, value: float, text: str, channel: str, side: str = "left") -> tuple[alt.Chart, alt.Chart]:
    """A dashed red rule at ``value`` on the ``channel`` ("x": vertical, "y": horizontal) axis, and its label:
    above the plot on the rule's ``side`` for a vertical rule, over the rule's right end for a horizontal one."""
    at = alt.Chart(pd.DataFrame({field: [value]}))
    rule = at.mark_rule(color="red", strokeDash=[6, 3], size=2).encode(
        **{channel: f"{field}:Q"}, tooltip=[alt.Tooltip(f"{field}:Q", title=text, format=",.1f")],
    )
    beside = {"left": {"align": "right", "dx": -4}, "right": {"align": "left", "dx": 4}}[side]
    place = {**beside, "dy": -4, "y": 0} if channel == "x" else {"align": "right", "dy": -4, "x": "width"}
    label = at.mark_text(color="red", baseline="bottom", fontWeight="bold", text=text, **place).encode(
        **{channel: f"{field}:Q"})
    return rule, label


TERM_COLORS = {"forward": "#4c78a8", "backward": "#72b7b2", "recompute": "#f58518", "offload": "#b279a2",
               "host": "#54a24b", "accumulation": "#9d755d", "optimizer": "#bab0ac", "communication": "#e45756",
               "bubble": "#eeca3b"}
"""One colour per step-time term (headroom.dashboard.plan_tables.TIME_TERMS), fixed so two charts read alike."""


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
        color=alt.Color("term:N", legend=legend("term", columns=4),
                        scale=alt.Scale(domain=list(TERM_COLORS), range=list(TERM_COLORS.values()))),
        order=alt.Order("term_order:Q"),
        tooltip=["row:N", "term:N", alt.Tooltip("time:Q", title=unit, format=".3g")],
    ))


def roof_frame(roofs: dict[str, tuple[float, float]], intensities: np.ndarray | None = None) -> pd.DataFrame:
    """Points along each roof: ``roofs`` maps a name to (peak FLOP/s, bytes/s); FLOP/s = min(peak, I x bandwidth)."""
    grid = intensities if intensities is not None else np.logspace(-2, 4, 61)
    rows = []
    for name, (peak, bandwidth) in roofs.items():
        ridge = peak / bandwidth
        for intensity in sorted({*map(float, grid), ridge}):
            rows.append({"roof": name, "intensity": intensity,
                         "tflop_per_s": attainable_flop_per_s(intensity, peak, bandwidth) / 1e12})
    return pd.DataFrame(rows)


def build_roofline_chart(roofs: pd.DataFrame, points: pd.DataFrame) -> alt.LayerChart:
    """Log-log roofline: roofs as lines (``roof``, ``intensity``, ``tflop_per_s``), measurements as points
    (``kind``, ``label``, ``intensity``, ``tflop_per_s``)."""
    x = alt.X("intensity:Q", scale=alt.Scale(type="log"), title="arithmetic intensity (FLOP/byte)", axis=AXIS)
    y = alt.Y("tflop_per_s:Q", scale=alt.Scale(type="log"), title="TFLOP/s", axis=AXIS)
    lines = alt.Chart(roofs).mark_line(strokeWidth=2).encode(
        x=x, y=y, strokeDash=alt.StrokeDash("roof:N", legend=legend("roof", columns=2)), color=alt.value("#555"),
        tooltip=["roof:N", alt.Tooltip("intensity:Q", format=".3g"), alt.Tooltip("tflop_per_s:Q", format=".4g")],
    )
    dots = alt.Chart(points).mark_point(**MARKER).encode(
        x=x, y=y, color=alt.Color("kind:N", legend=legend("measured", columns=4), scale=alt.Scale(scheme="tableau10")),
        shape=alt.Shape("kind:N", legend=legend("measured", columns=4)),
        tooltip=["kind:N", "label:N", alt.Tooltip("intensity:Q", format=".3g"), alt.Tooltip("tflop_per_s:Q", format=".4g")],
    )
    return svg(alt.layer(lines, dots))


def build_matmul_size_chart(matmul: pd.DataFrame) -> alt.Chart:
    """Median TFLOP/s by GEMM size (FLOPs of one product, log) per dtype (``dtype``, ``flops``, ``tflop_per_s``)."""
    return svg(alt.Chart(matmul).mark_line(strokeWidth=2.5, point=alt.OverlayMarkDef(**MARKER)).encode(
        x=alt.X("flops:Q", scale=alt.Scale(type="log"), title="FLOPs per product (2 m n k x batch)",
                axis=alt.Axis(labelLimit=0, format="~s")),
        y=alt.Y("median(tflop_per_s):Q", scale=alt.Scale(type="log"), title="TFLOP/s (median over runs)", axis=AXIS),
        color=alt.Color("dtype:N", legend=legend("dtype", columns=4), scale=alt.Scale(scheme="tableau10")),
        tooltip=["dtype:N", alt.Tooltip("flops:Q", format=",.3g"), alt.Tooltip("median(tflop_per_s):Q", format=".4g")],
    ))


def build_bandwidth_chart(elementwise: pd.DataFrame, datasheet_gb_per_s: float | None = None) -> Chart:
    """Best GB/s by elementwise op and dtype (``op``, ``dtype``, ``gb_per_s``), and the datasheet bandwidth."""
    bars = alt.Chart(elementwise).mark_bar().encode(
        x=alt.X("op:N", title="op", axis=alt.Axis(labelLimit=0, labelAngle=0)),
        xOffset="dtype:N",
        y=alt.Y("max(gb_per_s):Q", title="GB/s (1e9 bytes/s, best run)", axis=AXIS),
        color=alt.Color("dtype:N", legend=legend("dtype", columns=4), scale=alt.Scale(scheme="tableau10")),
        tooltip=["op:N", "dtype:N", alt.Tooltip("max(gb_per_s):Q", format=",.1f")],
    )
    if datasheet_gb_per_s is None:
        return svg(bars)
    text = f"datasheet {datasheet_gb_per_s:,.0f} GB/s"
    return svg(alt.layer(bars, *labelled_rule("gb_per_s", datasheet_gb_per_s, text, "y")))


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


def build_timeline_chart(timeline: pd.DataFrame) -> alt.LayerChart:
    """One key figure over time per device (``device``, ``started_at``, ``value``, ``drop``), drops circled red."""
    base = alt.Chart(timeline).encode(
        x=alt.X("started_at:T", title="run started (UTC)", scale=alt.Scale(domain=time_domain(timeline["started_at"])),
                axis=alt.Axis(labelLimit=0, format=TIME_FORMAT, tickCount=5, labelOverlap=True)),
        y=alt.Y("value:Q", title=timeline["figure"].iloc[0] if len(timeline) else "value", axis=AXIS),
        color=alt.Color("device:N", legend=legend("device", columns=3), scale=alt.Scale(scheme="tableau10")),
    )
    lines = base.mark_line(strokeWidth=2.5, point=alt.OverlayMarkDef(**MARKER)).encode(
        tooltip=["device:N", "hostname:N", alt.Tooltip("started_at:T", format=TIME_FORMAT),
                 alt.Tooltip("value:Q", format=",.4g"), "uuid:N"]
    )
    drops = base.transform_filter(alt.datum.drop).mark_point(size=260, color="red", strokeWidth=2.5).encode(
        color=alt.value("red"),
        tooltip=["device:N", alt.Tooltip("started_at:T", format=TIME_FORMAT), alt.Tooltip("change:Q", format="+.1%")]
    )
    return svg(alt.layer(lines, drops))


def build_calibration_chart(points: pd.DataFrame, unit: str) -> alt.LayerChart:
    """Predicted vs measured (``predicted``, ``measured``, ``device``, ``policy``), log-log, with y = x."""
    low = float(min(points["predicted"].min(), points["measured"].min())) if len(points) else 1.0
    high = float(max(points["predicted"].max(), points["measured"].max())) if len(points) else 10.0
    scale = alt.Scale(type="log")
    dots = alt.Chart(points).mark_point(**MARKER).encode(
        x=alt.X("measured:Q", scale=scale, title=f"measured ({unit})", axis=AXIS),
        y=alt.Y("predicted:Q", scale=scale, title=f"predicted ({unit})", axis=AXIS),
        # Half a page wide (the Calibration page puts two side by side): devices above, policies below.
        color=alt.Color("device:N", legend=legend("device", columns=2, orient="top"),
                        scale=alt.Scale(scheme="tableau10")),
        shape=alt.Shape("policy:N", legend=legend("policy", columns=3)),
        tooltip=["device:N", "label:N", alt.Tooltip("predicted:Q", format=".4g"),
                 alt.Tooltip("measured:Q", format=".4g"), alt.Tooltip("error:Q", format="+.1%")],
    )
    diagonal = alt.Chart(pd.DataFrame({"measured": [low, high], "predicted": [low, high]})).mark_line(
        color="#888", strokeDash=[4, 4]
    ).encode(x=alt.X("measured:Q", scale=scale), y=alt.Y("predicted:Q", scale=scale))
    return svg(alt.layer(diagonal, dots))
