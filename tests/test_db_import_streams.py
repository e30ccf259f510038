"""``headroom db import`` and ``dashboard --bundle`` from what can be read only once: a pipe, /dev/stdin, a FIFO.

Each command runs in a process fed through a real pipe, with a timeout, so a
reader that opens its path a second time fails instead of waiting forever.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest

from headroom.db.bundle import export_file
from headroom.db.store import open_store
from tests.db_support import fleet, record_run, row_counts  # noqa: F401  (fleet: a fixture)

TIMEOUT_S = 120
"""Far longer than any of these commands takes; only a reader that blocks reaches it."""


@pytest.fixture
def bundle(tmp_path) -> bytes:
    """A plain bundle of two runs, exported from a store of its own."""
    url = f"sqlite:///{tmp_path / 'box.db'}"
    with open_store(url, mode="write") as store:
        record_run(store, seed=1)
        record_run(store, seed=2, hostname="gpu-08")
        export_file(store, tmp_path / "box.json")
    return (tmp_path / "box.json").read_bytes()


def _headroom(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "HEADROOM_DB"}
    return subprocess.run([sys.executable, "-m", "headroom.cli.main", *args], input=stdin, capture_output=True, env=env,
                          timeout=TIMEOUT_S)


def _runs(url: str) -> int:
    with open_store(url) as store:
        return row_counts(store)["runs"]


def _fifo_writer(path: Path, data: bytes) -> threading.Thread:
    """A FIFO at ``path`` and a thread that writes ``data`` into it once a reader opens it, then closes it."""
    os.mkfifo(path)

    def write() -> None:
        with path.open("wb") as f:
            f.write(data)

    writer = threading.Thread(target=write, daemon=True)  # daemon: a reader that never opens it leaves it blocked
    writer.start()
    return writer


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_a_bundle_piped_to_dev_stdin_is_imported(bundle, fleet, packed):
    result = _headroom("db", "import", "/dev/stdin", "--db", fleet, stdin=gzip.compress(bundle) if packed else bundle)
    assert result.returncode == 0, result.stderr
    assert b"/dev/stdin -> " in result.stdout and b"added 2 runs" in result.stdout
    assert _runs(fleet) == 3


def test_a_gzip_bundle_from_a_process_substitution_is_imported(bundle, fleet):
    """``headroom db import <(cat bundle.json.gz)``: the shell gives a /dev/fd path to a pipe."""
    read, write = os.pipe()
    try:
        child = subprocess.Popen([sys.executable, "-m", "headroom.cli.main", "db", "import", f"/dev/fd/{read}", "--db", fleet],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(read,))
    finally:
        os.close(read)
    with os.fdopen(write, "wb") as pipe:
        pipe.write(gzip.compress(bundle))
    out, err = child.communicate(timeout=TIMEOUT_S)
    assert child.returncode == 0, err
    assert b"added 2 runs" in out
    assert _runs(fleet) == 3


def test_a_bundle_written_into_a_fifo_is_imported(bundle, fleet, tmp_path):
    writer = _fifo_writer(tmp_path / "bundle.fifo", gzip.compress(bundle))
    result = _headroom("db", "import", str(tmp_path / "bundle.fifo"), "--db", fleet)
    writer.join(TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert not writer.is_alive()
    assert _runs(fleet) == 3


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_a_truncated_bundle_through_a_pipe_is_one_line_and_changes_nothing(bundle, fleet, packed):
    data = gzip.compress(bundle) if packed else bundle
    with open_store(fleet) as store:
        before = row_counts(store)
    result = _headroom("db", "import", "/dev/stdin", "--db", fleet, stdin=data[: len(data) * 2 // 3])
    assert result.returncode == 2, result.stdout
    expected = "truncated or damaged gzip" if packed else "not valid JSON at line"
    assert result.stderr.decode().startswith("headroom: error: /dev/stdin: ") and expected in result.stderr.decode()
    assert result.stderr.count(b"\n") == 1, result.stderr
    with open_store(fleet) as store:
        assert row_counts(store) == before


def test_a_bundle_whose_last_run_is_bad_adds_none_of_its_runs_through_a_pipe(bundle, fleet):
    """The stream is checked whole before the write: the first run, good, is not written either."""
    document = json.loads(bundle)
    document["runs"][-1]["status"] = "done"
    result = _headroom("db", "import", "/dev/stdin", "--db", fleet, stdin=json.dumps(document).encode())
    assert result.returncode == 2 and b"run 2" in result.stderr and result.stderr.count(b"\n") == 1, result.stderr
    assert _runs(fleet) == 1


def test_a_decompression_bomb_through_a_pipe_is_refused_by_what_has_been_read(fleet):
    """A stream has no size to measure the expansion against: the bytes read so far stand for it."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    bomb = deflate.compress(b'{"format": "headroom-bundle", "version": 1, "runs": []')
    bomb += b"".join(deflate.compress(b" " * 2**20) for _ in range(200)) + deflate.compress(b"}") + deflate.flush()
    result = _headroom("db", "import", "/dev/stdin", "--db", fleet, stdin=bomb)
    assert result.returncode == 2, result.stdout
    assert b"expands more than 100x the " in result.stderr and b"bytes of it read so far" in result.stderr
    assert _runs(fleet) == 1


def test_dashboard_load_bundle_reads_a_fifo(bundle, tmp_path):
    """``headroom dashboard --bundle FIFO``: `load_bundle` imports it in one reading into its scratch store."""
    writer = _fifo_writer(tmp_path / "bundle.fifo", bundle)
    (tmp_path / "scratch").mkdir()
    code = ("import sys\nfrom pathlib import Path\nfrom headroom.cli.dashboard import load_bundle\n"
            "print(load_bundle(Path(sys.argv[1]), Path(sys.argv[2])))")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "bundle.fifo"), str(tmp_path / "scratch")],
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    writer.join(TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    url = result.stdout.splitlines()[-1]
    assert url == f"sqlite:///{tmp_path / 'scratch' / 'bundle.db'}"
    assert _runs(url) == 2


@pytest.mark.parametrize("action", ["info", "import"])
def test_a_fifo_given_as_the_store_is_refused_not_waited_on(fleet, tmp_path, action, bundle):
    """SQLite keeps a store only in a regular file; opening a FIFO nobody writes would wait forever."""
    os.mkfifo(tmp_path / "store.fifo")
    (tmp_path / "bundle.json").write_bytes(bundle)
    args = ["db", "info"] if action == "info" else ["db", "import", str(tmp_path / "bundle.json")]
    result = _headroom(*args, "--db", str(tmp_path / "store.fifo"))
    assert result.returncode == 2, result.stdout
    assert result.stderr.decode() == (f"headroom: error: {tmp_path / 'store.fifo'} is a FIFO (named pipe), not a "
                                      "store file; --db expects a regular file such as results.db, or a new file "
                                      "name\n")
