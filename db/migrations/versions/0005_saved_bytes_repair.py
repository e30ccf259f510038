"""Training steps' ``predicted_activation_bytes`` repaired where revision 0002 back-filled another quantity.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

``activation_bytes`` is what the agent's probe measures: every byte autograd
keeps for backward for one micro-batch (token ids, activations, the loss's
log-probabilities), on the device and on the host. The agent writes
``predicted_activation_bytes`` as the same quantity from the ledger. Revision
0002 back-filled rows stored before it from the prediction document's
``memory_bytes.activations``, which is another quantity: the device's
activations without the log-probabilities (``memory_bytes.logits``) and
without the host's share (``memory_bytes.activations_host``). Those rows
looked 16% under-predicted against their own measurement.

A row whose value is still what 0002 wrote (it equals
``memory_bytes.activations``) gets ``activations + logits +
activations_host``, which is what the agent writes for that configuration.
0002 only ever saw one-device steps (multi-rank rows arrived with 0004), for
which that sum is exact, except under activation offload, whose host share
also holds the parameters ``save_on_cpu`` copies, which the document does
not separate: there, and where the document lacks one of the three numbers,
the value becomes NULL (no comparison rather than a wrong one). Rows the
agent wrote itself are left alone, and so is every prediction document.
Downgrade changes nothing: the schema is 0004's, and 0002's values were a
defect under it too.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _int() -> sa.types.TypeEngine:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _number(memory: Any, key: str) -> int | None:
    value = memory.get(key) if isinstance(memory, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def saved_bytes(prediction: Any, recompute: str) -> int | None:
    """What the agent writes as predicted_activation_bytes, rebuilt from a one-device prediction document."""
    memory = prediction.get("memory_bytes") if isinstance(prediction, dict) else None
    parts = [_number(memory, k) for k in ("activations", "logits", "activations_host")]
    if None in parts or (recompute == "offload" and parts[2]):
        return None
    return sum(parts)


def _steps() -> sa.TableClause:
    return sa.table("train_step_results", sa.column("id", _int()), sa.column("recompute", sa.String()),
                    sa.column("world_size", _int()), sa.column("prediction", sa.JSON(none_as_null=True)),
                    sa.column("predicted_activation_bytes", _int()))


def _update(steps: sa.TableClause, values: list[dict[str, Any]]) -> None:
    if values:
        op.get_bind().execute(
            steps.update().where(steps.c.id == sa.bindparam("row_id")).values(
                predicted_activation_bytes=sa.bindparam("value")),
            values,
        )


def upgrade() -> None:
    steps = _steps()
    rows = op.get_bind().execute(
        sa.select(steps.c.id, steps.c.recompute, steps.c.prediction, steps.c.predicted_activation_bytes)
        .where(steps.c.prediction.is_not(None), steps.c.predicted_activation_bytes.is_not(None),
               steps.c.world_size == 1))
    repairs = []
    for row_id, recompute, prediction, value in rows:
        memory = prediction.get("memory_bytes") if isinstance(prediction, dict) else None
        if value == _number(memory, "activations"):  # still 0002's back-fill
            repaired = saved_bytes(prediction, recompute)
            if repaired != value:
                repairs.append({"row_id": row_id, "value": repaired})
    _update(steps, repairs)


def downgrade() -> None:
    """Nothing to undo: the schema is 0004's, and the repaired values are right under it too."""
