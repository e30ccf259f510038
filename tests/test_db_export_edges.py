"""``headroom db export`` at its edges: stopped by a signal mid-write, a PATH in a missing directory, and bundles
whose runs (or header values) are longer than the reader takes.

A signal leaves PATH as it was (absent, or its old bytes) and no temporary file beside it, with exit status
128 + the signal; a missing directory is refused, not created; a value over the limit is named as too long,
however long it is, while a bundle cut short is still named as truncated.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from headroom.db import bundle_file
from headroom.db.bundle_file import MAX_RUN_CHARS, read_runs
from headroom.db.errors import BundleError
from headroom.db.store import open_store
from tests.db_support import record_run

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 60
"""Bound on every wait for the exporting process: a regression fails here instead of hanging."""

STALLED_EXPORT = """
import signal, sys, time
import headroom.db.bundle
from headroom.cli.main import main

real = headroom.db.bundle.export_runs

def stalled(store, uuids=None):
    yield from real(store, uuids)
    print("ready", flush=True)
    time.sleep(600)  # the signal lands here, while the temporary file is open

headroom.db.bundle.export_runs = stalled
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever this test inherited
for sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_DFL)
sys.exit(main(sys.argv[1:]))
"""
"""``headroom`` whose export writes every run, then stalls before the end of the bundle until a signal comes."""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("built") / "s.db"
    with open_store(str(path), mode="write") as store:
        for seed in range(2):
            record_run(store, seed)
    return path


@pytest.fixture
def store(built, tmp_path) -> Path:
    """A fresh copy of a two-run store, in a directory of its own."""
    path = tmp_path / "store" / "s.db"
    path.parent.mkdir()
    shutil.copyfile(built, path)
    return path


@pytest.mark.parametrize("existing", [False, True], ids=["new PATH", "existing PATH"])
@pytest.mark.parametrize(("sig", "status", "message"), [
    (signal.SIGTERM, 143, "headroom: stopped by SIGTERM"),
    (signal.SIGHUP, 129, "headroom: stopped by SIGHUP"),
    (signal.SIGINT, 130, "headroom: interrupted"),
], ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_mid_export_leaves_path_as_it_was_and_no_temporary_file(store, tmp_path, sig, status, message,
                                                                          existing):
    out = tmp_path / "out"
    out.mkdir()
    path = out / "x.json"
    older = '{"format": "headroom-bundle", "version": 1, "runs": []}\n'
    if existing:  # an older bundle (anything else is refused before the export starts)
        path.write_text(older)
    env = {k: v for k, v in os.environ.items() if k != "HEADROOM_DB"} | {"XDG_DATA_HOME": str(tmp_path)}
    export = subprocess.Popen(
        [sys.executable, "-c", STALLED_EXPORT, "db", "export", str(path), "--db", f"sqlite:///{store}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert select.select([export.stdout], [], [], WAIT_S)[0], "the export did not get to its last run"
        assert export.stdout.readline() == "ready\n", export.communicate(timeout=WAIT_S)[1]
        assert [n for n in os.listdir(out) if n.startswith(".x.json.") and n.endswith(".tmp")] != []
        export.send_signal(sig)
        stdout, stderr = export.communicate(timeout=WAIT_S)
    finally:
        if export.poll() is None:
            export.kill()
            export.communicate()
    assert (export.returncode, stdout, stderr) == (status, "", message + "\n")
    assert os.listdir(out) == (["x.json"] if existing else [])
    if existing:
        assert path.read_text() == older


def test_a_path_in_a_missing_directory_is_refused_and_nothing_is_created(store, tmp_path, run_cli):
    path = tmp_path / "missing" / "dir" / "x.json"
    result = run_cli("db", "export", str(path), "--db", str(store))
    message = (f"cannot write bundle {path}: directory {path.parent} does not exist; "
               "create it first, or give PATH in a directory that exists")
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"headroom: error: {message}\n")
    assert sorted(os.listdir(tmp_path)) == ["store"] and os.listdir(store.parent) == ["s.db"]


def test_a_symlink_into_a_missing_directory_is_refused(store, tmp_path, run_cli):
    target, link = tmp_path / "missing" / "x.json", tmp_path / "latest.json"
    link.symlink_to(target)
    result = run_cli("db", "export", str(link), "--db", str(store))
    message = (f"cannot write bundle {link} (a symlink to {target}): directory {target.parent} "
               "does not exist; create it first, or give PATH in a directory that exists")
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"headroom: error: {message}\n")
    assert not target.parent.exists() and link.is_symlink()


def _bundle_text(runs: list, schema_revision: str = "0005") -> str:
    return json.dumps({"format": "headroom-bundle", "version": 1, "schema_revision": schema_revision, "runs": runs})


def _import(run_cli, tmp_path: Path, text: str):
    path = tmp_path / "bundle.json"
    path.write_text(text)
    return path, run_cli("db", "import", str(path), "--db", str(tmp_path / "new.db"))


@pytest.mark.parametrize("mib", [17, 40], ids=["17 MiB", "40 MiB"])
def test_a_run_with_a_huge_label_is_named_as_too_long(tmp_path, run_cli, mib):
    """40 MiB is past what the reader holds when it gives up (twice the limit), where the string it is still
    inside used to be taken for the file ending early."""
    text = _bundle_text([{"uuid": "a", "labels": {"k": "x" * (mib << 20)}}, {"uuid": "b"}])
    path, result = _import(run_cli, tmp_path, text)
    message = (f"{path}: run 1 is longer than {MAX_RUN_CHARS:,} characters of JSON, more than "
               "any bundle headroom writes holds; nothing imported")
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"headroom: error: {message}\n")
    assert not (tmp_path / "new.db").exists()


def test_a_huge_header_value_is_named_as_too_long(tmp_path, run_cli):
    path, result = _import(run_cli, tmp_path, _bundle_text([], schema_revision="x" * (3 << 20)))
    message = (f"{path}: 'schema_revision' is longer than 1,048,576 characters of JSON, more than "
               "any bundle headroom writes holds; nothing imported")
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"headroom: error: {message}\n")
    assert not (tmp_path / "new.db").exists()


@pytest.mark.parametrize("piece", [1 << 20, 64, 7], ids=["read whole", "read in pieces", "tiny pieces"])
@pytest.mark.parametrize("cut", [False, True], ids=["whole", "cut inside the run"])
def test_a_run_over_the_limit_is_too_long_however_far_it_goes_and_wherever_the_file_ends(tmp_path, monkeypatch,
                                                                                         piece, cut):
    monkeypatch.setattr(bundle_file, "MAX_RUN_CHARS", 1000)
    monkeypatch.setattr(bundle_file, "_CHUNK", piece)
    text = _bundle_text([{"uuid": "a"}, {"labels": {"k": "x" * 50_000}}, {"uuid": "c"}])
    path = tmp_path / "long.json"
    path.write_text(text[: text.index("x" * 50_000) + 20_000] if cut else text)
    with pytest.raises(BundleError, match="run 2 is longer than 1,000 characters of JSON"):
        list(read_runs(path))


@pytest.mark.parametrize("piece", [1 << 20, 7], ids=["read whole", "tiny pieces"])
def test_a_run_cut_short_under_the_limit_is_still_truncated(tmp_path, monkeypatch, piece):
    monkeypatch.setattr(bundle_file, "_CHUNK", piece)
    text = _bundle_text([{"uuid": "a", "labels": {"k": "x" * 5_000}}])
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index("x" * 5_000) + 2_000])
    with pytest.raises(BundleError, match=r"\(Unterminated string starting at\); a truncated bundle ends early"):
        list(read_runs(path))
