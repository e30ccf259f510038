"""``headroom db export PATH`` writes a temporary file and renames it over PATH: what PATH may be.

The rename replaces whatever node PATH names, so the store itself (or a file
SQLite keeps beside it), a directory and a node that is not a regular file
(a device, a FIFO, a socket) are refused with exit status 2 and one line
naming PATH, and nothing changes: the store keeps its bytes, the node stays.
A symlink to a regular file is followed: its target is replaced, the link kept.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import stat
from pathlib import Path

import pytest

from headroom.db.bundle_file import read_runs
from headroom.db.store import open_store
from tests.db_support import record_run, results

RUNS = 2


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("built") / "s.db"
    with open_store(str(path), mode="write") as store:
        for seed in range(RUNS):
            record_run(store, seed)
    return path


@pytest.fixture
def store(built, tmp_path) -> Path:
    """A fresh copy of a two-run WAL store, alone in its own directory (resolved: the path the CLI names)."""
    path = tmp_path / "s.db"
    shutil.copyfile(built, path)
    return path.resolve()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refused(run_cli, store: Path, path: Path | str, message: str) -> None:
    """Export to ``path`` exits 2 with exactly ``message``; the store keeps its bytes, no temporary file stays."""
    before, listing = digest(store), sorted(os.listdir(store.parent))
    result = run_cli("db", "export", str(path), "--db", str(store))
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"headroom: error: {message}\n")
    assert digest(store) == before
    assert sorted(os.listdir(store.parent)) == listing


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal"])
def test_the_store_and_the_files_sqlite_keeps_beside_it_are_refused(store, run_cli, suffix):
    what = "the store being exported" if not suffix else f"SQLite's {suffix[1:]} file of the store being exported"
    refused(run_cli, store, f"{store}{suffix}",
            f"cannot export to {store}{suffix}: it is {what} ({store}{suffix}) and the bundle would replace it; "
            f"give PATH a new file name, such as {store.parent / 'results.json.gz'}")


@pytest.mark.parametrize("link", ["symlink", "hard link"])
def test_a_link_to_the_store_is_refused(store, run_cli, link):
    path = store.parent / "bundle.json"
    (os.symlink if link == "symlink" else os.link)(store, path)
    refused(run_cli, store, path,
            f"cannot export to {path}: it is the store being exported ({store}) and the bundle would replace it; "
            f"give PATH a new file name, such as {store.parent / 'results.json.gz'}")
    assert path.is_symlink() == (link == "symlink") and os.path.samefile(path, store)


def test_a_directory_is_refused(store, run_cli):
    folder = store.parent / "bundles"
    folder.mkdir()
    refused(run_cli, store, folder,
            f"cannot write bundle {folder}: it is a directory, which the bundle would replace; PATH must be a "
            f"regular file or a new file name, such as {folder / 'results.json.gz'}")
    assert folder.is_dir() and not os.listdir(folder)


def test_a_symlink_to_a_directory_is_refused(store, run_cli):
    folder, link = store.parent / "bundles", store.parent / "latest.json"
    folder.mkdir()
    link.symlink_to(folder)
    refused(run_cli, store, link,
            f"cannot write bundle {link} (a symlink to {folder}): it is a directory, which the bundle would "
            f"replace; PATH must be a regular file or a new file name, such as {folder / 'results.json.gz'}")
    assert link.is_symlink() and not os.listdir(folder)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    return server


def _device(path: Path) -> None:
    """A character device like /dev/null (1, 3), made in the test's own directory: never a real /dev node."""
    if os.geteuid() != 0:
        pytest.skip("making a device node takes root; the FIFO and socket cases cover non-regular files")
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))


@pytest.mark.parametrize("kind, make", [("a FIFO (named pipe)", _fifo), ("a socket", _socket),
                                        ("a character device", _device)], ids=["fifo", "socket", "device"])
def test_a_node_that_is_not_a_regular_file_is_refused_and_kept(store, run_cli, kind, make):
    path = store.parent / "node"
    made = make(path)
    node = os.lstat(path)
    try:
        refused(run_cli, store, path,
                f"cannot write bundle {path}: it is {kind}, which the bundle would replace; PATH must be a "
                "regular file or a new file name, such as results.json.gz")
        after = os.lstat(path)
        assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (node.st_ino, stat.S_IFMT(node.st_mode))
    finally:
        if made is not None:
            made.close()


def test_a_symlink_to_a_file_is_written_through_and_kept(store, run_cli):
    target, link = store.parent / "kept" / "bundle.json", store.parent / "latest.json"
    target.parent.mkdir()
    target.write_text('{"format": "headroom-bundle", "version": 1, "runs": []}\n')  # an older bundle
    target.chmod(0o644)
    link.symlink_to(target)
    before = digest(store)
    result = run_cli("db", "export", str(link), "--db", str(store))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"exported {RUNS} runs ({len(results()) * RUNS} results) from sqlite:///{store} to {link}\n"
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert len(list(read_runs(target))) == RUNS
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # the file replaced keeps its permissions
    assert sorted(os.listdir(target.parent)) == ["bundle.json"] and digest(store) == before


@pytest.mark.parametrize("what", ["store", "json", "text", "gzip"])
def test_a_file_that_is_not_a_bundle_is_refused_and_kept(store, built, run_cli, what):
    """Another Headroom store, a JSON or text file that is no bundle, a gzip file of something else: exit 2 with
    one line naming PATH, its bytes kept (the rename would have replaced it). An empty file and an older bundle
    are replaced."""
    import gzip

    path = store.parent / f"other.{what}"
    if what == "store":
        shutil.copyfile(built, path)
    elif what == "gzip":
        path.write_bytes(gzip.compress(b'{"not": "a bundle"}'))
    else:
        path.write_text('{"model_type": "llama"}\n' if what == "json" else "notes\n")
    kept = digest(path)
    kind = "a SQLite database (a Headroom store, perhaps)" if what == "store" else "a file that is not a Headroom bundle"
    refused(run_cli, store, path, f"cannot write bundle {path}: it is {kind}, which the bundle would replace; give "
                                  "PATH a new file name, such as results.json.gz, or remove the file first")
    assert digest(path) == kept


@pytest.mark.parametrize("name", ["empty.json", "older.json", "older.json.gz"])
def test_an_empty_file_or_an_older_bundle_is_replaced(store, run_cli, name):
    path = store.parent / name
    path.write_bytes(b"")
    if name != "empty.json":
        assert run_cli("db", "export", str(path), "--db", str(store)).returncode == 0  # the older bundle
    result = run_cli("db", "export", str(path), "--db", str(store))
    assert result.returncode == 0, result.stderr
    assert len(list(read_runs(path))) == RUNS
