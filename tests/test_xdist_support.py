"""Fixtures shared by pytest-xdist's workers are built once a run, and a failed build is tried again."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests import xdist_support
from tests.xdist_support import once_per_run


def _worker(tmp_path, name: str):
    """A worker's tmp_path_factory as once_per_run uses it: its own basetemp under the run's folder."""
    return SimpleNamespace(getbasetemp=lambda: tmp_path / f"popen-{name}")


def test_the_second_worker_reads_what_the_first_built(tmp_path, monkeypatch):
    monkeypatch.setattr(xdist_support, "WORKER", "gw0")
    built = []

    def build(folder):
        built.append(folder)
        (folder / "store.db").write_text("rows")
        return (str(folder / "store.db"), 3)

    assert once_per_run(_worker(tmp_path, "gw0"), "store", build) == [str(tmp_path / "store" / "store.db"), 3]
    assert once_per_run(_worker(tmp_path, "gw1"), "store", build) == [str(tmp_path / "store" / "store.db"), 3]
    assert built == [tmp_path / "store"]


def test_a_build_that_raised_is_built_again_in_a_clean_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(xdist_support, "WORKER", "gw0")

    def broken(folder):
        (folder / "half.db").write_text("half")
        raise RuntimeError("launch failed")

    with pytest.raises(RuntimeError, match="launch failed"):
        once_per_run(_worker(tmp_path, "gw0"), "store", broken)
    assert once_per_run(_worker(tmp_path, "gw1"), "store", lambda folder: sorted(p.name for p in folder.iterdir())) == []


def test_alone_each_session_builds_in_a_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(xdist_support, "WORKER", None)
    factory = SimpleNamespace(mktemp=lambda name: tmp_path / name)
    (tmp_path / "store").mkdir()
    assert once_per_run(factory, "store", lambda folder: (folder.name, {"a": (1, 2)})) == ["store", {"a": [1, 2]}]
