"""The ``headroom`` command: a thin dispatcher over core, db, agent and dashboard."""
