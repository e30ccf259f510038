"""Open a result store and record runs into it, one committed result at a time.

The agent's side::

    from headroom.db.models import Fingerprint, MatmulResult
    from headroom.db.store import open_store

    with open_store(mode="write") as store:             # --db / HEADROOM_DB / default file
        with store.recording(fingerprint, suite="standard", benchmark_version="1") as run_id:
            store.add_result(run_id, MatmulResult(dtype="bf16", m=8192, n=8192, k=8192, ...))

Crash safety: `start_run` commits a run as ``running``; each `add_result`
commits its result in its own transaction, so a writer killed at any point
keeps every result it had added, and its run stays ``running``, which
`headroom.db.queries.incomplete_runs` (and ``headroom db info``) reports as
incomplete. `recording` finishes the run as ``completed``, ``failed`` (an
exception) or ``aborted`` (Ctrl-C).

The dashboard's side: ``open_store(url)`` (read mode, never migrates) and
queries through `Store.session`.

``headroom db`` commands that write a whole store's worth (import, merge,
upgrade) first `Store.verify` it, and open a destination with
`open_destination`, which removes a store file it created when the command
then fails with no run written.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote
from uuid import uuid4

from sqlalchemy import Engine, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from headroom.db.bundle_file import NODE_KINDS
from headroom.db.engine import (
    SIDECARS,
    SQLITE_BEGIN,
    check_sqlite_file,
    display_url,
    driver_message,
    enable_wal,
    make_engine,
    parse_url,
    sqlite_failure,
    sqlite_file,
)
from headroom.db.errors import DamagedStoreError, StoreError
from headroom.db.location import resolve_url
from headroom.db.migrate import ensure_schema, head
from headroom.db.models import Fingerprint, Result, Run, utcnow
from headroom.db.validate import check_record, record_values

Mode = Literal["read", "write"]
FinalStatus = Literal["completed", "failed", "aborted"]
FINAL_STATUSES: tuple[str, ...] = ("completed", "failed", "aborted")


def open_store(url: str | None = None, mode: Mode = "read") -> Store:
    """Open the store at ``url`` (else ``HEADROOM_DB``, else the default file; see headroom.db.location).

    ``mode="write"`` creates a missing SQLite file and upgrades an older
    schema; ``mode="read"`` changes nothing and refuses a missing, empty or
    older store (`OutdatedStoreError` names the upgrade command). Both refuse,
    without touching it, a file that is not SQLite, a database that is not
    Headroom's and a store written by newer code (`StoreError`).
    """
    if mode not in ("read", "write"):
        raise ValueError(f"mode must be 'read' or 'write', got {mode!r}")
    write = mode == "write"
    parsed = parse_url(resolve_url(url))
    path = sqlite_file(parsed)
    if path is not None:
        _refuse_node(path)
        check_sqlite_file(path, write=write)
    engine = make_engine(parsed, write=write)
    try:
        upgraded_from = ensure_schema(engine, write=write)
        if write and engine.dialect.name == "sqlite":
            enable_wal(engine)
    except OperationalError as err:
        engine.dispose()
        raise StoreError(f"cannot open {display_url(parsed)}: {driver_message(err)}") from None
    except BaseException:
        engine.dispose()
        raise
    return Store(engine, mode=mode, upgraded_from=upgraded_from)


def _refuse_node(path: Path) -> None:
    """Refuse a FIFO, a device or a socket as a store file before anything opens it: opening a FIFO waits for
    a writer, forever for ``db info``, and SQLite keeps a store only in a regular file."""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):  # missing, or a name no file can have: check_sqlite_file says which
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = NODE_KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise StoreError(f"{path} is {kind}, not a store file; --db expects a regular file such as results.db, "
                         "or a new file name")


@contextmanager
def open_destination(url: str | None = None) -> Iterator[Store]:
    """``open_store(url, mode="write")`` for a command that copies runs in (``db import``, ``db merge``).

    When the command fails, a SQLite file this open created is removed again
    if it holds no run: a refused import or merge leaves no new empty store
    behind, which a reader would show as a store with nothing recorded. A file
    that existed before is never removed, nor one that another writer has
    recorded a run into meanwhile.
    """
    path = sqlite_file(parse_url(resolve_url(url)))
    created = path is not None and not os.path.lexists(path)
    try:
        with open_store(url, mode="write") as store:
            yield store
    except BaseException:
        if created:
            _remove_if_unused(path)
        raise


def _remove_if_unused(path: Path) -> None:
    """Delete the store file ``path`` and SQLite's files beside it, unless it holds a run or cannot be read."""
    try:
        connection = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True)
        try:
            tables = connection.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'runs'")
            if tables.fetchone() and connection.execute("SELECT 1 FROM runs LIMIT 1").fetchone():
                return
        finally:
            connection.close()
    except sqlite3.Error:  # unreadable (a failed first write on a full disk): ours only while still empty
        if not os.path.exists(path) or os.path.getsize(path):
            return
    for name in (f"{path}{suffix}" for suffix in SIDECARS):  # a stale -wal would be replayed into the next store
        Path(name).unlink(missing_ok=True)
    path.unlink(missing_ok=True)


def same_store(a: str | None, b: str | None) -> str | None:
    """What two store locations both name, when they name one store (``db merge`` refuses to merge a store
    into itself), else None. ``a`` and ``b`` as ``--db`` takes them (None: ``HEADROOM_DB`` or the default).

    SQLite: one file however spelt, a plain path or a ``sqlite:///`` URL, relative or absolute, through a
    symlink or a hard link (the file's real path, and for existing files their device and inode).
    PostgreSQL: one database on one server, by host (case aside; no host, a socket directory, ``localhost``,
    ``127.0.0.1`` and ``::1`` are this machine), port (default 5432) and database name (default: the user's name, as libpq
    has it); users, passwords and options aside. Two host names of one server (DNS aliases) are not
    recognised: that needs name resolution, and the merge then copies nothing in, as a merge of a store
    with itself adds no run."""
    first, second = parse_url(resolve_url(a)), parse_url(resolve_url(b))
    if first.get_backend_name() != second.get_backend_name():
        return None
    if first.get_backend_name() == "sqlite":
        paths = [sqlite_file(first), sqlite_file(second)]
        if paths[0] is None or paths[1] is None:  # in memory: a database of its own each time
            return None
        real = [os.path.realpath(os.path.expanduser(path)) for path in paths]
        if real[0] == real[1] or _same_file(*real):
            return f"the file {real[1]}"
        return None
    where = [_postgres_database(url) for url in (first, second)]
    if where[0] != where[1]:
        return None
    host, port, database = where[0]
    return f"database {database} on {host}:{port}"


_LOOPBACK = ("", "localhost", "127.0.0.1", "::1", "[::1]")


def _postgres_database(url: Any) -> tuple[str, int, str]:
    """(host, port, database) of a PostgreSQL URL, as libpq would fill in what the URL leaves out."""
    host = str(url.host or url.query.get("host") or "").lower()
    try:
        port = int(url.port or url.query.get("port") or 5432)
    except (TypeError, ValueError):
        port = 5432
    database = url.database or url.query.get("dbname") or url.username or ""
    return ("localhost" if host in _LOOPBACK or host.startswith("/") else host), port, str(database)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # either missing: the real paths already said
        return False


class Store:
    """An open result store: a writer records runs, a reader queries through `session`."""

    def __init__(self, engine: Engine, *, mode: Mode, upgraded_from: str | None = None) -> None:
        self.engine = engine
        self.mode: Mode = mode
        self.upgraded_from = upgraded_from
        """The revision this open upgraded the store from (``"empty"`` when it created it), else None."""
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._queries = sessionmaker(engine.execution_options(**{SQLITE_BEGIN: "BEGIN"}), expire_on_commit=False)

    @property
    def url(self) -> str:
        """The store's URL with any password hidden."""
        return display_url(self.engine.url)

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    @property
    def revision(self) -> str:
        """The schema revision: always the code's head once open."""
        return head()

    def verify(self) -> None:
        """Raise `DamagedStoreError` if SQLite finds the store's file damaged; nothing to do on PostgreSQL.

        ``PRAGMA quick_check`` reads every page and checks its structure (not
        whether each index matches its table, which ``integrity_check`` adds):
        0.1 s for a 57 MB store of 20,000 results, read from the page cache.
        A command meets damage only in the pages it reads, so ``db upgrade``
        would otherwise report a damaged store as up to date, and ``db merge``
        would find a damaged source halfway, after creating its destination.
        """
        if self.backend != "sqlite":
            return
        raw = self.engine.raw_connection()  # no BEGIN: a writer's would hold the write lock all along
        try:
            found = raw.cursor().execute("PRAGMA quick_check(1)").fetchone()[0]
        except sqlite3.DatabaseError as err:
            raise sqlite_failure(err, self.engine.url, write=self.mode == "write") or err
        finally:
            raw.close()
        if found != "ok":
            detail = " ".join(str(found).replace("*** in database main ***", "").split())
            raise DamagedStoreError(self.url, f"database disk image is malformed ({detail})")

    def session(self) -> Session:
        """A session for queries (``with store.session() as s: ...``). On a SQLite writer its transactions begin
        deferred: a query takes no write lock, so other writers to the file do not wait on it, nor does this
        store's own next write on a query that a stop signal cut short before its connection was released."""
        return self._queries()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session in one write transaction: committed on success, rolled back on any exception."""
        self._require_write()
        with self._sessions.begin() as session:
            yield session

    def close(self, *, analyze: bool = True) -> None:
        """Release the connections; a SQLite writer first refreshes the query planner's statistics.

        Without statistics SQLite's planner may scan a whole result table where
        an index would serve (benchmarks/bench_store.py shows it).
        ``analysis_limit`` bounds ANALYZE to a sample: a few ms at any size.
        PostgreSQL's autovacuum keeps its own statistics. ``analyze=False``
        skips them: a store left by a failed command (``with`` ends in an
        exception) keeps its bytes, as a refused import leaves them.
        """
        if analyze and self.mode == "write" and self.backend == "sqlite":
            raw = self.engine.raw_connection()
            try:
                cursor = raw.cursor()
                cursor.execute("PRAGMA analysis_limit = 400")
                cursor.execute("ANALYZE")
                cursor.close()
            except sqlite3.DatabaseError:
                pass  # statistics only speed queries up; never fail a close for them (a damaged or full store)
            finally:
                raw.close()
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(analyze=exc_type is None)

    # ---- the agent's writer API ---------------------------------------------

    def start_run(
        self,
        fingerprint: Fingerprint,
        *,
        suite: str,
        benchmark_version: str,
        labels: Mapping[str, str] | None = None,
        started_at: datetime | None = None,
    ) -> str:
        """Record a new ``running`` run on ``fingerprint``'s device; returns its id (a UUID string)."""
        run_id = str(uuid4())
        device = check_record(Fingerprint, record_values(fingerprint), "fingerprint")
        run = check_record(Run, {
            "uuid": run_id, "suite": suite, "benchmark_version": benchmark_version,
            "labels": dict(labels or {}), "started_at": started_at or utcnow(), "status": "running",
        }, f"run {run_id}")
        with self.transaction() as session:
            insert_run(session, run, fingerprint_id(session, device))
        return run_id

    def add_result(self, run_id: str, result: Result) -> None:
        """Commit one benchmark result of a ``running`` run, in its own transaction."""
        values = check_record(type(result), record_values(result), f"run {run_id}: {result.KIND} result")
        with self.transaction() as session:
            run = session.execute(select(Run.id, Run.status).where(Run.uuid == run_id)).one_or_none()
            if run is None:
                raise StoreError(f"no run {run_id} in {self.url}; start one with start_run")
            if run.status != "running":
                raise StoreError(f"run {run_id} is {run.status}; results can only be added to a running run")
            session.execute(type(result).__table__.insert(), values | {"run_id": run.id})

    def finish_run(self, run_id: str, status: FinalStatus = "completed") -> None:
        """Mark a ``running`` run completed, failed or aborted, and stamp its finish time."""
        if status not in FINAL_STATUSES:
            raise StoreError(f"a run finishes as one of {', '.join(FINAL_STATUSES)}, not {status!r}")
        with self.transaction() as session:
            done = session.execute(
                update(Run).where(Run.uuid == run_id, Run.status == "running").values(status=status, finished_at=utcnow())
            )
            if done.rowcount != 1:
                found = session.execute(select(Run.status).where(Run.uuid == run_id)).scalar_one_or_none()
                raise StoreError(f"run {run_id} is {found}, not running" if found else f"no run {run_id} in {self.url}")

    @contextmanager
    def recording(
        self, fingerprint: Fingerprint, *, suite: str, benchmark_version: str, labels: Mapping[str, str] | None = None
    ) -> Iterator[str]:
        """Start a run, yield its id, and finish it: completed, failed on an exception, aborted on Ctrl-C."""
        run_id = self.start_run(fingerprint, suite=suite, benchmark_version=benchmark_version, labels=labels)
        try:
            yield run_id
        except KeyboardInterrupt:
            self.finish_run(run_id, "aborted")
            raise
        except BaseException:
            self.finish_run(run_id, "failed")
            raise
        self.finish_run(run_id, "completed")

    def _require_write(self) -> None:
        if self.mode != "write":
            raise StoreError(f"{self.url} is open for reading; open it with mode='write' to record")


# ---- shared by the writer API and bundle import ------------------------------


def dialect_insert(session: Session, model: type) -> Any:
    """INSERT for the session's backend, with ``on_conflict_do_nothing`` available on both."""
    backend = session.get_bind().dialect.name
    return {"sqlite": sqlite.insert, "postgresql": postgresql.insert}[backend](model)


def fingerprint_digest(values: Mapping[str, Any]) -> str:
    """SHA-256 of a fingerprint's checked fields: equal boxes share a row, in every store."""
    return hashlib.sha256(json.dumps(values, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def fingerprint_id(session: Session, values: Mapping[str, Any]) -> int:
    """The id of the fingerprint with these fields, inserting it if no writer has yet.

    ``ON CONFLICT DO NOTHING`` then ``SELECT`` is race-free: two writers
    inserting the same box at once both end up with the one row.
    """
    digest = fingerprint_digest(values)
    stmt = dialect_insert(session, Fingerprint).values(digest=digest, **values)
    session.execute(stmt.on_conflict_do_nothing(index_elements=["digest"]))
    return session.execute(select(Fingerprint.id).where(Fingerprint.digest == digest)).scalar_one()


def insert_run(session: Session, values: Mapping[str, Any], fingerprint: int) -> int | None:
    """Insert a run unless its uuid is already stored; its row id, or None when it was already there."""
    stmt = dialect_insert(session, Run).values(fingerprint_id=fingerprint, **values)
    return session.execute(stmt.on_conflict_do_nothing(index_elements=["uuid"]).returning(Run.id)).scalar_one_or_none()
