"""Calibration: predicted vs measured peak memory and step time, by device and policy."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from headroom.core.errors import ConfigError
from headroom.core.safe_text import printable
from headroom.dashboard import calibration, charts, columns, data
from headroom.dashboard.notices import readable_store, store_notice
from headroom.dashboard.text import plain, shown_calibration

st.title("Calibration")
url = readable_store()
train = data.train_steps(url)
if train.empty:
    st.info("No measured training steps yet: `headroom agent run --suite quick` (or `headroom agent train`) "
            "measures them, with the core's prediction stored next to each.")
    store_notice(data.StoreState(url, "missing"))
    st.stop()

names = sorted(train["device_name"].unique())
chosen = st.multiselect("devices", names, default=names, format_func=printable, key="calibration_devices")
train = train[train["device_name"].isin(chosen)]
st.caption("Each point is one measured training step against the core's prediction stored with it at measurement "
           "time. Throughout: measured / predicted, and error = measured / predicted - 1 (positive: the step took "
           "more than predicted).")

memory, time = calibration.memory_points(train), calibration.time_points(train)
bases = set(memory["basis"])
memory_title = "Peak memory (GB)" if bases == {"peak allocated"} else "Memory (GB)"
left, right = st.columns(2)
with left:
    st.subheader(memory_title)
    if "saved activations" in bases:
        st.caption("Devices without allocator statistics (CPUs) show the saved-activation bytes autograd held "
                   "against the predicted ones: a check of the activation accounting, not a peak.")
    if len(memory):
        st.altair_chart(charts.build_calibration_chart(memory, "GB = 1e9 bytes"), width="stretch")
with right:
    st.subheader("Step time (s)")
    if len(time):
        st.altair_chart(charts.build_calibration_chart(time, "s per step"), width="stretch")
for title, points in ((memory_title.removesuffix(" (GB)"), memory), ("Step time", time)):
    st.markdown(f"**{title}: error by device and policy**")
    st.dataframe(calibration.error_stats(points), hide_index=True, column_config=columns.ERROR_STATS,
                 placeholder=columns.MISSING)
noisy = int(time["noisy"].astype(bool).sum()) if len(time) else 0
st.caption(f"{noisy} of {len(time)} measured steps' times are noisy (the agent found the host busy, or the slowest "
           "repetition took more than its median again): the step-time statistics leave them out, as the factor "
           "plans apply does. Memory counts every step: bytes do not depend on a busy host.")
if len(time):
    with st.expander(f"Every measured step's time ({len(time)})"):
        st.dataframe(time[["device", "label", "predicted", "measured", "error", "noisy"]], hide_index=True,
                     column_config=columns.STEPS, placeholder=columns.MISSING)

st.subheader("What plans apply")
st.caption("Every step is predicted again by today's core with the device's measured profile. Steps the agent "
           "flagged (a busy host, repetitions that disagree) and outliers (more than 2x from the median) are left "
           "out; the median measured / predicted of the rest is the factor plans multiply by, unless it is beyond "
           "2x, and the error left after it is the confidence plans quote.")
device = st.selectbox("device", chosen, format_func=printable, key="calibration_factor_device")
if device is not None:
    try:
        _, fit = data.measured(url, device)
    except ConfigError as err:
        st.warning(f"{plain(device)}: {plain(err)}")
    else:
        rows = []
        for what, one in (("peak memory", fit.memory), ("step time", fit.time), ("communication", fit.communication),
                          ("saved activations (check only)", fit.activations)):
            if one.samples or one.noisy or one.outliers:
                rows.append({"quantity": what, "steps used": one.samples,
                             "measured / predicted": f"x{one.factor:.3f}",
                             "applied": "yes" if one.applied and "check" not in what else "no",
                             "median |error| after": f"{one.error:.1%}", "left out": one.noisy + len(one.outliers)})
        if rows:
            st.dataframe(pd.DataFrame(rows), hide_index=True)
        st.markdown(f"**Confidence:** {shown_calibration(fit).confidence()}")
