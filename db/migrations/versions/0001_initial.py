"""Initial schema: fingerprints, runs, and one table per benchmark kind.

Revision ID: 0001
Revises:
Create Date: 2026-11-30

A frozen snapshot: the column types are spelled out here instead of imported
from headroom.db.models, so this revision creates the same tables whatever the models
later become.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

RESULT_TABLES = ("matmul_results", "elementwise_results", "attention_results", "train_step_results")


def _int() -> sa.types.TypeEngine:
    # SQLite's INTEGER is 64-bit and only an INTEGER primary key auto-increments.
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _time() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def _json() -> sa.JSON:
    return sa.JSON(none_as_null=True)


def _status(name: str, *values: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, create_constraint=True, length=16)


def _columns(spec: str, type_: sa.types.TypeEngine, *, nullable: bool) -> list[sa.Column]:
    return [sa.Column(name, type_, nullable=nullable) for name in spec.split()]


def _timing(prefix: str = "") -> list[sa.Column]:
    """Raw samples and their median, min and max, in seconds."""
    return [sa.Column(f"{prefix}samples_s", _json(), nullable=False),
            *_columns(f"{prefix}median_s {prefix}min_s {prefix}max_s", sa.Double(), nullable=True)]


def _result_table(table: str, *columns: sa.Column) -> None:
    """A result table: the columns every kind shares, then the kind's own, indexed by run."""
    op.create_table(
        table,
        sa.Column("id", _int(), nullable=False),
        sa.Column("run_id", _int(), nullable=False),
        sa.Column("status", _status("result_status", "ok", "oom", "error", "skipped"), nullable=False),
        sa.Column("message", sa.String(), nullable=True),
        sa.Column("recorded_at", _time(), nullable=False),
        *columns,
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=f"fk_{table}_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=f"pk_{table}"),
    )


def upgrade() -> None:
    op.create_table(
        "fingerprints",
        sa.Column("id", _int(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        *_columns("device_type device_name hostname python_version", sa.String(), nullable=False),
        *_columns("device_memory_bytes sm_count", _int(), nullable=True),
        *_columns("compute_capability form_factor driver_version cuda_version torch_version cpu_model",
                  sa.String(), nullable=True),
        sa.Column("details", _json(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_fingerprints"),
        sa.UniqueConstraint("digest", name="uq_fingerprints_digest"),
    )
    for column in ("device_name", "driver_version", "cuda_version", "torch_version"):
        op.create_index(f"ix_fingerprints_{column}", "fingerprints", [column])

    op.create_table(
        "runs",
        sa.Column("id", _int(), nullable=False),
        sa.Column("uuid", sa.String(length=36), nullable=False),
        sa.Column("fingerprint_id", _int(), nullable=False),
        *_columns("suite benchmark_version", sa.String(), nullable=False),
        sa.Column("started_at", _time(), nullable=False),
        sa.Column("finished_at", _time(), nullable=True),
        sa.Column("status", _status("run_status", "running", "completed", "failed", "aborted"), nullable=False),
        sa.Column("labels", _json(), nullable=False),
        sa.ForeignKeyConstraint(["fingerprint_id"], ["fingerprints.id"], name="fk_runs_fingerprint_id_fingerprints"),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.UniqueConstraint("uuid", name="uq_runs_uuid"),
    )
    op.create_index("ix_runs_started_at", "runs", ["started_at"])
    op.create_index("ix_runs_status", "runs", ["status"])
    op.create_index("ix_runs_fingerprint_id_started_at", "runs", ["fingerprint_id", "started_at"])

    _result_table(
        "matmul_results",
        sa.Column("dtype", sa.String(), nullable=False),
        *_columns("m n k batch", _int(), nullable=False),
        sa.Column("precision", sa.String(), nullable=True),
        *_timing(),
        *_columns("tflop_per_s peak_fraction", sa.Double(), nullable=True),
    )
    op.create_index("ix_matmul_results_run_id_dtype_status_tflop_per_s", "matmul_results",
                    ["run_id", "dtype", "status", "tflop_per_s"])

    _result_table(
        "elementwise_results",
        *_columns("op dtype", sa.String(), nullable=False),
        *_columns("elements bytes_moved", _int(), nullable=False),
        *_timing(),
        sa.Column("gb_per_s", sa.Double(), nullable=True),
    )
    _result_table(
        "attention_results",
        *_columns("backend dtype", sa.String(), nullable=False),
        *_columns("batch seq_len n_heads n_kv_heads head_dim", _int(), nullable=False),
        sa.Column("causal", sa.Boolean(), nullable=False),
        *_timing("forward_"),
        *_timing("backward_"),
    )
    _result_table(
        "train_step_results",
        sa.Column("model_name", sa.String(), nullable=False),
        sa.Column("model_spec", _json(), nullable=False),
        *_columns("seq_len micro_batch accumulation_steps", _int(), nullable=False),
        *_columns("recompute attention precision optimizer", sa.String(), nullable=False),
        *_timing(),
        *_columns("tokens_per_s mfu hfu optimizer_median_s", sa.Double(), nullable=True),
        *_columns("peak_allocated_bytes peak_reserved_bytes activation_bytes", _int(), nullable=True),
        sa.Column("prediction", _json(), nullable=True),
    )
    for table in ("elementwise_results", "attention_results", "train_step_results"):
        op.create_index(f"ix_{table}_run_id", table, ["run_id"])


def downgrade() -> None:
    for table in (*RESULT_TABLES, "runs", "fingerprints"):
        op.drop_table(table)
