"""What the host pays to dispatch eager PyTorch.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04

The time model prices the host's dispatch of every op a step runs (headroom.core.timing.op_time.HostCosts): a forward op, a
backward kernel, and what a selective-checkpoint context adds per op. The agent now measures the three on the
box (headroom.agent.bench_dispatch), into a new ``dispatch_results`` table with raw samples like every other timed
result; a store without any keeps the time model's defaults.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _int() -> sa.types.TypeEngine:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    status = sa.Enum("ok", "oom", "error", "skipped", name="result_status", native_enum=False,
                     create_constraint=True, length=16)
    table = "dispatch_results"
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
        sa.Column("mode", sa.String(), nullable=False),
        sa.Column("ops", _int(), nullable=False),
        sa.Column("details", sa.JSON(none_as_null=True), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=f"fk_{table}_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=f"pk_{table}"),
    )
    op.create_index("ix_dispatch_results_run_id", table, ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_dispatch_results_run_id", table_name="dispatch_results")
    op.drop_table("dispatch_results")
