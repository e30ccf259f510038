"""The result store: every measurement, from every box, kept and comparable over time.

SQLite by default (one file, many writer processes), PostgreSQL for a fleet.
One concept a module:

- ``location``  which store: ``--db``, ``HEADROOM_DB`` or the default file (stdlib only)
- ``models``    the tables, as typed ORM classes the agent fills in
- ``engine``    SQLite (WAL, busy timeout, foreign keys) and PostgreSQL engines
- ``migrate``   schema revisions: recognise, refuse or upgrade a store (Alembic)
- ``validate``  checks a record before it is written, with errors naming the field
- ``store``     ``open_store`` and the writer API: start a run, add results, finish
- ``queries``   what is stored: counts, incomplete runs, best rates per device
- ``bundle``    export, import and merge as JSON bundles

This package imports nothing at import time, so ``import headroom.db.location`` stays
free of SQLAlchemy; import the module you need.
"""
