"""Stores that cannot be used as they are: damaged inside, on a full disk, in a read-only directory.

Each ``headroom db`` command says, in one line, which store and the real
cause: a damaged file (exit status 2: restore it), a directory SQLite cannot
create its files in (2: the store is intact), a full disk (1: the machine).
A refused command leaves the store's bytes as they were and no new store
behind. A truncated file, refused the same way, is tests/test_db_migrations.py's.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import event, text
from sqlalchemy.pool import Pool

from headroom.db import engine as db_engine
from headroom.db.bundle import export_bundle
from headroom.db.bundle_file import write_bundle
from headroom.db.migrate import head
from headroom.db.store import open_store
from tests.db_support import damaged_bytes, one_run_store, record_run

REPO = Path(__file__).resolve().parents[1]
ADVICE = "it is not a readable Headroom store (restore it from a backup or a bundle, or point {} at another store)"
READ_ONLY_REASON = r"\((attempt to write a readonly database|unable to open database file)\)"
"""SQLite's words when it cannot create a file beside the store: the first when the store file is writable."""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return one_run_store(tmp_path_factory.mktemp("built") / "s.db")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """A bundle of 40 runs none of the stores here holds: enough rows that importing them must grow a store."""
    folder = tmp_path_factory.mktemp("bundle")
    with open_store(str(folder / "one.db"), mode="write") as store:
        record_run(store)
        (run,) = export_bundle(store)["runs"]
    path = folder / "forty.json"
    write_bundle(({**run, "uuid": str(uuid.UUID(int=n + 1))} for n in range(40)), path, head())
    return path


def copy_of(built: Path, folder: Path, name: str = "s.db", damaged: bool = False) -> Path:
    folder.mkdir(exist_ok=True)
    path = (folder / name).resolve()
    path.write_bytes(damaged_bytes(built) if damaged else built.read_bytes())
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def damaged_message(path: Path, role: str = "", option: str = "--db") -> str:
    """The one line naming ``path`` as damaged; SQLite's own detail (which page) may follow its reason."""
    named = f"the {role} sqlite:///{path}" if role else f"sqlite:///{path}"
    return (re.escape(f"headroom: error: cannot read {named}: database disk image is malformed")
            + r"( \(.+\))?" + re.escape(f"; {ADVICE.format(option)}\n"))


@pytest.mark.parametrize("action", ["info", "export"])
def test_a_reader_names_the_damaged_store(built, tmp_path, run_cli, action):
    store = copy_of(built, tmp_path / "store", damaged=True)
    before, listing = digest(store), sorted(os.listdir(store.parent))
    args = ("db", action, *([str(store.parent / "out.json")] if action == "export" else []), "--db", str(store))
    result = run_cli(*args)
    assert (result.returncode, result.stdout) == (2, "")
    assert re.fullmatch(damaged_message(store), result.stderr), result.stderr
    assert digest(store) == before and sorted(os.listdir(store.parent)) == listing  # no bundle, no temporary file


def test_text_a_damaged_page_garbled_is_damage_not_an_internal_error(built, tmp_path, run_cli):
    """A text column whose bytes are no longer UTF-8 (Python's sqlite3 refuses to decode it, with no SQLite code):
    export names the damaged store in one line, the garbled text cut short, and writes nothing."""
    store = copy_of(built, tmp_path / "store")
    with sqlite3.connect(store) as db:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        table = next(t for t in tables if "samples_s" in [c[1] for c in db.execute(f"PRAGMA table_info({t})")])
        garbled = b"[0.00055" + bytes(range(0x80, 0xC0)) * 4 + b"]"  # continuation bytes alone: no UTF-8
        db.execute(f"UPDATE {table} SET samples_s = CAST(? AS TEXT)", (garbled,))
    before, listing = digest(store), sorted(os.listdir(store.parent))
    result = run_cli("db", "export", str(store.parent / "out.json"), "--db", str(store))
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.startswith(f"headroom: error: cannot read sqlite:///{store}: Could not decode to UTF-8 column")
    assert result.stderr.endswith(f"...; {ADVICE.format('--db')}\n") and result.stderr.count("\n") == 1
    assert digest(store) == before and sorted(os.listdir(store.parent)) == listing


@pytest.mark.parametrize("action", ["upgrade", "import"])
def test_a_writer_checks_the_whole_store_before_it_reports_or_writes(built, bundle, tmp_path, run_cli, action):
    """``upgrade`` reads no damaged page (it would say "nothing to do"), nor does an import that adds nothing."""
    store = copy_of(built, tmp_path / "store", damaged=True)
    empty = tmp_path / "empty.json"
    empty.write_text('{"format": "headroom-bundle", "version": 1, "runs": []}')
    before = digest(store)
    result = run_cli("db", action, *([str(empty)] if action == "import" else []), "--db", str(store))
    assert (result.returncode, result.stdout) == (2, "")
    assert re.fullmatch(damaged_message(store), result.stderr), result.stderr
    assert digest(store) == before


def test_a_damaged_merge_source_is_named_and_no_destination_is_created(built, tmp_path, run_cli):
    source = copy_of(built, tmp_path / "store", damaged=True)
    destination = tmp_path / "new" / "m4.db"
    result = run_cli("db", "merge", str(source), "--db", str(destination))
    assert (result.returncode, result.stdout) == (2, "")
    assert re.fullmatch(damaged_message(source, "merge source", "SRC_URL"), result.stderr), result.stderr
    assert not destination.parent.exists()


def test_a_damaged_merge_destination_is_named_and_left_as_it_was(built, tmp_path, run_cli):
    source = copy_of(built, tmp_path / "source")
    destination = copy_of(built, tmp_path / "store", damaged=True)
    before = digest(destination)
    result = run_cli("db", "merge", str(source), "--db", str(destination))
    assert (result.returncode, result.stdout) == (2, "")
    assert re.fullmatch(damaged_message(destination, "merge destination"), result.stderr), result.stderr
    assert digest(destination) == before


def test_a_merge_refused_halfway_removes_the_store_it_created(built, tmp_path, run_cli):
    """The source reads, but a run in it is refused (a negative time) after the new destination was created."""
    source = copy_of(built, tmp_path / "source")
    with sqlite3.connect(source) as connection:
        connection.execute("UPDATE matmul_results SET median_s = -1")
    connection.close()
    destination = tmp_path / "store" / "m4.db"
    result = run_cli("db", "merge", str(source), "--db", str(destination))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"headroom: error: sqlite:///{source}: run 1 (") and "median_s" in result.stderr
    assert result.stderr.count("\n") == 1
    assert os.listdir(destination.parent) == []  # no store, no -wal, -shm or -journal


@pytest.fixture
def full_disk():
    """Every SQLite connection opened meanwhile may not grow its file past its present size: SQLite then fails
    a write with SQLITE_FULL, "database or disk is full", as it does on a full disk."""
    def capped(connection, _record) -> None:
        if isinstance(connection, sqlite3.Connection):
            connection.execute("PRAGMA max_page_count = 1")  # never below the pages already there

    event.listen(Pool, "connect", capped)
    yield
    event.remove(Pool, "connect", capped)


def full_message(path: Path, after: str = "") -> str:
    return (f"headroom: error: OSError: [Errno 28] sqlite:///{path}: the disk holding {path.parent} is full "
            f"(database or disk is full); free space there and rerun, or point --db at a store on another disk"
            f"{after}\n")


def test_an_import_onto_a_full_disk_says_so_and_writes_nothing(built, bundle, tmp_path, run_cli, full_disk):
    store = copy_of(built, tmp_path / "store")
    before = digest(store)
    result = run_cli("db", "import", str(bundle), "--db", str(store))
    assert (result.returncode, result.stdout, result.stderr) == (1, "", full_message(store, "; nothing imported"))
    assert digest(store) == before


def test_a_new_store_on_a_full_disk_is_not_left_behind(bundle, tmp_path, run_cli, full_disk):
    store = tmp_path / "store" / "new.db"
    result = run_cli("db", "import", str(bundle), "--db", str(store))
    assert (result.returncode, result.stdout, result.stderr) == (1, "", full_message(store))
    assert os.listdir(store.parent) == []


def without_write_permission(folder: Path, run_cli):
    """``headroom ...`` as a process that may not write in ``folder`` (mode 0555).

    A user: in this process. Root writes anywhere whatever the mode, so as
    root the command runs in a process without CAP_DAC_OVERRIDE
    (``setpriv``), where the mode holds, or the test is skipped.
    """
    folder.chmod(0o555)
    if os.geteuid() != 0:
        return run_cli
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    probe = [*drop, sys.executable, "-c", f"open({str(folder / 'probe')!r}, 'w')"]
    if shutil.which("setpriv") is None or subprocess.run(probe, check=False, capture_output=True).returncode == 0:
        pytest.skip("running as root, which chmod does not stop from writing, and setpriv cannot drop "
                    "CAP_DAC_OVERRIDE here to run the command without it")
    env = {k: v for k, v in os.environ.items() if k != "HEADROOM_DB"} | {"XDG_DATA_HOME": str(folder.parent)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*drop, sys.executable, "-m", "headroom.cli.main", *args], check=False, capture_output=True,
                              text=True, cwd=REPO, env=env, timeout=120)

    return run


@pytest.fixture
def read_only_folder(built, tmp_path):
    """A WAL store alone in a directory, which the test makes read-only; writable again afterwards."""
    store = copy_of(built, tmp_path / "store")
    with sqlite3.connect(store) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    connection.close()
    assert os.listdir(store.parent) == [store.name]
    yield store
    store.parent.chmod(0o755)


def test_a_store_in_a_read_only_directory_names_the_directory_not_damage(read_only_folder, bundle, run_cli):
    store = read_only_folder
    before, folder = digest(store), store.parent
    run = without_write_permission(folder, run_cli)
    reader = (re.escape(f"headroom: error: cannot read sqlite:///{store}: its directory {folder} is not writable by "
                        f"this user, and SQLite must create {store.name}-shm there to read a WAL store ")
              + READ_ONLY_REASON + re.escape("; the store itself may well be intact: make the directory writable, "
                                             "or copy the store (with any -wal file) to a writable directory and "
                                             "point --db at the copy\n"))
    writer = (re.escape(f"headroom: error: cannot write sqlite:///{store}: its directory {folder} is not writable by "
                        f"this user, and SQLite creates {store.name}-wal and {store.name}-shm there to write ")
              + READ_ONLY_REASON + re.escape("; make the directory writable, or point --db at a store in a "
                                             "writable directory\n"))
    for args, expected in ((("info",), reader), (("export", str(folder.parent / "out.json")), reader),
                           (("import", str(bundle)), writer)):
        result = run("db", *args, "--db", str(store))
        assert (result.returncode, result.stdout) == (2, ""), (args, result.stderr)
        assert re.fullmatch(expected, result.stderr), result.stderr
    assert digest(store) == before and os.listdir(folder) == [store.name]
    assert not (folder.parent / "out.json").exists()


def test_a_store_on_a_read_only_file_system_is_read_immutable(built, tmp_path, run_cli, monkeypatch):
    """Where nothing can write the file SQLite need not create the -shm file a WAL store is read with. (No test
    can mount a file system: the check of the mount flag is replaced, on a store SQLite could open either way.)"""
    store = copy_of(built, tmp_path / "store")
    monkeypatch.setattr(db_engine, "_on_read_only_mount", lambda _directory: True)
    with open_store(str(store)) as opened, opened.session() as session:
        assert session.scalar(text("SELECT count(*) FROM runs")) == 1
        assert os.listdir(store.parent) == [store.name]  # read immutable: no -shm, no -wal
    result = run_cli("db", "info", "--db", str(store))
    assert result.returncode == 0, result.stderr
    assert "engine    sqlite " in result.stdout and ", read-only file system, read as immutable\n" in result.stdout
    (store.parent / f"{store.name}-wal").write_bytes(b"")  # a -wal may hold committed pages: never immutable then
    assert not db_engine.read_only_file_system(store)
