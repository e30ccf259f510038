"""SQLAlchemy engines for the two backends: a SQLite file (default) and PostgreSQL (fleets).

SQLite is set up for many writer processes on one file:

- WAL journal (``PRAGMA journal_mode=WAL``, persistent in the file): readers
  never block the writer and the writer never blocks readers. Set by writers
  only, and only on a file already known to be a Headroom store or empty,
  because it rewrites the file header. The switch is retried while other
  writers hold the file (SQLite does not wait for it; see `enable_wal`).
- ``busy_timeout``: a writer waits up to 30 s for the write lock instead of
  failing with "database is locked".
- ``foreign_keys=ON``: SQLite ignores foreign keys unless asked, per connection.
- Python's sqlite3 module starts transactions lazily and only before DML,
  which breaks transactional DDL (migrations) and lets a transaction that read
  first fail when it later writes. SQLAlchemy emits the ``BEGIN`` itself
  instead (the recipe in SQLAlchemy's SQLite dialect docs), and a writer's is
  ``BEGIN IMMEDIATE``: it takes the write lock up front, where the busy
  timeout applies, so concurrent writers queue instead of erroring. A
  writer's queries (`SQLITE_BEGIN`) begin deferred and take no write lock.

PostgreSQL goes through psycopg 3 (``pip install 'headroom[postgres]'``).

A reader's engine (``write=False``: the dashboard, ``db info``, ``db export``)
cannot write even by mistake: SQLite connections run with
``PRAGMA query_only = ON`` (any INSERT, UPDATE, DDL fails with "attempt to
write a readonly database"; reading a WAL file still works, which a
``mode=ro`` URI would refuse when the ``-shm`` file is missing), and
PostgreSQL sessions start with ``default_transaction_read_only = on``.

A reader of a store on a read-only file system (a read-only mount, a backup
snapshot) opens it with ``immutable=1``: SQLite reads a WAL store only if it
can create the ``-shm`` file beside it or the store is declared immutable,
and on a read-only file system nothing can change the file, so declaring it is
safe. Only then: a directory that is merely not writable by this user may
still be written by its owner, and an immutable reader takes no locks and
would read pages a checkpoint is rewriting. Nor when a ``-wal`` or
``-journal`` file lies beside the store: their content is part of it, which an
immutable reader ignores.

`sqlite_failure` turns what SQLite reports into what the user can act on:
a damaged file (`DamagedStoreError`, exit status 2), a directory SQLite
cannot create its files in (`StoreError`, 2), a full disk or an I/O error
(`OSError`, 1). Every SQLite engine raises those in place of SQLAlchemy's
error, whichever query meets them (a ``handle_error`` hook).
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
import time
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from headroom.db.errors import DamagedStoreError, StoreError

SQLITE_BUSY_TIMEOUT_MS = 30_000
SQLITE_MAGIC = b"SQLite format 3\x00"
SIDECARS = ("-wal", "-shm", "-journal")
"""The files SQLite keeps beside a store file (``results.db-wal``...), part of the store while they exist."""
SUPPORTED = "sqlite:///PATH (or a plain file path) or postgresql+psycopg://USER@HOST/DATABASE"


_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")
"""The password of a URL SQLAlchemy cannot parse, to be hidden from the error that quotes it."""


def parse_url(url: str) -> URL:
    """Parse and check a store URL; only SQLite (pysqlite) and PostgreSQL (psycopg 3) are supported."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number ('postgresql://u@[::1')
        shown = _PASSWORD.sub(r"\1***@", url)
        raise StoreError(f"cannot read {shown!r} as a store URL; use {SUPPORTED}") from None
    if parsed.drivername not in ("sqlite", "sqlite+pysqlite", "postgresql+psycopg"):
        raise StoreError(f"unsupported store URL {display_url(parsed)!r}; use {SUPPORTED}")
    return parsed


def display_url(url: URL | str) -> str:
    """The URL as it may be printed: the password replaced by ***."""
    parsed = make_url(url) if isinstance(url, str) else url
    return parsed.render_as_string(hide_password=True)


def driver_message(err: DBAPIError) -> str:
    """The database's own one-line reason for an error, without SQLAlchemy's SQL dump."""
    text = str(err.orig if err.orig is not None else err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def sqlite_file(url: URL) -> Path | None:
    """The file behind a SQLite URL, or None for an in-memory database or another backend."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def check_sqlite_file(path: Path, *, write: bool) -> None:
    """Refuse, before SQLite touches it, a path that is not a SQLite database.

    A missing file is created by a writer (with its directory) and refused to a
    reader, which must never create a store. A file that is not empty and does
    not start with SQLite's 16-byte magic string is refused to both, and so is a
    path the file system cannot use (too long, a parent that is a file, no
    permission).
    """
    try:
        _check_sqlite_file(path, write=write)
    except OSError as err:
        raise StoreError(f"cannot use {str(path)[:200]!r} as a store file: {err.strerror or err}") from None


def _check_sqlite_file(path: Path, *, write: bool) -> None:
    if path.is_dir():
        raise StoreError(f"{path} is a directory; --db expects a store file such as {path / 'results.db'}")
    if not path.exists():
        if not write:
            raise StoreError(
                f"no result store at {path}: nothing has been recorded there yet "
                "(the agent or `headroom db import` creates it; --db or HEADROOM_DB point elsewhere)"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    with path.open("rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    if head and head != SQLITE_MAGIC:
        raise StoreError(
            f"{path} is not a SQLite database (it starts with {head!r}, not {SQLITE_MAGIC!r}); "
            f"--db expects a Headroom store: {SUPPORTED}"
        )


SQLITE_BEGIN = "headroom_sqlite_begin"
"""An execution option naming the ``BEGIN`` a SQLite connection's transactions start with, where it is not the
engine's: a writer's queries (headroom.db.store.Store.session) begin deferred, taking no write lock."""


def make_engine(url: URL, *, write: bool) -> Engine:
    """An engine for a checked URL (see `parse_url`); ``write`` selects SQLite's ``BEGIN IMMEDIATE``."""
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, write=write)
    connect_args: dict[str, object] = {"connect_timeout": 10}
    if not write:
        connect_args["options"] = "-c default_transaction_read_only=on"
    try:
        return create_engine(url, pool_pre_ping=True, connect_args=connect_args)
    except ModuleNotFoundError:
        raise StoreError(
            f"{display_url(url)} needs the PostgreSQL driver psycopg 3: pip install 'headroom[postgres]'"
        ) from None


def _sqlite_engine(url: URL, *, write: bool) -> Engine:
    engine = create_engine(url)
    begin = "BEGIN IMMEDIATE" if write else "BEGIN"
    path = sqlite_file(url)
    if not write and path is not None and read_only_file_system(path):

        @event.listens_for(engine, "do_connect")
        def _open_immutable(_dialect, _record, cargs, cparams) -> None:
            cargs[0] = f"file:{quote(os.path.abspath(path))}?mode=ro&immutable=1"
            cparams["uri"] = True

    @event.listens_for(engine, "handle_error")
    def _on_error(context) -> None:
        failure = sqlite_failure(context.original_exception, url, write=write)
        if failure is not None:
            raise failure from context.original_exception

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN (below), not sqlite3
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if not write:
            cursor.execute("PRAGMA query_only = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection) -> None:
        connection.exec_driver_sql(connection.get_execution_options().get(SQLITE_BEGIN, begin))

    return engine


def enable_wal(engine: Engine) -> None:
    """Switch a SQLite store to WAL journaling; a no-op once it is (the mode persists in the file).

    The switch needs the file to itself, and SQLite does not wait for it: the
    ``PRAGMA`` reads the file first, and a connection that holds a read lock
    and wants to write returns "database is locked" at once rather than call
    the busy handler (waiting could deadlock against the writer it waits
    for). Writers racing to create a store meet this, so the switch is retried
    for up to the busy timeout, as the other writes wait.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    pause = 0.005
    while True:
        try:
            mode = _switch_to_wal(engine)
            break
        except sqlite3.DatabaseError as err:  # OperationalError ("locked"), or a damaged file, a full disk...
            if "locked" not in str(err) and "busy" not in str(err):
                raise sqlite_failure(err, engine.url, write=True) or StoreError(
                    f"cannot open {display_url(engine.url)}: {err}") from None
            if time.monotonic() >= deadline:
                raise StoreError(
                    f"{display_url(engine.url)}: could not switch to WAL journaling within "
                    f"{SQLITE_BUSY_TIMEOUT_MS / 1000:g} s: other connections kept the file locked ({err})"
                ) from None
            time.sleep(pause)
            pause = min(2 * pause, 0.1)
    if mode != "wal":
        raise StoreError(f"{display_url(engine.url)}: SQLite refused WAL journaling (mode is {mode!r})")


def _switch_to_wal(engine: Engine) -> str:
    """One try at ``PRAGMA journal_mode = WAL``; the journal mode the file has after it."""
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        mode = cursor.execute("PRAGMA journal_mode").fetchone()[0].lower()
        if mode != "wal":
            mode = cursor.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower()
        cursor.close()
        return mode
    finally:
        raw.close()


def read_only_file_system(path: Path) -> bool:
    """True when ``path`` lies on a read-only file system and nothing beside it (``-wal``, ``-journal``) holds
    part of the store: then nothing can change the file, and a reader may open it immutable (see the module)."""
    return _on_read_only_mount(path.parent) and not any(os.path.lexists(f"{path}{suffix}")
                                                        for suffix in SIDECARS if suffix != "-shm")


# SQLite's primary result codes (https://sqlite.org/rescode.html) and the messages that carry them where
# Python (before 3.11) does not give the code.
_PERM, _BUSY, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB = 3, 5, 8, 10, 11, 13, 14, 26
_CODES = {"access permission denied": _PERM, "database is locked": _BUSY, "attempt to write a readonly database": _READONLY,
          "disk I/O error": _IOERR, "database disk image is malformed": _CORRUPT, "database or disk is full": _FULL,
          "unable to open database file": _CANTOPEN, "file is not a database": _NOTADB,
          # Python's sqlite3 itself, reading a text column whose bytes a damaged page garbled (no SQLite code)
          "Could not decode to UTF-8 column": _CORRUPT}
MAX_REASON = 120
"""The most characters of SQLite's reason a message quotes."""
_LOW_SPACE = 1 << 20
"""Free bytes below which an I/O error is taken for a full disk: SQLite fails to grow its 32 KiB ``-shm``
file, or the store, with an I/O error rather than "disk is full" on some file systems (tmpfs)."""


def sqlite_failure(err: BaseException, url: URL, *, write: bool) -> Exception | None:
    """The exception that says what a SQLite error means for a store, to raise in its place; None for any other.

    - a damaged file (corrupt pages, not a database): `DamagedStoreError`, exit status 2;
    - a directory that SQLite cannot create its ``-wal``, ``-shm`` or
      ``-journal`` file in (a read-only mount, no permission), or a file of
      the store this user may not write: `StoreError`, 2, naming the
      directory or file: nothing says the store is damaged, and restoring it
      from a backup would not help;
    - a full disk, another I/O error: `OSError`, exit status 1 (the machine
      failed, not the input);
    - a write lock another connection held past the busy timeout: `OSError`,
      1, naming the timeout (another process's state, not the input).
    """
    error = getattr(err, "orig", None) or err
    path = sqlite_file(url)
    code = _primary_code(error)
    if path is None or code is None:
        return None
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if len(reason) > MAX_REASON:  # a column's garbled text, quoted whole by Python's sqlite3
        reason = reason[:MAX_REASON].rstrip() + "..."
    shown = display_url(url)
    if code in (_CORRUPT, _NOTADB):
        return DamagedStoreError(shown, reason)
    if code == _FULL or (code == _IOERR and _free_bytes(path.parent) < _LOW_SPACE):
        return OSError(errno.ENOSPC, f"{shown}: the disk holding {path.parent} is full ({reason}); free space there "
                       "and rerun, or point --db at a store on another disk")
    if code in (_CANTOPEN, _READONLY, _PERM):
        return _unwritable(path, shown, reason, write=write)
    if code == _IOERR:
        return OSError(errno.EIO, f"{shown}: {reason} on {path} (see the system log for the device's errors)")
    if code == _BUSY:
        return OSError(errno.EBUSY, f"{shown}: another connection held the store's write lock for over "
                                    f"{SQLITE_BUSY_TIMEOUT_MS / 1000:g} s ({reason}); rerun once its write is done")
    return None


def _primary_code(error: BaseException) -> int | None:
    if not isinstance(error, sqlite3.Error):
        return None
    code = getattr(error, "sqlite_errorcode", None)  # Python 3.11+; none on the module's own errors
    if code is not None:
        return code & 0xFF
    text = str(error)
    return next((found for message, found in _CODES.items() if text.startswith(message)), None)


def _free_bytes(directory: Path) -> int:
    try:
        found = os.statvfs(directory)
    except (OSError, AttributeError):
        return _LOW_SPACE
    return found.f_bavail * found.f_frsize


def _unwritable(path: Path, shown: str, reason: str, *, write: bool) -> StoreError | None:
    """Why SQLite could not create or write a store's files, when the file system says so; else None."""
    directory = path.parent
    if not os.access(directory, os.W_OK | os.X_OK) or _on_read_only_mount(directory):
        how = "on a read-only file system" if _on_read_only_mount(directory) else "not writable by this user"
        if write:
            return StoreError(f"cannot write {shown}: its directory {directory} is {how}, and SQLite creates "
                              f"{path.name}-wal and {path.name}-shm there to write ({reason}); make the directory "
                              "writable, or point --db at a store in a writable directory")
        return StoreError(f"cannot read {shown}: its directory {directory} is {how}, and SQLite must create "
                          f"{path.name}-shm there to read a WAL store ({reason}); the store itself may well be "
                          "intact: make the directory writable, or copy the store (with any -wal file) to a "
                          "writable directory and point --db at the copy")
    for name in ((path,) if write else ()) + tuple(Path(f"{path}{suffix}") for suffix in SIDECARS):
        if name.exists() and not os.access(name, os.R_OK | os.W_OK):  # a reader needs the -shm file writable too
            return StoreError(f"cannot {'write' if write else 'read'} {shown}: the file {name} is not writable by "
                              f"this user ({reason}); give this user write permission on it, or run as its owner")
    return None


def _on_read_only_mount(directory: Path) -> bool:
    try:  # AttributeError: no statvfs (Windows)
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False
