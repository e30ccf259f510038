"""Hardware: per device, its roofline (a roof per dtype), matmul throughput by size and bandwidth by op."""

from __future__ import annotations

import streamlit as st

from headroom.core.specs.hardware import DTYPES
from headroom.dashboard import charts, data, plan_tables, roofs
from headroom.dashboard.notices import readable_store, store_notice
from headroom.dashboard.text import plain

st.title("Hardware")
url = readable_store()
names = data.devices(url)
if not names:
    store_notice(data.StoreState(url, "missing"))
    st.stop()

device = st.selectbox("device", names, key="hardware_device")
matmul = data.matmul(url, device)
elementwise = data.elementwise(url, device)
attention = data.attention(url, device)
run_rows = data.runs(url)
device_type = run_rows.loc[run_rows["device_name"] == device, "device_type"].iloc[0]
spec = roofs.datasheet_row(device, device_type)
points = roofs.roofline_points(matmul, attention, elementwise)
st.caption(
    f"{plain(device)} ({device_type}); datasheet: {spec.name + ' — ' + spec.source if spec else 'none (CPU or unknown device)'}. "
    f"{len(matmul)} matmul, {len(attention)} attention and {len(elementwise)} elementwise results "
    f"from {plan_tables.count(int(run_rows['device_name'].eq(device).sum()), 'run')}."
)
if not len(matmul) and spec is None:
    st.info("No matmul measurements for this device yet.")
    st.stop()

st.subheader("Roofline")
# Each dtype measured has its own roofs; a device measured in none shows its datasheet's.
dtypes = roofs.present_dtypes(points) or [d for d in DTYPES if spec is not None and d in spec.peak_flop_per_s]
roof_table = roofs.roof_table(spec, matmul, elementwise, dtypes)
st.altair_chart(charts.build_roofline_chart(charts.roof_frame(roof_table), points), width="stretch")
for roof in roof_table.itertuples(index=False):
    tflop_per_s = roof.peak_flop_per_s / 1e12
    peak = f"{tflop_per_s:,.0f}" if tflop_per_s >= 100 else f"{tflop_per_s:.3g}"  # 1,979, not 1.98e+03
    st.markdown(f"- **{roof.roof}** roof: {peak} TFLOP/s, {roof.bytes_per_s / 1e9:,.4g} GB/s, "
                f"ridge at {roof.peak_flop_per_s / roof.bytes_per_s:,.3g} FLOP/byte")
st.caption("Each dtype's points are drawn against its own roofs, in its colour: the datasheet's dense peak for "
           "that dtype (solid) and the best matmul rate measured in it (dashed), both with the bandwidth slope "
           "(datasheet HBM; measured: the best bandwidth of any memory-bound op). Intensity: matmul 2mnk over both "
           "operands read and the result written once; attention 4bs²hd, halved when causal as FlashAttention's "
           "benchmarks count it (the masked half is skipped), over Q, K, V read and O written; elementwise placed "
           "at one FLOP per element over its bytes moved.")

left, right = st.columns(2)
with left:
    st.subheader("Matmul TFLOP/s by size")
    if len(matmul):
        st.altair_chart(charts.build_matmul_size_chart(matmul), width="stretch")
    else:
        st.info("No matmul results.")
with right:
    st.subheader("Bandwidth by op")
    if len(elementwise):
        datasheet_gb_per_s = spec.hbm_bytes_per_s / 1e9 if spec else None
        st.altair_chart(charts.build_bandwidth_chart(elementwise, datasheet_gb_per_s), width="stretch")
    else:
        st.info("No elementwise results.")
