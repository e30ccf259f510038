"""The dashboard as its tests open it: the Plan page of a shared URL, over an empty store."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")


def render_url(tmp_path: Path, monkeypatch, query: dict[str, str]) -> AppTest:
    """The Plan page for ``query`` (a URL's parameters) with no measurements: it ran without an exception."""
    monkeypatch.setenv("HEADROOM_DB", str(tmp_path / "none.db"))
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update(query)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at
