"""Calibration: predicted vs measured peak memory and step time, by device and policy."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from core.errors import ConfigError
from dashboard import calibration, charts, data
from dashboard.notices import readable_store, store_notice

st.title("Calibration")
url = readable_store()
train = data.train_steps(url)
if train.empty:
    st.info("No measured training steps yet: `headroom agent run --suite quick` (or `headroom agent train`) "
            "measures them, with the core's prediction stored next to each.")
    store_notice(data.StoreState(url, "missing"))
    st.stop()

names = sorted(train["device_name"].unique())
chosen = st.multiselect("devices", names, default=names, key="calibration_devices")
train = train[train["device_name"].isin(chosen)]
st.caption("Each point is one measured training step against the core's prediction stored with it at measurement "
           "time; error = predicted / measured - 1 (positive: over-predicted). Memory is peak allocated bytes where "
           "the device reports it (CUDA), saved-activation bytes otherwise (CPU).")

memory, time = calibration.memory_points(train), calibration.time_points(train)
left, right = st.columns(2)
with left:
    st.subheader("Peak memory (GB)")
    if len(memory):
        st.altair_chart(charts.build_calibration_chart(memory, "GB = 1e9 bytes"), width="stretch")
    st.dataframe(calibration.error_stats(memory), hide_index=True)
with right:
    st.subheader("Step time (s)")
    if len(time):
        st.altair_chart(charts.build_calibration_chart(time, "s per step"), width="stretch")
    st.dataframe(calibration.error_stats(time), hide_index=True)

st.subheader("What plans apply")
st.caption("core.measurements.calibration_from_steps: every step predicted again by today's core with the "
           "device's measured profile; the median measured / predicted becomes the factor plans multiply by, and "
           "the error left after it is the confidence plans quote.")
device = st.selectbox("device", chosen, key="calibration_factor_device")
if device is not None:
    try:
        _, fit = data.measured(url, device)
    except ConfigError as err:
        st.warning(f"{device}: {err}")
    else:
        st.dataframe(pd.DataFrame([{
            "device": device, "memory factor": fit.memory.factor, "memory error": fit.memory.error,
            "time factor": fit.time.factor, "time error": fit.time.error, "steps": fit.time.samples,
        }]), hide_index=True)
        st.markdown(f"**Confidence:** {fit.confidence()}")
