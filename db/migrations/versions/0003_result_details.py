"""A ``details`` document on every result: how it was measured, beyond its columns.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

Some facts about a measurement have no column and need none for queries, but
decide whether two numbers may be compared: the clocks and throttle reasons
the GPU reported when a timing ended, how many back-to-back calls one timed
sample spans, the attention kernel that actually ran (SDPA may pick cuDNN
where flash was expected), fp8's fast-accumulation flag, and the peak memory
of each phase of a training step. Rows stored before this revision have none
(NULL): those facts were not recorded then.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TABLES = ("matmul_results", "elementwise_results", "attention_results", "train_step_results")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("details", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    for table in reversed(TABLES):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("details")
