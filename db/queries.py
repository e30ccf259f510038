"""Questions asked of a store: what is in it, what is incomplete, the best a device did.

Read-only functions over a `Session` (``with store.session() as s``), shared by
``headroom db info``, the dashboard and benchmarks/bench_store.py. A device
is a device name on a host: runs with other driver or torch versions on the
same box count together.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import BigInteger, Subquery, cast, func, select, union_all
from sqlalchemy.orm import Session

from headroom.db.models import (
    RESULT_MODELS,
    Fingerprint,
    MatmulResult,
    Run,
    UTCDateTime,
)


@dataclass(frozen=True, slots=True)
class DeviceCount:
    device_name: str
    hostname: str
    runs: int
    results: int
    last_started_at: datetime


@dataclass(frozen=True, slots=True)
class IncompleteRun:
    """A run still ``running``: in progress now, or its writer died (killed, crashed, powered off)."""

    run_id: str
    device_name: str
    hostname: str
    started_at: datetime
    results: int
    last_result_at: datetime | None


@dataclass(frozen=True, slots=True)
class DeviceBest:
    device_name: str
    hostname: str
    tflop_per_s: float


def runs_by_status(session: Session) -> dict[str, int]:
    return dict(session.execute(select(Run.status, func.count()).group_by(Run.status)).all())


def results_by_kind(session: Session) -> dict[str, int]:
    return {kind: session.scalar(select(func.count()).select_from(model)) for kind, model in RESULT_MODELS.items()}


def _results_per_run() -> Subquery:
    """run_id, results (count over every kind) and last_result_at."""
    rows = union_all(*(select(m.run_id, m.recorded_at) for m in RESULT_MODELS.values())).subquery()
    return (
        select(
            rows.c.run_id,
            func.count().label("results"),
            func.max(rows.c.recorded_at, type_=UTCDateTime()).label("last_result_at"),
        )
        .group_by(rows.c.run_id)
        .subquery()
    )


def counts_by_device(session: Session) -> list[DeviceCount]:
    """Runs and results per device, most recently active first."""
    per_run = _results_per_run()
    stmt = (
        select(
            Fingerprint.device_name,
            Fingerprint.hostname,
            func.count(Run.id),
            # PostgreSQL's SUM of counts is NUMERIC: read it back as the integer it is.
            cast(func.coalesce(func.sum(per_run.c.results), 0), BigInteger),
            func.max(Run.started_at, type_=UTCDateTime()),
        )
        .join(Run, Run.fingerprint_id == Fingerprint.id)
        .outerjoin(per_run, per_run.c.run_id == Run.id)
        .group_by(Fingerprint.device_name, Fingerprint.hostname)
        .order_by(func.max(Run.started_at).desc(), Fingerprint.device_name, Fingerprint.hostname)
    )
    return [DeviceCount(*row) for row in session.execute(stmt)]


def incomplete_runs(session: Session) -> list[IncompleteRun]:
    """Runs left ``running``, oldest first."""
    per_run = _results_per_run()
    stmt = (
        select(
            Run.uuid,
            Fingerprint.device_name,
            Fingerprint.hostname,
            Run.started_at,
            func.coalesce(per_run.c.results, 0),
            per_run.c.last_result_at,
        )
        .join(Fingerprint, Fingerprint.id == Run.fingerprint_id)
        .outerjoin(per_run, per_run.c.run_id == Run.id)
        .where(Run.status == "running")
        .order_by(Run.started_at, Run.uuid)
    )
    return [IncompleteRun(*row) for row in session.execute(stmt)]


def best_tflop_per_s(session: Session, dtype: str, since: datetime) -> list[DeviceBest]:
    """The best matmul TFLOP/s each device reached in ``dtype`` in runs started at or after ``since``.

    Only ``ok`` results count. The maximum is taken per fingerprint first,
    from the indexes on ``runs(fingerprint_id, started_at)`` and
    ``matmul_results(run_id, dtype, status, tflop_per_s)`` alone, and only
    those few rows are joined to the device names.
    """
    per_fingerprint = (
        select(Run.fingerprint_id, func.max(MatmulResult.tflop_per_s).label("best"))
        .join(MatmulResult, MatmulResult.run_id == Run.id)
        .where(MatmulResult.dtype == dtype, MatmulResult.status == "ok", Run.started_at >= since)
        .group_by(Run.fingerprint_id)
        .subquery()
    )
    best = func.max(per_fingerprint.c.best)
    stmt = (
        select(Fingerprint.device_name, Fingerprint.hostname, best)
        .join(per_fingerprint, per_fingerprint.c.fingerprint_id == Fingerprint.id)
        .group_by(Fingerprint.device_name, Fingerprint.hostname)
        .order_by(best.desc(), Fingerprint.device_name, Fingerprint.hostname)
    )
    return [DeviceBest(*row) for row in session.execute(stmt)]
