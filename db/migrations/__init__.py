"""Alembic migrations of the result store, run by db.migrate (see README.md here)."""
