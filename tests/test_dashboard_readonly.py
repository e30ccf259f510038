"""The dashboard only reads: a reader's engine refuses writes at the database, on both backends.

`Store` already refuses its own writer API in read mode; these tests go under
it, with raw SQL on the reader's engine, the way a bug in a query would.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from headroom.db.store import open_store
from tests.db_support import postgres_url, record_run, sqlite_url, store_url  # noqa: F401  (fixtures)


def test_reader_engine_refuses_raw_writes(store_url):
    with open_store(store_url, mode="write") as store:
        record_run(store, seed=1)
    with open_store(store_url) as store:
        with store.engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM runs")).scalar_one() == 1
        with pytest.raises(DBAPIError, match="(?i)read.?only"):
            with store.engine.begin() as connection:
                connection.execute(text("UPDATE runs SET suite = 'tampered'"))
        with pytest.raises(DBAPIError, match="(?i)read.?only"):
            with store.engine.begin() as connection:
                connection.execute(text("CREATE TABLE intruder (x INTEGER)"))
    with open_store(store_url) as store, store.engine.connect() as connection:
        assert connection.execute(text("SELECT suite FROM runs")).scalar_one() != "tampered"


def test_writer_engine_still_writes(store_url):
    with open_store(store_url, mode="write") as store:
        record_run(store, seed=2)
        with store.engine.begin() as connection:
            connection.execute(text("UPDATE runs SET suite = 'renamed'"))
        with store.engine.connect() as connection:
            assert connection.execute(text("SELECT suite FROM runs")).scalar_one() == "renamed"
