"""Calibration: predicted vs measured peak memory and step time, by device and policy."""

from __future__ import annotations

import streamlit as st

from headroom.core.errors import ConfigError
from headroom.core.safe_text import printable
from headroom.dashboard import calibration, charts, columns, data
from headroom.dashboard.notices import readable_store, store_notice
from headroom.dashboard.text import confidence_markdown, plain

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
        st.altair_chart(charts.build_calibration_chart(memory, "GB = 1e9 bytes", data.devices(url)), width="stretch")
with right:
    st.subheader("Step time (s)")
    if len(time):
        st.altair_chart(charts.build_calibration_chart(time, "s per step", data.devices(url)), width="stretch")
for title, points in ((memory_title.removesuffix(" (GB)"), memory), ("Step time", time)):
    st.markdown(f"**{title} against the prediction stored with each step (no factor): error by device and policy**")
    st.dataframe(calibration.error_stats(points), hide_index=True, column_config=columns.ERROR_STATS,
                 placeholder=columns.MISSING)
noisy = int(time["noisy"].astype(bool).sum()) if len(time) else 0
st.caption(f"{noisy} of {len(time)} measured steps' times are noisy (the agent found the host busy, or the slowest "
           "repetition took more than its median again): the step-time statistics leave them out, as the factor "
           "plans apply does. Memory counts every step: bytes do not depend on a busy host.")
if len(time):
    with st.expander(f"Every measured step's time ({len(time)})"):
        st.dataframe(time[["device", "label", "predicted", "measured", "error", "noisy", "plan"]], hide_index=True,
                     column_config=columns.STEPS, placeholder=columns.MISSING)

st.subheader("What plans apply")
st.caption("Today's core predicts every step again with the device's measured profile. Steps the agent flagged "
           "(a busy host, repetitions that disagree) are left out. Outliers (more than 2x from the median) are left "
           "out. The median measured / predicted of the rest is the factor plans multiply by. A factor beyond 2x is "
           "not applied. The error after the factor is in-sample: the factor is fitted on the same steps. The tables "
           "above differ: they compare each step with the prediction stored when it ran, by policy, with no factor.")
device = st.selectbox("device", chosen, format_func=printable, key="calibration_factor_device")
if device is not None:
    try:
        _, fit = data.measured(url, device)
    except ConfigError as err:
        st.warning(f"{plain(device)}: {plain(err)}")
    else:
        st.dataframe(calibration.factor_table(fit), hide_index=True)
        st.markdown(confidence_markdown(fit))
