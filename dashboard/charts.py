"""Altair chart builders: plain DataFrames in, charts out; no Streamlit, no store.

Units on every axis: GB = 1e9 bytes, TFLOP/s = 1e12 FLOP/s, GB/s = 1e9 bytes/s.
Rooflines and size sweeps are log-log (the only way a 1e-3 to 1e3 range reads).
"""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from core.roofline import attainable_flop_per_s

Chart = alt.Chart | alt.LayerChart


def build_peak_bar_chart(components: pd.DataFrame, budget_gb: float, row: str = "candidate") -> alt.LayerChart:
    """Stacked horizontal bars of peak memory by component per ``row`` (a candidate, or a rank kind: ``row``,
    ``order``, ``component``, ``gb``), and the budget as a rule."""
    bars = alt.Chart(components).mark_bar().encode(
        x=alt.X("sum(gb):Q", title="memory per GPU (GB = 1e9 bytes)", stack="zero"),
        y=alt.Y(f"{row}:N", sort=alt.EncodingSortField("order"), title=None),
        color=alt.Color("component:N", title="component"),
        order=alt.Order("component:N"),
        tooltip=[f"{row}:N", "component:N", alt.Tooltip("gb:Q", format=".2f")],
    )
    rule = alt.Chart(pd.DataFrame({"budget_gb": [budget_gb]})).mark_rule(color="red", strokeDash=[6, 3], size=2).encode(
        x="budget_gb:Q", tooltip=[alt.Tooltip("budget_gb:Q", title="budget GB", format=".1f")],
    )
    return alt.layer(bars, rule)


def build_candidates_chart(candidates: pd.DataFrame, budget_gb: float) -> alt.LayerChart:
    """Throughput vs memory required for every candidate, fitting and rejected, with the budget line."""
    points = alt.Chart(candidates).mark_point(filled=True, size=70).encode(
        x=alt.X("required_gb:Q", title="required memory per GPU (GB)"),
        y=alt.Y("tokens_per_s:Q", title="tokens/s (all ranks)"),
        color=alt.Color("fits:N", scale=alt.Scale(domain=["fits", "rejected"], range=["#2a9d8f", "#e76f51"])),
        shape=alt.Shape("recompute:N"),
        tooltip=["candidate:N", *(["layout:N"] if "layout" in candidates else []), "fits:N",
                 alt.Tooltip("tokens_per_s:Q", format=",.0f"), alt.Tooltip("required_gb:Q", format=".1f"),
                 "rejection:N"],
    )
    rule = alt.Chart(pd.DataFrame({"budget_gb": [budget_gb]})).mark_rule(color="red", strokeDash=[6, 3]).encode(
        x="budget_gb:Q"
    )
    return alt.layer(points, rule)


TERM_COLORS = {"forward": "#4c78a8", "backward": "#72b7b2", "recompute": "#f58518", "offload": "#b279a2",
               "accumulation": "#9d755d", "optimizer": "#bab0ac", "communication": "#e45756", "bubble": "#eeca3b"}
"""One colour per step-time term (dashboard.planning.TIME_TERMS), fixed so two charts read alike."""


def build_step_time_chart(terms: pd.DataFrame) -> alt.Chart:
    """Stacked horizontal bars of one step's seconds by term per row (``row``, ``order``, ``term``,
    ``term_order``, ``seconds``): compute, recompute, offload, exposed communication and the pipeline bubble."""
    return alt.Chart(terms).mark_bar().encode(
        x=alt.X("sum(seconds):Q", title="seconds per optimizer step", stack="zero"),
        y=alt.Y("row:N", sort=alt.EncodingSortField("order"), title=None),
        color=alt.Color("term:N", title="term", scale=alt.Scale(domain=list(TERM_COLORS),
                                                                  range=list(TERM_COLORS.values()))),
        order=alt.Order("term_order:Q"),
        tooltip=["row:N", "term:N", alt.Tooltip("seconds:Q", format=".3g")],
    )


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
    x = alt.X("intensity:Q", scale=alt.Scale(type="log"), title="arithmetic intensity (FLOP/byte)")
    y = alt.Y("tflop_per_s:Q", scale=alt.Scale(type="log"), title="TFLOP/s")
    lines = alt.Chart(roofs).mark_line().encode(
        x=x, y=y, strokeDash=alt.StrokeDash("roof:N", title="roof"), color=alt.value("#555"),
        tooltip=["roof:N", alt.Tooltip("intensity:Q", format=".3g"), alt.Tooltip("tflop_per_s:Q", format=".4g")],
    )
    dots = alt.Chart(points).mark_point(filled=True, size=60).encode(
        x=x, y=y, color=alt.Color("kind:N", title="measured"), shape=alt.Shape("kind:N"),
        tooltip=["kind:N", "label:N", alt.Tooltip("intensity:Q", format=".3g"), alt.Tooltip("tflop_per_s:Q", format=".4g")],
    )
    return alt.layer(lines, dots)


def build_matmul_size_chart(matmul: pd.DataFrame) -> alt.Chart:
    """Median TFLOP/s by GEMM size (FLOPs of one product, log) per dtype (``dtype``, ``flops``, ``tflop_per_s``)."""
    return alt.Chart(matmul).mark_line(point=True).encode(
        x=alt.X("flops:Q", scale=alt.Scale(type="log"), title="FLOPs per product (2 m n k x batch)"),
        y=alt.Y("median(tflop_per_s):Q", scale=alt.Scale(type="log"), title="TFLOP/s (median over runs)"),
        color=alt.Color("dtype:N"),
        tooltip=["dtype:N", alt.Tooltip("flops:Q", format=".3g"), alt.Tooltip("median(tflop_per_s):Q", format=".4g")],
    )


def build_bandwidth_chart(elementwise: pd.DataFrame, datasheet_gb_per_s: float | None = None) -> Chart:
    """Best GB/s by elementwise op and dtype (``op``, ``dtype``, ``gb_per_s``), and the datasheet bandwidth."""
    bars = alt.Chart(elementwise).mark_bar().encode(
        x=alt.X("op:N", title="op"),
        xOffset="dtype:N",
        y=alt.Y("max(gb_per_s):Q", title="GB/s (1e9 bytes/s, best run)"),
        color=alt.Color("dtype:N"),
        tooltip=["op:N", "dtype:N", alt.Tooltip("max(gb_per_s):Q", format=",.1f")],
    )
    if datasheet_gb_per_s is None:
        return bars
    rule = alt.Chart(pd.DataFrame({"gb_per_s": [datasheet_gb_per_s]})).mark_rule(color="red", strokeDash=[6, 3]).encode(
        y="gb_per_s:Q"
    )
    return alt.layer(bars, rule)


def build_timeline_chart(timeline: pd.DataFrame) -> alt.LayerChart:
    """One key figure over time per device (``device``, ``started_at``, ``value``, ``drop``), drops circled red."""
    base = alt.Chart(timeline).encode(
        x=alt.X("started_at:T", title="run started (UTC)"),
        y=alt.Y("value:Q", title=timeline["figure"].iloc[0] if len(timeline) else "value"),
        color=alt.Color("device:N"),
    )
    lines = base.mark_line(point=True).encode(
        tooltip=["device:N", "hostname:N", "started_at:T", alt.Tooltip("value:Q", format=".4g"), "uuid:N"]
    )
    drops = base.transform_filter(alt.datum.drop).mark_point(size=220, color="red", strokeWidth=2).encode(
        color=alt.value("red"), tooltip=["device:N", "started_at:T", alt.Tooltip("change:Q", format="+.1%")]
    )
    return alt.layer(lines, drops)


def build_calibration_chart(points: pd.DataFrame, unit: str) -> alt.LayerChart:
    """Predicted vs measured (``predicted``, ``measured``, ``device``, ``policy``), log-log, with y = x."""
    low = float(min(points["predicted"].min(), points["measured"].min())) if len(points) else 1.0
    high = float(max(points["predicted"].max(), points["measured"].max())) if len(points) else 10.0
    scale = alt.Scale(type="log")
    dots = alt.Chart(points).mark_point(filled=True, size=60).encode(
        x=alt.X("measured:Q", scale=scale, title=f"measured ({unit})"),
        y=alt.Y("predicted:Q", scale=scale, title=f"predicted ({unit})"),
        color=alt.Color("device:N"), shape=alt.Shape("policy:N"),
        tooltip=["device:N", "label:N", alt.Tooltip("predicted:Q", format=".4g"),
                 alt.Tooltip("measured:Q", format=".4g"), alt.Tooltip("error:Q", format="+.1%")],
    )
    diagonal = alt.Chart(pd.DataFrame({"measured": [low, high], "predicted": [low, high]})).mark_line(
        color="#888", strokeDash=[4, 4]
    ).encode(x=alt.X("measured:Q", scale=scale), y=alt.Y("predicted:Q", scale=scale))
    return alt.layer(diagonal, dots)
