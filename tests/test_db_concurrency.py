"""Many writers at once, and a writer killed mid-run, on SQLite and on the real PostgreSQL.

The writers are separate processes (tests/db_writer.py) started together on a
store that does not exist yet, so they also race to create the schema and to
insert the fingerprint they share.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import func, select

from headroom.db import queries
from headroom.db.models import RESULT_MODELS, MatmulResult, Run
from headroom.db.store import open_store
from tests.db_support import (  # noqa: F401  (fixtures)
    WRITER,
    postgres_url,
    record_run,
    row_counts,
    sqlite_integrity,
    sqlite_url,
    store_url,
)

WORKERS, RUNS = 8, 50


def _writer(url: str, worker: int, runs: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WRITER), url, str(worker), runs],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_eight_processes_write_fifty_runs_each(store_url):
    writers = [_writer(store_url, worker, str(RUNS)) for worker in range(WORKERS)]
    for writer in writers:
        _, stderr = writer.communicate(timeout=300)
        assert writer.returncode == 0, stderr

    with open_store(store_url) as store:
        counts = row_counts(store)
        assert counts["runs"] == WORKERS * RUNS
        assert counts["fingerprints"] == WORKERS + 1  # one per worker, one shared by all
        for model in RESULT_MODELS.values():
            assert counts[model.__tablename__] == WORKERS * RUNS
        with store.session() as session:
            assert queries.runs_by_status(session) == {"completed": WORKERS * RUNS}
            labels = {(r["worker"], r["run"]) for r in session.scalars(select(Run.labels))}
            assert labels == {(str(w), str(i)) for w in range(WORKERS) for i in range(RUNS)}
            per_run = select(MatmulResult.run_id, func.count()).group_by(MatmulResult.run_id)
            assert {n for _, n in session.execute(per_run)} == {1}
    if store_url.startswith("sqlite"):
        assert sqlite_integrity(Path(store_url.removeprefix("sqlite:///"))) == ["ok"]


def test_a_writer_killed_mid_run_leaves_a_consistent_store(store_url, run_cli):
    with open_store(store_url, mode="write") as store:
        finished = record_run(store)
    writer = _writer(store_url, 0, "forever")
    run_id = writer.stdout.readline().strip()
    committed = -1
    while committed < 30:  # it keeps writing while we read: the kill lands wherever it lands
        committed = int(writer.stdout.readline())
    os.kill(writer.pid, signal.SIGKILL)
    writer.communicate(timeout=30)  # reaps it and closes its pipes
    assert writer.returncode == -signal.SIGKILL

    with open_store(store_url, mode="write") as store:  # a new writer opens it without fuss
        with store.session() as session:
            killed = session.scalars(select(Run).where(Run.uuid == run_id)).one()
            kept = session.scalar(select(func.count()).select_from(MatmulResult).where(MatmulResult.run_id == killed.id))
            assert killed.status == "running" and killed.finished_at is None
            assert kept >= committed + 1  # every acknowledged result survived
            assert queries.runs_by_status(session) == {"completed": 1, "running": 1}
            assert [r.run_id for r in queries.incomplete_runs(session)] == [run_id]
        record_run(store, seed=1)
        assert row_counts(store)["runs"] == 3
    if store_url.startswith("sqlite"):
        assert sqlite_integrity(Path(store_url.removeprefix("sqlite:///"))) == ["ok"]

    info = run_cli("db", "info", "--db", store_url)
    assert info.returncode == 0, info.stderr
    assert "1 incomplete runs" in info.stdout and f"{run_id}  NVIDIA H100 80GB HBM3 on worker-0" in info.stdout
    assert finished not in info.stdout
    raw = run_cli("db", "info", "--db", store_url, "--json")
    assert raw.returncode == 0, raw.stderr
    as_json = json.loads(raw.stdout)
    assert as_json["runs"] == {"completed": 2, "running": 1}
    assert [(r["run_id"], r["device_name"], r["hostname"]) for r in as_json["incomplete_runs"]] == [
        (run_id, "NVIDIA H100 80GB HBM3", "worker-0")]
    assert sum(d["runs"] for d in as_json["devices"]) == 3 and as_json["schema_revision"] in info.stdout
