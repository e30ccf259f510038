"""A device's measurements fetched from the store, as core.measurements turns them into a profile.

``measured_profile(name)`` looks for a device in the store whose name matches
``name`` (case-insensitive; exact first, else a unique substring), reads its
``ok`` rows as core.measurements records and builds its HardwareProfile
(`build_profile`) and calibration (`calibration_for`). What the rows mean
(medians, the non-decreasing matmul curve, the fastest attention, the best
copy, fragmentation, datasheet fallbacks, re-predicting each training step)
is core.measurements's; this module only queries and converts.
"""

from __future__ import annotations

import os

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.calibration import Calibration
from core.errors import ConfigError
from core.collective_curves import CollectiveRecord
from core.measurements import (
    AttentionRecord,
    DeviceRecord,
    ElementwiseRecord,
    MatmulRecord,
    TrainStepRecord,
    calibration_from_steps,
    profile_from_measurements,
)
from core.timing import HardwareProfile
from db.location import nothing_recorded
from db.models import (
    AttentionResult,
    CollectiveResult,
    ElementwiseResult,
    Fingerprint,
    MatmulResult,
    Run,
    TrainStepResult,
)
from db.store import open_store


def device_names(session: Session) -> list[str]:
    """Every measured device's name, sorted."""
    return sorted(set(session.scalars(select(Fingerprint.device_name))))


def find_device(session: Session, name: str) -> str | None:
    """The stored device name that ``name`` means (``latest``: the last one measured), or None."""
    if name.strip().lower() == "latest":
        return session.scalars(
            select(Fingerprint.device_name).join(Run, Run.fingerprint_id == Fingerprint.id).order_by(Run.started_at.desc())
        ).first()
    names = device_names(session)
    wanted = name.strip().lower()
    exact = [n for n in names if n.lower() == wanted]
    if exact:
        return exact[0]
    partial = [n for n in names if wanted in n.lower()]
    if len(partial) > 1:
        raise ConfigError(f"--hardware {name!r} matches several measured devices: {'; '.join(partial)}; give the full name")
    return partial[0] if partial else None


def _rows(session: Session, model, device_name: str, *columns):
    """The device's ok rows of ``model``, oldest run first, as plain rows of ``columns`` only: no ORM
    objects, and no raw samples or details documents decoded (a profile reads medians and rates)."""
    query = (
        select(*columns)
        .join(Run, model.run_id == Run.id)
        .join(Fingerprint, Run.fingerprint_id == Fingerprint.id)
        .where(Fingerprint.device_name == device_name, model.status == "ok")
        .order_by(Run.started_at, model.id)
    )
    return session.execute(query).all()


def device_record(session: Session, device_name: str) -> DeviceRecord:
    """The device as its latest fingerprint describes it."""
    fingerprint = session.scalars(
        select(Fingerprint).where(Fingerprint.device_name == device_name).order_by(Fingerprint.id.desc())
    ).first()
    return DeviceRecord(device_name, fingerprint.device_type, fingerprint.device_memory_bytes)


def matmul_records(session: Session, device_name: str) -> list[MatmulRecord]:
    m = MatmulResult
    return [MatmulRecord(dtype, 2 * a * b * c * batch, tflop_per_s * 1e12)
            for dtype, a, b, c, batch, tflop_per_s in _rows(session, m, device_name, m.dtype, m.m, m.n, m.k, m.batch,
                                                            m.tflop_per_s)]


def attention_records(session: Session, device_name: str) -> list[AttentionRecord]:
    a = AttentionResult
    return [AttentionRecord(*row) for row in _rows(session, a, device_name, a.batch, a.seq_len, a.n_heads, a.head_dim,
                                                   a.forward_median_s, a.backward_median_s)]


def elementwise_records(session: Session, device_name: str) -> list[ElementwiseRecord]:
    e = ElementwiseResult
    return [ElementwiseRecord(op, gb_per_s * 1e9) for op, gb_per_s in _rows(session, e, device_name, e.op, e.gb_per_s)]


def collective_records(session: Session, device_name: str) -> list[CollectiveRecord]:
    c = CollectiveResult
    return [CollectiveRecord(*row) for row in _rows(session, c, device_name, c.op, c.group_size, c.message_bytes,
                                                    c.median_s)]


TRAIN_STEP_COLUMNS = (
    "model_name", "model_spec", "seq_len", "micro_batch", "accumulation_steps", "precision", "optimizer", "attention",
    "recompute", "median_s", "peak_allocated_bytes", "peak_reserved_bytes", "activation_bytes", "layout", "rank",
    "min_s", "max_s",
)


def train_step_records(session: Session, device_name: str) -> list[TrainStepRecord]:
    t = TrainStepResult
    # Dropout is not a column: it is read from the configuration the core's prediction was made for,
    # in SQL (a JSON path), so the prediction documents are not decoded.
    dropout = t.prediction[("config", "dropout")].as_float()
    busy = t.details[("host", "busy")].as_boolean()  # the agent's verdict on the host (NULL on older rows)
    columns = [getattr(t, name) for name in TRAIN_STEP_COLUMNS]
    return [
        TrainStepRecord(**dict(zip(TRAIN_STEP_COLUMNS, values, strict=True)), dropout=float(drop or 0.0),
                        communication_s=communication, busy=bool(flagged))
        for *values, drop, communication, flagged in _rows(session, t, device_name, *columns, dropout,
                                                           t.communication_median_s, busy)
    ]


def build_profile(session: Session, device_name: str, steps: list[TrainStepRecord] | None = None) -> HardwareProfile:
    """The device's profile from its stored measurements (core.measurements.profile_from_measurements);
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
