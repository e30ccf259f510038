"""A new bundle gets the permissions any new file gets (0666 less the umask), a replaced one keeps its own.

The bundle is written to a temporary file renamed into place; mkstemp makes that file 0600, which a new
bundle used to keep whatever the umask (db/bundle_file.py, `_keep_mode`).
"""

from __future__ import annotations

import os
import stat

import pytest

from headroom.db import bundle_file
from headroom.db.bundle_file import read_runs, write_bundle
from headroom.db.migrate import head
from headroom.db.store import open_store
from tests.db_support import record_run


@pytest.fixture
def umask():
    """Set the process's umask for one test; the old one comes back after it."""
    old = os.umask(0o022)
    os.umask(old)

    def set_to(mask: int) -> None:
        os.umask(mask)

    yield set_to
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600), (0o027, 0o640)],
                         ids=["umask-022", "umask-002", "umask-077", "umask-027"])
@pytest.mark.parametrize("name", ["bundle.json", "bundle.json.gz"])
def test_a_new_bundle_follows_the_umask(tmp_path, umask, mask, expected, name):
    umask(mask)
    path = tmp_path / name
    write_bundle([], path, head())
    assert mode(path) == expected
    assert list(read_runs(path)) == []


def test_the_umask_is_read_without_proc_too(tmp_path, umask, monkeypatch):
    """Where /proc cannot say (not Linux), the umask is set and put back: the same mode, the same umask after."""
    def no_proc(*args, **kwargs):
        raise FileNotFoundError("/proc/self/status")

    monkeypatch.setattr(bundle_file, "open", no_proc, raising=False)
    umask(0o027)
    assert bundle_file._umask() == 0o027
    write_bundle([], tmp_path / "bundle.json", head())
    assert mode(tmp_path / "bundle.json") == 0o640
    assert os.umask(0o027) == 0o027  # left as it was


@pytest.mark.parametrize("kept", [0o600, 0o640, 0o604], ids=oct)
def test_a_replaced_bundle_keeps_its_own_mode(tmp_path, umask, kept):
    umask(0o022)
    path = tmp_path / "bundle.json"
    write_bundle([], path, head())  # an older bundle
    path.chmod(kept)
    write_bundle([], path, head())
    assert mode(path) == kept and list(read_runs(path)) == []


def test_db_export_writes_a_new_bundle_0644_under_umask_022(tmp_path, umask, run_cli):
    store_path = tmp_path / "s.db"
    with open_store(str(store_path), mode="write") as store:
        record_run(store, 0)
    umask(0o022)
    bundle = tmp_path / "out" / "results.json.gz"
    bundle.parent.mkdir()  # an export creates no directory
    result = run_cli("db", "export", str(bundle), "--db", str(store_path))
    assert result.returncode == 0, result.stderr
    assert mode(bundle) == 0o644
    assert len(list(read_runs(bundle))) == 1
    assert sorted(os.listdir(bundle.parent)) == ["results.json.gz"]  # no temporary file left
