"""How the dashboard's tables show their columns: plain headers with units, numbers with thousands separators.

Each mapping is a ``column_config`` for st.dataframe, keyed by the frame's own column names (headroom.dashboard.plan_tables,
headroom.dashboard.calibration, headroom.dashboard.history), so the frames keep names code can use and the page shows names a
reader knows. Formats are sprintf-js strings as Streamlit's NumberColumn takes them (``%,.1f``: "1,234.5"),
or its named formats (``percent``: 0.123 -> "12.30%"). Tables with empty cells pass ``placeholder=MISSING``
so they read "-", not "None".
"""

from __future__ import annotations

import streamlit as st

MISSING = "-"
"""What a missing value shows."""

GB_FORMAT = "%,.1f"
SECONDS_FORMAT = "%,.4g"
"""Four significant digits: candidates a few milliseconds apart still differ, and a tiny model's microseconds show."""


def _gb(label: str) -> dict:
    return st.column_config.NumberColumn(label, format=GB_FORMAT)


def _whole(label: str, **more) -> dict:
    return st.column_config.NumberColumn(label, format="%,d", **more)


def _percent(label: str) -> dict:
    """A fraction as a percentage with two decimals on every row ("55.58%", "77.00%"): the step sets the
    precision of Streamlit's named formats, which otherwise drop trailing zeros ("77%")."""
    return st.column_config.NumberColumn(label, format="percent", step=0.0001)


PLAN = {
    "rank": _whole("rank"),
    "candidate": st.column_config.TextColumn("candidate", width="medium"),
    "layout": st.column_config.TextColumn("layout", width=230),
    "gpus": _whole("GPUs"),
    "micro_batch": _whole("micro-batch"),
    "accumulation": _whole("accumulation"),
    "recompute": st.column_config.TextColumn("recompute"),
    "tokens_per_s": st.column_config.NumberColumn("tokens/s", format="%,.0f"),
    "step_time_s": st.column_config.NumberColumn("step (s)", format=SECONDS_FORMAT),
    "peak_gb": _gb("peak (GB)"),
    "required_gb": _gb("needs (GB)"),
    "headroom_gb": _gb("headroom (GB)"),
    "over_gb": _gb("over (GB)"),
    "fits": st.column_config.TextColumn("fits"),
    "broken_by": st.column_config.TextColumn("what breaks the budget", width=280),
    "why": st.column_config.TextColumn("why not chosen", width=380),
}
"""Candidates and layouts (headroom.dashboard.plan_tables.candidates_frame, layouts_frame). The Plan page sizes
the text columns it shows from their text (headroom.dashboard.widths.fitted_columns); the widths here are for a
table that does not."""
LAYOUTS_SHOWN = ["rank", "layout", "tokens_per_s", "step_time_s", "required_gb", "why"]
"""The layouts table's columns, so "why not chosen" has room: every layout has the search's GPU count, a missing
rank says it does not fit, and the reason names the candidate."""

PRUNED = {
    "layout": st.column_config.TextColumn("layout", width=230),
    "gpus": _whole("GPUs"),
    "max_tokens_per_s": st.column_config.NumberColumn("tokens/s at most", format="%,.0f"),
    "floor_step_s": st.column_config.NumberColumn("step at least (s)", format=SECONDS_FORMAT),
    "lightest": st.column_config.TextColumn("lightest candidate"),
}
"""The layouts a search left out (headroom.dashboard.plan_tables.pruned_frame)."""

COLLECTIVES = {
    "axis": st.column_config.TextColumn("axis"),
    "op": st.column_config.TextColumn("collective"),
    "message_mb": st.column_config.NumberColumn("message (MB)", format="%,.2f"),
    "calls": _whole("calls"),
    "group": _whole("group size"),
    "link": st.column_config.TextColumn("link"),
    "seconds": st.column_config.NumberColumn("time (s)", format=SECONDS_FORMAT),
    "overlappable": st.column_config.CheckboxColumn("overlappable"),
    "note": st.column_config.TextColumn("note", width="large"),
}
"""One step's collectives (headroom.dashboard.plan_tables.communication_frame)."""

ERROR_STATS = {
    "steps": _whole("steps"),
    "measured / predicted (median)": st.column_config.NumberColumn("measured / predicted", format="x%.3f"),
    "median |error|": _percent("median |error|"),
    "worst |error|": _percent("worst |error|"),
    "noisy, left out": _whole("noisy, left out", help="steps whose timing the agent flagged (a busy host) or "
                              "whose repetitions spread more than their median: left out of these statistics, as "
                              "the factor plans apply leaves them out"),
}
"""Calibration error statistics (headroom.dashboard.calibration.error_stats)."""

STEPS = {
    "label": st.column_config.TextColumn("step", width="large"),
    "predicted": st.column_config.NumberColumn("predicted (s)", format=SECONDS_FORMAT),
    "measured": st.column_config.NumberColumn("measured (s)", format=SECONDS_FORMAT),
    "error": _percent("error"),
    "noisy": st.column_config.TextColumn("left out of the factor: noisy", width="medium"),
    "plan": st.column_config.LinkColumn("plan", display_text="open on the Plan page", width="medium",
                                        help="the Plan page, evaluating this step's configuration on its device"),
}
"""Every measured step's time (headroom.dashboard.calibration.time_points)."""

DROPS = {
    "hostname": st.column_config.TextColumn("host"),
    "started_at": st.column_config.DatetimeColumn("started (UTC)", format="YYYY-MM-DD HH:mm"),
    "value": st.column_config.NumberColumn("value", format="%,.4g"),
    "previous_median": st.column_config.NumberColumn("previous median", format="%,.4g"),
    "change": _percent("change"),
    "uuid": st.column_config.TextColumn("run"),
}
"""Runs that dropped below their device's previous median (headroom.dashboard.history.timeline)."""

SIDE_BY_SIDE = {"_index": st.column_config.TextColumn("", width="medium")}
"""Runs side by side (headroom.dashboard.history.side_by_side): the row names (identity, software, key figures) in full."""
