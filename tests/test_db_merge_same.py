"""``headroom db merge`` refuses to merge a store into itself, however the two locations spell it.

It compared the URLs as text: a plain path and its ``sqlite:///`` URL, a relative and an absolute path,
a symlink or a hard link, or two spellings of one PostgreSQL database went on as two stores. The
refusal is one line, exit status 2, naming both spellings and the store they share; nothing is written.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from headroom.db.store import open_store, same_store
from tests.db_support import record_run


@pytest.fixture
def store(tmp_path) -> Path:
    path = (tmp_path / "box" / "results.db").resolve()
    with open_store(str(path), mode="write") as opened:
        record_run(opened, 0)
    return path


def _digest(directory: Path) -> dict[str, str]:
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in sorted(os.listdir(directory))}


def _refused(run_cli, source: str, destination: str, store: Path, shown: tuple[str, str]) -> None:
    before = _digest(store.parent)
    result = run_cli("db", "merge", source, "--db", destination)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr == (f"headroom: error: source and destination are the same store: SRC_URL {shown[0]} and "
                             f"--db {shown[1]} both name the file {store}; give --db another store\n")
    assert _digest(store.parent) == before


def test_a_plain_path_and_its_sqlite_url(store, run_cli):
    _refused(run_cli, str(store), f"sqlite:///{store}", store, (f"sqlite:///{store}", f"sqlite:///{store}"))


def test_a_relative_sqlite_url_and_an_absolute_path(store, run_cli, monkeypatch):
    monkeypatch.chdir(store.parent.parent)
    _refused(run_cli, "sqlite:///box/results.db", str(store), store, ("sqlite:///box/results.db", f"sqlite:///{store}"))


def test_a_relative_path_and_an_absolute_sqlite_url(store, run_cli, monkeypatch):
    monkeypatch.chdir(store.parent)
    _refused(run_cli, f"sqlite:///{store}", "results.db", store, (f"sqlite:///{store}", f"sqlite:///{store}"))


def test_a_path_with_dot_dot_in_a_url(store, run_cli):
    url = f"sqlite:///{store.parent}/../box/./results.db"
    _refused(run_cli, url, str(store), store, (url, f"sqlite:///{store}"))


def test_a_symlink_named_by_url(store, run_cli):
    link = store.parent.parent / "latest.db"
    link.symlink_to(store)
    _refused(run_cli, f"sqlite:///{link}", str(store), store, (f"sqlite:///{link}", f"sqlite:///{store}"))


def test_a_hard_link(store, run_cli):
    other = store.parent.parent / "hard.db"
    os.link(store, other)
    _refused(run_cli, f"sqlite:///{other}", f"sqlite:///{store}", store, (f"sqlite:///{other}", f"sqlite:///{store}"))


def test_the_default_store_named_again(store, run_cli, monkeypatch):
    """No --db: HEADROOM_DB names the destination; SRC_URL spells the same file as a plain path."""
    monkeypatch.setenv("HEADROOM_DB", f"sqlite:///{store}")
    before = _digest(store.parent)
    result = run_cli("db", "merge", str(store))
    assert result.returncode == 2 and "source and destination are the same store" in result.stderr
    assert result.stderr.count("\n") == 1 and _digest(store.parent) == before


def test_two_stores_still_merge(store, run_cli, tmp_path):
    other = tmp_path / "fleet.db"
    result = run_cli("db", "merge", f"sqlite:///{store}", "--db", str(other))
    assert result.returncode == 0, result.stderr
    assert "added 1 runs" in result.stdout


@pytest.mark.parametrize(("a", "b"), [
    ("postgresql://u:secret@db.example.com/headroom", "postgresql+psycopg://v@DB.example.com:5432/headroom"),
    ("postgres://localhost/headroom", "postgresql://127.0.0.1:5432/headroom"),
    ("postgresql:///headroom", "postgresql://[::1]/headroom"),
    ("postgresql://db:6432/headroom", "postgresql://db:6432/headroom?sslmode=require"),
    ("postgresql://headroom@db/", "postgresql://db/headroom"),  # no database: the user's name, as libpq has it
])
def test_spellings_of_one_postgresql_database(a, b):
    assert same_store(a, b) is not None


@pytest.mark.parametrize(("a", "b"), [
    ("postgresql://db/headroom", "postgresql://db/fleet"),
    ("postgresql://db/headroom", "postgresql://db:6432/headroom"),
    ("postgresql://db-a/headroom", "postgresql://db-b/headroom"),
    ("sqlite://", "sqlite://"),  # in memory: a new database each time
    ("postgresql://localhost/results.db", "results.db"),
])
def test_different_stores(a, b, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert same_store(a, b) is None


def test_postgresql_refusal_hides_the_password(run_cli):
    result = run_cli("db", "merge", "postgresql://u:secret@db.example.com/headroom", "--db",
                     "postgresql://u:secret@DB.EXAMPLE.COM:5432/headroom")
    assert result.returncode == 2 and "secret" not in result.stderr
    assert result.stderr == (
        "headroom: error: source and destination are the same store: SRC_URL "
        "postgresql+psycopg://u:***@db.example.com/headroom and --db "
        "postgresql+psycopg://u:***@DB.EXAMPLE.COM:5432/headroom both name database headroom on db.example.com:5432; "
        "give --db another store\n")


@pytest.mark.parametrize("what", ["text", "missing", "directory"])
def test_a_source_that_is_no_store_is_named_as_the_source(store, tmp_path, run_cli, what):
    """The words of a store that cannot be opened name --db, where stores usually come from; a merge's source
    comes from SRC_URL, and the message says so. Nothing is created at --db."""
    source = tmp_path / f"src.{what}"
    if what == "text":
        source.write_text("hello\n")
    elif what == "directory":
        source.mkdir()
    destination = tmp_path / "fresh" / "dst.db"
    result = run_cli("db", "merge", "--db", str(destination), str(source))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("headroom: error: merge source: ") and result.stderr.count("\n") == 1
    assert "--db" not in result.stderr and "SRC_URL" in result.stderr
    assert not destination.exists()
