"""Collectives and multi-rank training steps.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

The agent now measures what a cluster plan depends on beyond one device:
collectives (all-reduce, all-gather, reduce-scatter, all-to-all, send/recv)
over the box's GPUs, in a new ``collective_results`` table with raw samples
like every other timed result; and training steps run by several ranks at
once (FSDP, DDP, tensor parallelism), one ``train_step_results`` row per
rank with its layout, its exposed communication and the core's prediction of
it. Rows stored before this revision are one-device steps: rank 0 of 1.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _int() -> sa.types.TypeEngine:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("train_step_results") as batch:
        batch.add_column(sa.Column("rank", _int(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("world_size", _int(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("layout", sa.JSON(none_as_null=True), nullable=True))
        batch.add_column(sa.Column("communication_median_s", sa.Double(), nullable=True))
        batch.add_column(sa.Column("predicted_communication_s", sa.Double(), nullable=True))

    status = sa.Enum("ok", "oom", "error", "skipped", name="result_status", native_enum=False,
                     create_constraint=True, length=16)
    table = "collective_results"
    op.create_table(
        table,
        sa.Column("id", _int(), nullable=False),
        sa.Column("run_id", _int(), nullable=False),
        sa.Column("status", status, nullable=False),
        sa.Column("message", sa.String(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("samples_s", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("median_s", sa.Double(), nullable=True),
        sa.Column("min_s", sa.Double(), nullable=True),
        sa.Column("max_s", sa.Double(), nullable=True),
        sa.Column("op", sa.String(), nullable=False),
        sa.Column("backend", sa.String(), nullable=False),
        sa.Column("dtype", sa.String(), nullable=False),
        sa.Column("group_size", _int(), nullable=False),
        sa.Column("message_bytes", _int(), nullable=False),
        sa.Column("algbw_gb_per_s", sa.Double(), nullable=True),
        sa.Column("busbw_gb_per_s", sa.Double(), nullable=True),
        sa.Column("details", sa.JSON(none_as_null=True), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=f"fk_{table}_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=f"pk_{table}"),
    )
    op.create_index("ix_collective_results_run_id_op_group_size", "collective_results", ["run_id", "op", "group_size"])


def downgrade() -> None:
    op.drop_index("ix_collective_results_run_id_op_group_size", table_name="collective_results")
    op.drop_table("collective_results")
    with op.batch_alter_table("train_step_results") as batch:
        for name in ("predicted_communication_s", "communication_median_s", "layout", "world_size", "rank"):
            batch.drop_column(name)
