"""Alembic migrations of the result store, run by headroom.db.migrate (see README.md here)."""
