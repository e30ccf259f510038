"""Schema revisions: recognise a store, refuse what is not ours, upgrade what is older.

Migrations are Alembic scripts shipped inside the package
(``db/migrations/versions``) and run programmatically with a `Config` built
here, so no ``alembic.ini`` is needed at run time. The revision a store is at
lives in its own table, ``headroom_schema_version`` (not Alembic's default
``alembic_version``, which another application's database may have too).

What a store can be, and what each caller does with it:

===================  ================================  =============================
store                writer (agent, import, upgrade)    reader (dashboard, info)
===================  ================================  =============================
at the code's head   use it                             use it
older revision       upgrade it, in one transaction     refuse, naming the upgrade command
empty (no tables)    create the schema                  refuse: nothing recorded
newer revision       refuse: upgrade headroom           refuse: upgrade headroom
foreign tables       refuse, touch nothing              refuse, touch nothing
===================  ================================  =============================

Concurrent writers opening one new store serialise on the write lock
(SQLite's ``BEGIN IMMEDIATE``, a PostgreSQL advisory lock) and check again
under it, so the schema is created once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, func, inspect, select, text
from sqlalchemy.exc import DBAPIError

from headroom.db.engine import display_url, driver_message
from headroom.db.errors import OutdatedStoreError, StoreError

if TYPE_CHECKING:
    from alembic.config import Config

VERSION_TABLE = "headroom_schema_version"
MIGRATIONS = Path(__file__).with_name("migrations")
# Any fixed 64-bit key: serialises Headroom schema changes within one PostgreSQL database.
_PG_LOCK_KEY = 0x4865616472_6F6F6D


@dataclass(frozen=True, slots=True)
class SchemaState:
    """What a database holds, as far as Headroom is concerned."""

    revision: str | None
    """The Headroom schema revision, or None when there is none."""
    tables: tuple[str, ...]
    """Every table in the database (the default schema on PostgreSQL)."""

    @property
    def empty(self) -> bool:
        return not self.tables


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's configuration, in code; ``connection`` is the one migrations run on.

    Alembic is imported here, by writers only: a reader recognises a store
    without it (`revisions`, `probe`).
    """
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


@cache
def revisions() -> tuple[str, ...]:
    """Every schema revision this code knows, oldest first; the last is the head.

    Read from the scripts' names (``versions/NNNN_what.py`` holds revision
    ``NNNN``, whose down revision is the one before), not from Alembic's
    script directory, which readers do not import; tests/test_db_migrations.py
    checks that the two agree.
    """
    return tuple(sorted(p.name[:4] for p in (MIGRATIONS / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")))


def head() -> str:
    return revisions()[-1]


def upgrade_command(url: str) -> str:
    return f"headroom db upgrade --db '{url}'"


def probe(connection: Connection) -> SchemaState:
    """Read which tables exist and the Headroom revision, without writing anything."""
    try:
        tables = tuple(sorted(inspect(connection).get_table_names()))
        revision = None
        if VERSION_TABLE in tables:  # Alembic's version table: one row, the revision
            revision = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().first()
    except DBAPIError as err:
        raise StoreError(
            f"cannot read {display_url(connection.engine.url)}: {driver_message(err)}; it is not a readable Headroom store "
            "(restore it from a backup or a bundle, or point --db at another store)"
        ) from None
    return SchemaState(revision=revision, tables=tables)


def check(state: SchemaState, url: str) -> None:
    """Refuse a database that is not a Headroom store, or one written by newer code."""
    if state.revision is None and not state.empty:
        shown = ", ".join(state.tables[:5]) + (", ..." if len(state.tables) > 5 else "")
        raise StoreError(
            f"{url} is not a Headroom result store: it holds other tables ({shown}) and no "
            f"{VERSION_TABLE}; point --db at a Headroom store or at a new file or empty database"
        )
    if state.revision is not None and state.revision not in revisions():
        raise StoreError(
            f"{url} is at schema revision {state.revision!r}, newer than this headroom knows "
            f"({', '.join(revisions())}): it was written by a newer version; upgrade headroom to read it"
        )


def ensure_schema(engine: Engine, *, write: bool) -> str | None:
    """Make sure ``engine`` holds a Headroom store at the code's revision.

    A writer creates or upgrades it; a reader only checks. Returns the
    revision a writer upgraded from (``"empty"`` for a new store), or None
    when nothing changed. Nothing is written before the checks pass, and an
    upgrade commits whole or not at all.
    """
    url = display_url(engine.url)
    with engine.connect() as connection:
        state = probe(connection)
    check(state, url)
    if state.revision == head():
        return None
    if not write:
        if state.empty:
            raise StoreError(f"{url} is empty: nothing has been recorded there yet")
        raise OutdatedStoreError(
            f"{url} is at schema revision {state.revision}, this headroom reads {head()}; "
            f"readers never migrate, upgrade it with: {upgrade_command(url)}",
            upgrade_command=upgrade_command(url),
        )
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(select(func.pg_advisory_xact_lock(_PG_LOCK_KEY)))
        state = probe(connection)  # again, under the lock: another writer may have been first
        check(state, url)
        if state.revision != head():
            from alembic import command

            command.upgrade(alembic_config(connection), "head")
    return None if state.revision == head() else state.revision or "empty"
