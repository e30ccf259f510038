"""The History page keeps what was picked: narrowing or widening the devices keeps the runs still offered."""

from __future__ import annotations

from pathlib import Path

import pytest

from headroom.db.store import open_store
from tests.db_support import record_run

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
DEVICES = ("GPU A", "GPU B", "GPU C", "GPU A", "GPU B")
"""One run each, run ids 1 to 5 in this order (the page lists them newest first)."""


@pytest.fixture(scope="module")
def five_runs(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('history') / 'results.db'}"
    with open_store(url, mode="write") as store:
        for seed, device in enumerate(DEVICES):
            record_run(store, seed=seed, device_name=device, hostname=f"host-{seed + 1}")
    return url


def compared(at: AppTest) -> list[str]:
    """The side-by-side table's columns: each run's device and its uuid's first 8 characters."""
    return [column.rpartition(" ")[0] for column in at.dataframe[0].value.columns]


def test_changing_the_devices_keeps_the_runs_still_offered(five_runs, monkeypatch):
    monkeypatch.setenv("HEADROOM_DB", five_runs)
    at = AppTest.from_file(APP, default_timeout=120)
    at.switch_page("views/history.py")
    at.run()
    assert not at.exception
    runs = at.multiselect(key="history_runs")
    assert at.multiselect(key="history_devices").value == ["GPU A", "GPU B", "GPU C"]
    assert runs.value == [5, 4]  # the newest two
    runs.set_value([1, 2, 3]).run()  # the oldest three: GPU A's host-1, GPU B's host-2, GPU C's host-3
    assert compared(at) == ["GPU C", "GPU B", "GPU A"]  # newest first
    at.multiselect(key="history_devices").set_value(["GPU A", "GPU C"]).run()
    assert not at.exception
    assert at.multiselect(key="history_runs").value == [1, 3]  # GPU B's run is no longer offered
    assert compared(at) == ["GPU C", "GPU A"]
    at.multiselect(key="history_devices").set_value(["GPU A", "GPU B", "GPU C"]).run()
    assert at.multiselect(key="history_runs").value == [1, 3]  # widening keeps them too
    assert [str(w.value) for w in at.warning] == []  # no complaint about a default set twice
    at.multiselect(key="history_devices").set_value(["GPU B"]).run()
    assert not at.exception  # none of the picked runs is offered: the newest two that are, not an empty table
    assert at.multiselect(key="history_runs").value == [5, 2] and compared(at) == ["GPU B", "GPU B"]


def test_what_is_still_chosen():
    from headroom.dashboard.history import still_chosen

    assert still_chosen(None, [5, 4, 3], [5, 4]) == [5, 4]  # first visit: the default
    assert still_chosen([3, 9, 4], [5, 4, 3], [5, 4]) == [3, 4]  # what is still offered, in its order
    assert still_chosen([9], [5, 4, 3], [5, 4]) == [5, 4]  # nothing left: the default again
    assert still_chosen([], [5, 4, 3], [5, 4]) == []  # emptied by the user: stays empty


def test_a_stored_name_that_would_reverse_its_label_is_shown_escaped(tmp_path, monkeypatch):
    """A store written before names were checked: U+202E in a device name reversed the rest of its run's label."""
    import sqlite3

    path = tmp_path / "old.db"
    with open_store(f"sqlite:///{path}", mode="write") as store:
        record_run(store, device_name="GPU A")
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE fingerprints SET device_name = ?", ("GPU \u202eA\nB",))
    monkeypatch.setenv("HEADROOM_DB", f"sqlite:///{path}")
    at = AppTest.from_file(APP, default_timeout=120)
    at.switch_page("views/history.py")
    at.run()
    assert not at.exception
    assert at.multiselect(key="history_devices").options == ["GPU \\u202eA\\nB"]
    (label,) = at.multiselect(key="history_runs").options
    assert label.startswith("GPU \\u202eA\\nB · gpu-07 · ") and "\u202e" not in label
