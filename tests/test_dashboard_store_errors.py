"""A store the dashboard cannot read (damaged pages, not SQLite at all) is one clean error on every page.

The store is made as tests/test_db_damaged.py makes it: one run, then pages 4 and 5 (the fingerprints
table and its index) overwritten with random bytes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from headroom.db.errors import DamagedStoreError  # noqa: E402
from tests.db_support import damaged_bytes, one_run_store  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
PAGES = ("plan", "hardware", "history", "calibration")
ADVICE = ("it is not a readable Headroom store (restore it from a backup or a bundle, or point --db at another "
          "store)")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return one_run_store(tmp_path_factory.mktemp("built") / "s.db")


def damaged(built: Path, folder: Path) -> Path:
    path = folder / "damaged.db"
    path.write_bytes(damaged_bytes(built))
    return path


def render(page: str, url: str, monkeypatch) -> AppTest:
    monkeypatch.setenv("HEADROOM_DB", url)
    at = AppTest.from_file(APP, default_timeout=120)
    if page != "plan":
        at.switch_page(f"views/{page}.py")
    at.run()
    return at


@pytest.mark.parametrize("page", PAGES)
def test_a_store_with_damaged_pages_is_one_error_naming_it(page, built, tmp_path, monkeypatch):
    path = damaged(built, tmp_path)
    at = render(page, f"sqlite:///{path}", monkeypatch)
    assert not at.exception, [e.value for e in at.exception]
    errors = [str(e.value) for e in at.error]
    assert len(errors) == 1, errors
    assert re.fullmatch(re.escape(f"cannot read sqlite:///{path}: database disk image is malformed") + r"( \(.+\))?"
                        + re.escape(f"; {ADVICE}"), errors[0]), errors[0]
    if page == "plan":  # the plan still comes from the datasheets
        assert at.selectbox(key="plan_hardware").value == "datasheet: h100-sxm"
        assert any("Recommendation" in str(e.value) for e in (*at.success, *at.error[1:]))
    else:
        assert not at.dataframe and not at.get("vega_lite_chart")


@pytest.mark.parametrize("page", PAGES)
def test_a_file_that_is_not_sqlite_is_one_error_naming_it(page, tmp_path, monkeypatch):
    path = tmp_path / "notes.db"
    path.write_bytes(b"not a database at all\n" * 10)
    at = render(page, f"sqlite:///{path}", monkeypatch)
    assert not at.exception, [e.value for e in at.exception]
    assert [str(e.value) for e in at.error] == [
        f"{path} is not a SQLite database (it starts with b'not a database a', not b'SQLite format 3\\x00'); "
        "--db expects a Headroom store: sqlite:///PATH (or a plain file path) or "
        "postgresql+psycopg://USER@HOST/DATABASE"]


def test_damage_a_query_meets_later_is_one_error_too(built, tmp_path, monkeypatch):
    """A store that opened clean and is damaged while the server runs: the query that meets it stops the page
    with the store's message, not a traceback, and the store is opened (and checked) again on the next visit."""
    from headroom.dashboard import data

    path = tmp_path / "s.db"
    path.write_bytes(built.read_bytes())
    url = f"sqlite:///{path}"
    at = render("history", url, monkeypatch)
    assert not at.exception and not at.error
    failure = DamagedStoreError(url, "database disk image is malformed")

    def meets_damage(_url):
        raise failure

    monkeypatch.setattr(data, "key_figures", meets_damage)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [str(e.value) for e in at.error] == [
        f"cannot read {url}: database disk image is malformed; {ADVICE}"]
    path.write_bytes(damaged(built, tmp_path).read_bytes())
    monkeypatch.undo()
    monkeypatch.setenv("HEADROOM_DB", url)
    at.run()
    assert not at.exception
    assert [re.sub(r" \(.+\);", ";", str(e.value)) for e in at.error] == [
        f"cannot read {url}: database disk image is malformed; {ADVICE}"]
