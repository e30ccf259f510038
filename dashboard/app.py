"""Headroom's dashboard: ``headroom dashboard`` (or ``streamlit run dashboard/app.py``).

The store comes from ``HEADROOM_DB`` (``headroom dashboard --db URL`` sets it),
else the default SQLite file; it is opened read-only.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from headroom.dashboard.notices import store_failed
from headroom.db.errors import StoreError

PAGES = Path(__file__).with_name("views")

st.set_page_config(page_title="Headroom", layout="wide")
navigation = st.navigation([
    st.Page(PAGES / "plan.py", title="Plan", default=True),
    st.Page(PAGES / "hardware.py", title="Hardware", url_path="hardware"),
    st.Page(PAGES / "history.py", title="History", url_path="history"),
    st.Page(PAGES / "calibration.py", title="Calibration", url_path="calibration"),
])
try:
    navigation.run()
except StoreError as err:  # a query met damage after the store opened clean: say so, not a traceback
    store_failed(err)
