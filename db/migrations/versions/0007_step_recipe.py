"""The recipe of a training step beyond its precision: its FP8 recipe and whether it was compiled.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05

``headroom agent train`` now runs torchao's float8 recipes (``--fp8``) and torch.compile'd blocks
(``--compile on``), and the core predicts each differently (headroom.core.specs.float8, the compiled saved set), so
``train_step_results`` records both: ``fp8`` (a recipe's name, or ``off``) and ``compile``. Rows stored before
this revision ran neither.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("train_step_results") as batch:
        batch.add_column(sa.Column("fp8", sa.String(), nullable=False, server_default="off"))
        batch.add_column(sa.Column("compile", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("train_step_results") as batch:
        batch.drop_column("compile")
        batch.drop_column("fp8")
