"""The result store's writer API, engine settings and location, on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, text

from headroom.db import queries
from headroom.db.engine import _switch_to_wal, enable_wal, make_engine, parse_url
from headroom.db.errors import StoreError
from headroom.db.location import default_url, resolve_url
from headroom.db.models import Fingerprint, MatmulResult, Run, TrainStepResult
from headroom.db.store import open_store
from tests.db_support import (  # noqa: F401  (fixtures)
    fingerprint,
    postgres_url,
    record_run,
    results,
    row_counts,
    sqlite_url,
    store_url,
)

# ---- location ------------------------------------------------------------------------


def test_location_flag_beats_env_var_beats_default(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HEADROOM_DB", raising=False)
    assert default_url() == f"sqlite:///{tmp_path}/xdg/headroom/results.db"
    assert resolve_url(None) == default_url()
    monkeypatch.setenv("HEADROOM_DB", str(tmp_path / "env.db"))
    assert resolve_url(None) == f"sqlite:///{tmp_path}/env.db"
    assert resolve_url("postgres://u@h/fleet") == "postgresql+psycopg://u@h/fleet"
    assert resolve_url("postgresql://u@h/fleet") == "postgresql+psycopg://u@h/fleet"


def test_a_home_of_no_user_is_refused_by_name(monkeypatch):
    from headroom.core.errors import ConfigError

    monkeypatch.setenv("HOME", "/home/someone")
    assert resolve_url("~/x.db") == "sqlite:////home/someone/x.db"
    with pytest.raises(ConfigError) as caught:
        resolve_url("~0/x.db")
    assert str(caught.value) == ("store location '~0/x.db': this system has no user '0' whose home '~' could "
                                 "mean; give the path in full")


def test_writer_creates_the_default_store_under_xdg_data_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.delenv("HEADROOM_DB", raising=False)
    with open_store(mode="write") as store:
        assert store.upgraded_from == "empty"
    assert (tmp_path / "headroom" / "results.db").is_file()


def test_unsupported_url_names_what_is_supported():
    with pytest.raises(StoreError, match=r"unsupported store URL 'mysql://u@h/x'; use sqlite:///PATH"):
        open_store("mysql://u@h/x")


# ---- engine settings -----------------------------------------------------------------


def test_sqlite_writer_runs_wal_with_busy_timeout_and_foreign_keys(sqlite_url):
    with open_store(sqlite_url, mode="write") as store, store.engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA busy_timeout")).scalar() == 30_000
        assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1



def test_a_writers_query_takes_no_write_lock(sqlite_url, monkeypatch):
    """A query through a writer's session begins deferred, so another writer (another agent on the file, or this
    store's own next write after a stop signal cut a query short) does not wait on it; a write transaction
    still takes the lock up front, and another writer waits out the busy timeout for it."""
    monkeypatch.setattr("headroom.db.engine.SQLITE_BUSY_TIMEOUT_MS", 200)
    with open_store(sqlite_url, mode="write") as first, open_store(sqlite_url, mode="write") as second:
        with first.session() as session:
            assert session.execute(select(Run.id)).all() == []  # a read transaction open on the file
            run = second.start_run(fingerprint(), suite="standard", benchmark_version="1")
        with first.transaction() as session:
            session.execute(select(Run.id)).all()  # BEGIN IMMEDIATE: the write lock is held
            with pytest.raises(OSError, match=r"another connection held the store's write lock for over 0.2 s "
                                              r"\(database is locked\); rerun once its write is done"):
                second.finish_run(run)
        second.finish_run(run)
        with first.session() as session:
            assert queries.runs_by_status(session) == {"completed": 1}


def _locked_rollback_file(path):
    """A SQLite file in rollback-journal mode and a connection holding its write lock."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    return holder


def test_the_switch_to_wal_waits_for_a_writer_sqlite_would_not_wait_for(tmp_path):
    path = tmp_path / "racing.db"
    holder = _locked_rollback_file(path)
    engine = make_engine(parse_url(f"sqlite:///{path}"), write=True)
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        _switch_to_wal(engine)  # the premise: one try fails at once, busy timeout or not
    releasing = threading.Timer(0.3, holder.execute, ("COMMIT",))
    releasing.start()
    enable_wal(engine)
    releasing.join()
    holder.close()
    with closing(sqlite3.connect(path)) as reader:
        assert reader.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert reader.execute("SELECT x FROM t").fetchall() == [(1,)]  # the writer's row kept
    engine.dispose()


def test_a_file_locked_past_the_busy_timeout_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr("headroom.db.engine.SQLITE_BUSY_TIMEOUT_MS", 200)
    path = tmp_path / "held.db"
    holder = _locked_rollback_file(path)
    engine = make_engine(parse_url(f"sqlite:///{path}"), write=True)
    with pytest.raises(StoreError) as caught:
        enable_wal(engine)
    assert str(caught.value) == (f"sqlite:///{path}: could not switch to WAL journaling within 0.2 s: "
                                 "other connections kept the file locked (database is locked)")
    holder.execute("COMMIT")
    holder.close()
    with closing(sqlite3.connect(path)) as reader:
        assert reader.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    engine.dispose()

def test_reader_never_creates_a_store(tmp_path):
    with pytest.raises(StoreError, match="no result store at"):
        open_store(str(tmp_path / "missing.db"))
    assert list(tmp_path.iterdir()) == []


def test_reader_cannot_write(sqlite_url):
    open_store(sqlite_url, mode="write").close()
    with open_store(sqlite_url) as store, pytest.raises(StoreError, match="open for reading"):
        store.start_run(fingerprint(), suite="standard", benchmark_version="1")


# ---- writer API ----------------------------------------------------------------------


def test_a_recorded_run_reads_back_field_for_field(store_url):
    with open_store(store_url, mode="write") as store:
        run_id = record_run(store, seed=3)
    with open_store(store_url) as store, store.session() as session:
        run = session.scalars(select(Run)).one()
        assert (run.uuid, run.status, run.labels) == (run_id, "completed", {"rack": "b7"})
        assert run.started_at.tzinfo == timezone.utc and run.finished_at >= run.started_at
        expected = {type(r): r for r in results(seed=3)}
        for model, want in expected.items():
            got = session.scalars(select(model)).one()
            for column in model.__table__.columns:
                if column.key not in ("id", "run_id", "recorded_at"):
                    assert getattr(got, column.key) == getattr(want, column.key), column.key
            assert run.started_at <= got.recorded_at <= run.finished_at
        device = session.scalars(select(Fingerprint)).one()
        assert device.device_memory_bytes == 85_520_809_984 and device.details["power_limit_w"] == 700.0


def test_the_same_box_shares_one_fingerprint(store_url):
    with open_store(store_url, mode="write") as store:
        record_run(store)
        record_run(store, seed=1)
        record_run(store, torch_version="2.14.0")
        assert row_counts(store)["fingerprints"] == 2
        assert row_counts(store)["runs"] == 3


def test_timestamps_are_stored_as_utc_instants(store_url):
    tokyo = timezone(timedelta(hours=9))
    started = datetime(2025, 3, 1, 9, 30, 0, 123456, tzinfo=tokyo)
    with open_store(store_url, mode="write") as store:
        run_id = store.start_run(fingerprint(), suite="s", benchmark_version="1", started_at=started)
        with store.session() as session:
            stored = session.scalars(select(Run.started_at).where(Run.uuid == run_id)).one()
    assert stored == started and stored.tzinfo == timezone.utc and stored.hour == 0


def test_a_bad_result_is_refused_by_name_and_nothing_is_written(sqlite_url):
    with open_store(sqlite_url, mode="write") as store:
        run_id = store.start_run(fingerprint(), suite="standard", benchmark_version="1")
        bad = MatmulResult(dtype="bf16", m=1, n=1, k=1, median_s=float("nan"), tflop_per_s=1.0)
        with pytest.raises(StoreError, match=rf"run {run_id}: matmul result: field 'median_s' must be a finite number"):
            store.add_result(run_id, bad)
        with pytest.raises(StoreError, match="field 'dtype' must be one of fp32, tf32, fp16, bf16, fp8, got 'bfloat16'"):
            store.add_result(run_id, MatmulResult(dtype="bfloat16", m=1, n=1, k=1, median_s=1.0, tflop_per_s=1.0))
        with pytest.raises(StoreError, match="an ok matmul result needs median_s, tflop_per_s"):
            store.add_result(run_id, MatmulResult(dtype="bf16", m=1, n=1, k=1))
        with pytest.raises(StoreError, match="a result with status error needs a message saying why"):
            store.add_result(run_id, TrainStepResult(model_name="m", model_spec={}, seq_len=1, micro_batch=1,
                                                     status="error"))
        assert row_counts(store)["matmul_results"] == 0


def test_results_go_only_to_a_running_run(sqlite_url):
    with open_store(sqlite_url, mode="write") as store:
        run_id = store.start_run(fingerprint(), suite="standard", benchmark_version="1")
        store.finish_run(run_id, "completed")
        with pytest.raises(StoreError, match=f"run {run_id} is completed; results can only be added to a running run"):
            store.add_result(run_id, results()[0])
        with pytest.raises(StoreError, match="is completed, not running"):
            store.finish_run(run_id, "failed")
        with pytest.raises(StoreError, match="no run 00000000-0000-4000-8000-000000000000"):
            store.add_result("00000000-0000-4000-8000-000000000000", results()[0])
        with pytest.raises(StoreError, match="a run finishes as one of completed, failed, aborted, not 'done'"):
            store.finish_run(run_id, "done")


def test_recording_marks_failed_and_aborted_runs_and_keeps_their_results(sqlite_url):
    with open_store(sqlite_url, mode="write") as store:
        with pytest.raises(RuntimeError):
            with store.recording(fingerprint(), suite="standard", benchmark_version="1") as failed:
                store.add_result(failed, results()[0])
                raise RuntimeError("benchmark crashed")
        with pytest.raises(KeyboardInterrupt):
            with store.recording(fingerprint(), suite="standard", benchmark_version="1") as aborted:
                raise KeyboardInterrupt
        with store.session() as session:
            statuses = dict(session.execute(select(Run.uuid, Run.status)).all())
            assert statuses == {failed: "failed", aborted: "aborted"}
            assert queries.results_by_kind(session)["matmul"] == 1


def test_queries_count_by_device_and_find_the_best_rate(store_url):
    old = datetime.now(timezone.utc) - timedelta(days=200)
    with open_store(store_url, mode="write") as store:
        record_run(store, seed=0)
        record_run(store, seed=5, hostname="gpu-08")
        stale = store.start_run(fingerprint(hostname="gpu-09"), suite="s", benchmark_version="1", started_at=old)
        store.add_result(stale, results()[0])
        with store.session() as session:
            devices = {d.hostname: (d.runs, d.results) for d in queries.counts_by_device(session)}
            assert devices == {"gpu-07": (1, 6), "gpu-08": (1, 6), "gpu-09": (1, 1)}
            best = queries.best_tflop_per_s(session, "bf16", since=old + timedelta(days=110))
            assert [b.hostname for b in best] == ["gpu-07", "gpu-08"]  # seed 0 is the faster one
            assert best[0].tflop_per_s == pytest.approx(results(0)[0].tflop_per_s)
            assert [r.run_id for r in queries.incomplete_runs(session)] == [stale]
