"""Prediction columns on training-step results, backfilled from the stored prediction.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

Calibration compares each measured step with what the core predicted for it:
peak memory, saved-activation bytes and step time. Revision 0001 kept the
prediction only as a JSON document, so every comparison needed JSON path
functions that differ between SQLite and PostgreSQL and could not be summed,
sorted or indexed in plain SQL. This revision promotes the three compared
numbers to columns and fills them for rows already stored, from the document
the agent records: the ``headroom estimate --json`` contract
(``memory_bytes.peak``, ``memory_bytes.activations``) plus ``step_time_s``.
A value a document lacks, or holds as something other than a number, stays
NULL.
"""

from __future__ import annotations

import math
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _int() -> sa.types.TypeEngine:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


# column, its type, where the value sits in the stored prediction, the Python type it must have
COLUMNS = (
    ("predicted_peak_bytes", _int(), ("memory_bytes", "peak"), int),
    ("predicted_activation_bytes", _int(), ("memory_bytes", "activations"), int),
    ("predicted_step_time_s", sa.Double(), ("step_time_s",), float),
)


def _lookup(document: Any, path: tuple[str, ...], kind: type) -> int | float | None:
    """The number at ``path`` in a stored prediction, or None where it is absent or of another kind."""
    for key in path:
        if not isinstance(document, dict):
            return None
        document = document.get(key)
    if isinstance(document, bool) or not isinstance(document, (int, float)):
        return None
    if kind is int:
        return document if isinstance(document, int) else None
    return float(document) if math.isfinite(document) else None


def upgrade() -> None:
    with op.batch_alter_table("train_step_results") as batch:
        for name, type_, _, _ in COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))

    steps = sa.table(
        "train_step_results",
        sa.column("id", _int()),
        sa.column("prediction", sa.JSON(none_as_null=True)),
        *(sa.column(name, type_) for name, type_, _, _ in COLUMNS),
    )
    connection = op.get_bind()
    rows = connection.execute(sa.select(steps.c.id, steps.c.prediction).where(steps.c.prediction.is_not(None)))
    updates = [
        {"row_id": row_id, **{name: _lookup(prediction, path, kind) for name, _, path, kind in COLUMNS}}
        for row_id, prediction in rows
    ]
    if updates:
        connection.execute(
            steps.update().where(steps.c.id == sa.bindparam("row_id")).values(
                {name: sa.bindparam(name) for name, _, _, _ in COLUMNS}
            ),
            updates,
        )


def downgrade() -> None:
    with op.batch_alter_table("train_step_results") as batch:
        for name, _, _, _ in reversed(COLUMNS):
            batch.drop_column(name)
