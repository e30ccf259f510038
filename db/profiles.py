"""A device's measurements fetched from the store, as headroom.core.measured.measurements turns them into a profile.

``measured_profile(name)`` looks for a device in the store whose name matches
``name`` (case-insensitive; exact first, else a unique substring), reads its
``ok`` rows as headroom.core.measured.measurements records and builds its HardwareProfile
(`build_profile`) and calibration (`calibration_for`). What the rows mean
(medians, the non-decreasing matmul curve, the fastest attention, the best
copy, fragmentation, datasheet fallbacks, re-predicting each training step)
is headroom.core.measured.measurements's.

The work does not grow with the store's history. Each kind of result is
read from the device's latest `PROFILE_RUNS` runs that recorded it, and where
headroom.core.measured.measurements reduces many rows to one figure, SQL does it first
(``GROUP BY``, window functions) and hands over one record per group that
yields the same figure: the median rate of each matmul size, the median time
of each collective size, the fastest attention of each shape, the best copy.
tests/test_db_profiles.py checks each aggregate against headroom.core.measured.measurements on
every row.
"""

from __future__ import annotations

import os

from sqlalchemy import Select, func, or_, select
from sqlalchemy.orm import Session

from headroom.core.errors import ConfigError
from headroom.core.measured.calibration import Calibration
from headroom.core.measured.measurements import (
    AttentionRecord,
    DeviceRecord,
    DispatchRecord,
    ElementwiseRecord,
    MatmulRecord,
    TrainStepRecord,
    calibration_from_steps,
    profile_from_measurements,
)
from headroom.core.specs.stack import stack_name
from headroom.core.timing.collective_curves import CollectiveRecord
from headroom.core.timing.step import HardwareProfile
from headroom.db.device_names import matching_names
from headroom.db.location import nothing_recorded
from headroom.db.models import (
    AttentionResult,
    CollectiveResult,
    DispatchResult,
    ElementwiseResult,
    Fingerprint,
    MatmulResult,
    Run,
    TrainStepResult,
)
from headroom.db.store import open_store

PROFILE_RUNS = 50
"""A profile and its calibration read each kind of result from the device's latest this-many runs that
recorded it: the box as it is now (its driver, clocks and software), and a bounded amount of work however
long its history. A box that runs the standard suite nightly covers seven weeks."""


def device_names(session: Session, device_type: str | None = None) -> list[str]:
    """Every measured device's name, sorted; of one device type (``cuda``: the GPUs) where given."""
    query = select(Fingerprint.device_name)
    if device_type is not None:
        query = query.where(Fingerprint.device_type == device_type)
    return sorted(set(session.scalars(query)))


def find_device(session: Session, name: str) -> str | None:
    """The stored device name that ``name`` means (``latest``: the last one measured), or None."""
    if name.strip().lower() == "latest":
        return session.scalars(
            select(Fingerprint.device_name).join(Run, Run.fingerprint_id == Fingerprint.id).order_by(Run.started_at.desc())
        ).first()
    found = matching_names(device_names(session), name)
    if len(found) > 1:
        raise ConfigError(f"--hardware {name!r} matches several measured devices: {'; '.join(found)}; give the full name")
    return found[0] if found else None


def _ok_rows(model, device_name: str, *columns) -> Select:
    """The device's ok rows of ``model`` in its latest `PROFILE_RUNS` runs that recorded any, as plain columns
    (no ORM objects, no samples decoded)."""
    latest = (select(Run.id).join(Fingerprint, Run.fingerprint_id == Fingerprint.id)
              .where(Fingerprint.device_name == device_name,
                     select(model.id).where(model.run_id == Run.id, model.status == "ok").exists())
              .order_by(Run.started_at.desc(), Run.id.desc()).limit(PROFILE_RUNS))
    return (
        select(*columns)
        .join(Run, model.run_id == Run.id)
        .where(model.run_id.in_(latest), model.status == "ok")
    )


def _medians(model, device_name: str, keys: list, value, *where) -> Select:
    """For each group of ``keys`` among the device's ok rows of ``model`` that meet ``where``, the keys and the
    median of ``value`` as statistics.median takes it (the middle row, or the mean of the two middle rows), with
    window functions that SQLite and PostgreSQL share."""
    ranked = _ok_rows(
        model, device_name, *(key.label(f"key{i}") for i, key in enumerate(keys)), value.label("value"),
        func.row_number().over(partition_by=keys, order_by=value).label("place"),
        func.count().over(partition_by=keys).label("size"),
    ).where(*where).subquery()
    grouped = [ranked.c[f"key{i}"] for i in range(len(keys))]
    middle = or_(ranked.c.place == (ranked.c.size + 1) // 2, ranked.c.place == (ranked.c.size + 2) // 2)
    return select(*grouped, func.avg(ranked.c.value)).where(middle).group_by(*grouped).order_by(*grouped)


def device_record(session: Session, device_name: str) -> DeviceRecord:
    """The device as its latest fingerprint describes it; ConfigError when the store holds none of it."""
    fingerprint = session.scalars(
        select(Fingerprint).where(Fingerprint.device_name == device_name).order_by(Fingerprint.id.desc())
    ).first()
    if fingerprint is None:
        raise ConfigError(f"{device_name} has no measurements in the store; run `headroom agent run` on it")
    return DeviceRecord(device_name, fingerprint.device_type, fingerprint.device_memory_bytes)


def matmul_records(session: Session, device_name: str) -> list[MatmulRecord]:
    """One record per dtype and GEMM size (FLOPs): its median rate, what headroom.core.measured.measurements.matmul_curve takes."""
    m = MatmulResult
    flops = 2 * m.m * m.n * m.k * m.batch
    medians = _medians(m, device_name, [m.dtype, flops], m.tflop_per_s * 1e12, m.tflop_per_s > 0, flops > 0)
    return [MatmulRecord(dtype, int(size), rate) for dtype, size, rate in session.execute(medians)]


def attention_records(session: Session, device_name: str) -> list[AttentionRecord]:
    """One record per shape: its fastest forward (ties: the earliest), of which headroom.core.measured.measurements takes the
    fastest at the largest shape."""
    a = AttentionResult
    shape = [a.batch, a.seq_len, a.n_heads, a.head_dim]
    ranked = _ok_rows(a, device_name, *shape, a.forward_median_s, a.backward_median_s, Run.started_at.label("at"),
                      a.id.label("row"),
                      func.row_number().over(partition_by=shape, order_by=(a.forward_median_s, Run.started_at, a.id))
                      .label("place")).where(a.forward_median_s > 0).subquery()
    fastest = select(*[c for c in ranked.c if c.key not in ("at", "row", "place")]).where(ranked.c.place == 1)
    return [AttentionRecord(*row) for row in session.execute(fastest.order_by(ranked.c.at, ranked.c.row))]


def elementwise_records(session: Session, device_name: str) -> list[ElementwiseRecord]:
    """The best copy (headroom.core.measured.measurements.copy_bandwidth takes the best), or nothing."""
    e = ElementwiseResult
    best = session.scalar(_ok_rows(e, device_name, func.max(e.gb_per_s)).where(e.op == "copy", e.gb_per_s > 0))
    return [ElementwiseRecord("copy", best * 1e9)] if best is not None else []


def collective_records(session: Session, device_name: str) -> list[CollectiveRecord]:
    """One record per op, group and message size: its median time, what CollectiveCurves.from_records takes."""
    c = CollectiveResult
    medians = _medians(c, device_name, [c.op, c.group_size, c.message_bytes], c.median_s,
                       c.median_s > 0, c.message_bytes > 0, c.group_size > 1)
    return [CollectiveRecord(*row) for row in session.execute(medians)]


def dispatch_records(session: Session, device_name: str) -> list[DispatchRecord]:
    """One record per mode: its median seconds per op, what headroom.core.measured.measurements.host_costs takes."""
    d = DispatchResult
    medians = _medians(d, device_name, [d.mode], d.median_s, d.median_s >= 0)
    return [DispatchRecord(mode, per_op) for mode, per_op in session.execute(medians)]


TRAIN_STEP_COLUMNS = (
    "model_name", "model_spec", "seq_len", "micro_batch", "accumulation_steps", "precision", "optimizer", "attention",
    "recompute", "median_s", "peak_allocated_bytes", "peak_reserved_bytes", "activation_bytes", "layout", "rank",
    "min_s", "max_s", "fp8", "compile",
)


def train_step_records(session: Session, device_name: str) -> list[TrainStepRecord]:
    """The device's ok training steps of its latest `PROFILE_RUNS` runs that measured any, oldest first."""
    t = TrainStepResult
    # Dropout and the stack are not columns: they are read from the configuration the core's prediction was
    # made for, in SQL (a JSON path), so the prediction documents are not decoded.
    dropout = t.prediction[("config", "dropout")].as_float()
    stack = t.prediction[("config", "stack")].as_string()  # whose checkpointing ran (NULL on the oldest rows)
    busy = t.details[("host", "busy")].as_boolean()  # the agent's verdict on the host (NULL on older rows)
    columns = [getattr(t, name) for name in TRAIN_STEP_COLUMNS]
    rows = _ok_rows(t, device_name, *columns, dropout, stack, t.communication_median_s, busy).order_by(
        Run.started_at, t.id)
    return [
        TrainStepRecord(**dict(zip(TRAIN_STEP_COLUMNS, values, strict=True)), dropout=float(drop or 0.0),
                        stack=stack_name(ran or "reference"), communication_s=communication, busy=bool(flagged))
        for *values, drop, ran, communication, flagged in session.execute(rows)
    ]


def build_profile(session: Session, device_name: str, steps: list[TrainStepRecord] | None = None) -> HardwareProfile:
    """The device's profile from its stored measurements (headroom.core.measured.measurements.profile_from_measurements);
    ``steps``: its training steps, when already read."""
    device = device_record(session, device_name)
    return profile_from_measurements(
        device,
        matmul=matmul_records(session, device_name),
        attention=attention_records(session, device_name),
        elementwise=elementwise_records(session, device_name),
        train_steps=train_step_records(session, device_name) if steps is None else steps,
        host_memory_bytes=None if device.memory_bytes else _host_memory(),
        collectives=collective_records(session, device_name),
        dispatch=dispatch_records(session, device_name),
    )


def _host_memory() -> int:
    """This machine's memory, the memory of a CPU device whose fingerprint has none."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def calibration_for(session: Session, device_name: str, profile: HardwareProfile,
                    steps: list[TrainStepRecord] | None = None) -> Calibration:
    """Each ok training step of the device (``steps``, else read), predicted again now, against what was
    measured."""
    steps = train_step_records(session, device_name) if steps is None else steps
    return calibration_from_steps(device_name, steps, profile)


def measured_in(session: Session, name: str) -> tuple[HardwareProfile, Calibration] | None:
    """The device ``name`` means (`find_device`) with its profile and calibration, or None when none matches."""
    device_name = find_device(session, name)
    if device_name is None:
        return None
    steps = train_step_records(session, device_name)
    profile = build_profile(session, device_name, steps)
    return profile, calibration_for(session, device_name, profile, steps)


def measured_devices(url: str | None = None) -> list[str]:
    with open_store(url, mode="read") as store, store.session() as session:
        return device_names(session)


def measured_profile(name: str, url: str | None) -> tuple[HardwareProfile, Calibration] | None:
    """The device named ``name`` as measured in the store, or None when the store has no such device.

    With no ``url`` and no HEADROOM_DB, a missing default store simply means
    nothing was measured yet; an explicit store that cannot be read is an error.
    """
    if nothing_recorded(url):
        return None
    with open_store(url, mode="read") as store, store.session() as session:
        return measured_in(session, name)
