"""Alembic's entry point, run by `headroom.db.migrate` on a connection it already holds.

The connection arrives in ``config.attributes["connection"]``, inside the
transaction that `headroom.db.migrate.ensure_schema` opened under the write lock, so
every revision of an upgrade commits together or not at all.
"""

from alembic import context

from headroom.db.migrate import VERSION_TABLE
from headroom.db.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("Headroom's migrations run through headroom.db.migrate with a connection; offline mode is not supported")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    # SQLite alters a table by copying it; Alembic's batch mode does that.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
