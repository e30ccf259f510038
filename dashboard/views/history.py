"""History: pick devices and runs, compare them side by side, and watch key figures over time."""

from __future__ import annotations

import streamlit as st

from headroom.core.safe_text import printable
from headroom.dashboard import charts, columns, data, history
from headroom.dashboard.notices import readable_store, store_notice

st.title("History")
url = readable_store()
all_runs = data.runs(url)
if all_runs.empty:
    store_notice(data.StoreState(url, "missing"))
    st.stop()

figures = data.key_figures(url)
names = sorted(all_runs["device_name"].unique())
# Each multiselect's choices are carried over when its options change (a device added to the store, runs of
# devices no longer chosen): what is still offered stays chosen; the default replaces a choice none of which is.
st.session_state.history_devices = history.still_chosen(st.session_state.get("history_devices"), names, names[:4])
chosen_devices = st.multiselect("devices", names, format_func=printable, key="history_devices")
mine = figures[figures["device"].isin(chosen_devices)]
st.caption(f"{len(mine)} of {len(figures)} runs. Key figures: best bf16 matmul (fp32 where no bf16 ran), best copy "
           "bandwidth, and tokens/s of each device's reference training step (the configuration most of its runs "
           "measured).")

st.subheader("Compare runs")
labels = {row.run_id: f"{row.device} · {row.hostname} · {row.started_at:%Y-%m-%d %H:%M} · {row.uuid[:8]}"
          for row in mine.head(500).itertuples()}
st.session_state.history_runs = history.still_chosen(st.session_state.get("history_runs"), list(labels),
                                                    list(labels)[:2])
picked = st.multiselect("runs (newest first)", list(labels), format_func=lambda run: printable(labels[run]),
                        key="history_runs")
if picked:
    st.dataframe(history.side_by_side(figures, picked), height="content", column_config=columns.SIDE_BY_SIDE)

st.subheader("Timeline")
figure = st.selectbox("key figure", history.FIGURES, key="history_figure")
line = history.timeline(mine, figure)
if line.empty:
    st.info(f"No {figure} measured on the chosen devices.")
else:
    st.altair_chart(charts.build_timeline_chart(line, data.devices(url)), width="stretch")
    drops = line[line["drop"]]
    if drops.empty:
        st.success(f"No drop of more than {history.DROP_FRACTION:.0%} against a device's previous median.")
    else:
        st.warning(f"{len(drops)} run(s) fell more than {history.DROP_FRACTION:.0%} below their device's previous median:")
        st.dataframe(drops[["device", "hostname", "started_at", "value", "previous_median", "change", "uuid"]],
                     hide_index=True, column_config=columns.DROPS,
                     placeholder=columns.MISSING)
