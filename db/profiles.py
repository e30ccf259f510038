"""A device's own measurements as the planner's HardwareProfile, and its calibration.

``measured_profile(name)`` looks for a device in the store whose name matches
``name`` (case-insensitive; exact first, else a unique substring) and builds:

- matmul throughput by dtype from its ``ok`` matmul rows (the median over
  runs of each shape, made non-decreasing in size), for interpolation over
  GEMM sizes;
- attention throughput and the backward/forward time ratio from its
  attention rows (the fastest backend at the largest measured shape);
- bandwidth from its best copy;
- allocator fragmentation, the median reserved / allocated of its training
  steps (CUDA only; the stated default otherwise);
- a calibration: each ``ok`` training step of the device predicted again by
  the current core with this profile, against what was measured.

Only datasheet peaks (for MFU) come from core.hardware. Figures the store
lacks fall back to the datasheet defaults, and the profile lists them as
assumptions.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from dataclasses import replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.calibration import Calibration, Observation, calibrate
from core.config import TrainConfig
from core.errors import ConfigError
from core.estimate import estimate
from core.flops import attention_forward_flops
from core.hardware import match_device
from core.model import ModelSpec
from core.recompute import parse_policy
from core.timing import DEFAULT_FRAGMENTATION, HardwareProfile, MatmulPoint, datasheet_profile, step_time
from db.location import ENV_VAR, STORE_FILENAME, data_dir
from db.models import AttentionResult, ElementwiseResult, Fingerprint, MatmulResult, Run, TrainStepResult
from db.store import open_store


def _device_names(session: Session) -> list[str]:
    return sorted(set(session.scalars(select(Fingerprint.device_name))))


def find_device(session: Session, name: str) -> str | None:
    """The stored device name that ``name`` means (``latest``: the last one measured), or None."""
    if name.strip().lower() == "latest":
        return session.scalars(
            select(Fingerprint.device_name).join(Run, Run.fingerprint_id == Fingerprint.id).order_by(Run.started_at.desc())
        ).first()
    names = _device_names(session)
    wanted = name.strip().lower()
    exact = [n for n in names if n.lower() == wanted]
    if exact:
        return exact[0]
    partial = [n for n in names if wanted in n.lower()]
    if len(partial) > 1:
        raise ConfigError(f"--hardware {name!r} matches several measured devices: {'; '.join(partial)}; give the full name")
    return partial[0] if partial else None


def _rows(session: Session, model, device_name: str):
    query = (
        select(model, Fingerprint.device_type, Fingerprint.device_memory_bytes)
        .join(Run, model.run_id == Run.id)
        .join(Fingerprint, Run.fingerprint_id == Fingerprint.id)
        .where(Fingerprint.device_name == device_name, model.status == "ok")
        .order_by(Run.started_at)
    )
    return session.execute(query).all()


def _matmul_points(session: Session, device_name: str) -> dict[str, tuple[MatmulPoint, ...]]:
    by_shape: dict[tuple[str, int], list[float]] = defaultdict(list)
    for row, *_ in _rows(session, MatmulResult, device_name):
        by_shape[(row.dtype, 2 * row.m * row.n * row.k * row.batch)].append(row.tflop_per_s * 1e12)
    points: dict[str, list[MatmulPoint]] = defaultdict(list)
    for (dtype, flops), rates in sorted(by_shape.items(), key=lambda kv: kv[0][1]):
        # A larger GEMM is not slower per FLOP than a smaller one the same box ran: a dip is
        # noise (a busy host, a cold clock), so the envelope carries the best rate seen so far.
        best = max(statistics.median(rates), points[dtype][-1].flop_per_s if points[dtype] else 0.0)
        points[dtype].append(MatmulPoint(float(flops), best))
    return {dtype: tuple(p) for dtype, p in points.items()}


def _attention(session: Session, device_name: str) -> tuple[float, float] | None:
    """(forward FLOP/s, backward / forward time) of the fastest backend at the largest shape."""
    rows = [r for r, *_ in _rows(session, AttentionResult, device_name) if r.forward_median_s]
    if not rows:
        return None
    def flops(r: AttentionResult) -> int:
        return attention_forward_flops(r.batch, r.seq_len, r.n_heads, r.head_dim)

    largest = max(flops(r) for r in rows)
    best = min((r for r in rows if flops(r) == largest), key=lambda r: r.forward_median_s)
    flop_per_s = largest / best.forward_median_s
    ratio = best.backward_median_s / best.forward_median_s if best.backward_median_s else None
    return flop_per_s, ratio


def _bandwidth(session: Session, device_name: str) -> float | None:
    copies = [r.gb_per_s for r, *_ in _rows(session, ElementwiseResult, device_name) if r.op == "copy"]
    return max(copies) * 1e9 if copies else None


def _train_rows(session: Session, device_name: str) -> list[TrainStepResult]:
    return [r for r, *_ in _rows(session, TrainStepResult, device_name)]


def build_profile(session: Session, device_name: str) -> HardwareProfile:
    fingerprint = session.scalars(
        select(Fingerprint).where(Fingerprint.device_name == device_name).order_by(Fingerprint.id.desc())
    ).first()
    device_type = fingerprint.device_type
    datasheet = match_device(device_name).spec if device_type == "cuda" else None
    assumptions = []
    matmul = _matmul_points(session, device_name)
    attention = _attention(session, device_name)
    bandwidth = _bandwidth(session, device_name)
    fallback = datasheet_profile(datasheet) if datasheet else None
    if not matmul:
        if fallback is None:
            raise ConfigError(f"{device_name} has no matmul measurements in the store and no datasheet row; "
                              "run `headroom agent run` on it")
        matmul = fallback.matmul
        assumptions.append(fallback.assumptions[0])
    if attention is None:
        rate = fallback.attention_flop_per_s if fallback else max(p.flop_per_s for ps in matmul.values() for p in ps) / 2
        attention = (rate, None)
        assumptions.append("attention at half the matmul rate (not measured)")
    if bandwidth is None:
        bandwidth = fallback.hbm_bytes_per_s if fallback else 10e9
        assumptions.append("bandwidth not measured")
    steps = _train_rows(session, device_name)
    ratios = [r.peak_reserved_bytes / r.peak_allocated_bytes for r in steps if r.peak_reserved_bytes and r.peak_allocated_bytes]
    fragmentation = statistics.median(ratios) if ratios else DEFAULT_FRAGMENTATION
    if not ratios:
        assumptions.append(f"allocator fragmentation {DEFAULT_FRAGMENTATION:.2f}x (no CUDA allocator statistics stored)")
    memory = fingerprint.device_memory_bytes or (datasheet.memory_bytes if datasheet else _host_memory())
    profile = HardwareProfile(
        name=device_name,
        source="measured",
        memory_bytes=memory,
        peak_flop_per_s=dict(datasheet.peak_flop_per_s) if datasheet else {},
        matmul=matmul,
        attention_flop_per_s=attention[0],
        hbm_bytes_per_s=bandwidth,
        fragmentation=fragmentation,
        device="cpu" if device_type == "cpu" else "cuda",
        assumptions=tuple(assumptions),
    )
    return replace(profile, attention_backward_ratio=attention[1]) if attention[1] else profile


def _host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def calibration_for(session: Session, device_name: str, profile: HardwareProfile) -> Calibration:
    """Each ok training step of the device, predicted again now, against what was measured.

    A fleet reruns the same configurations night after night: each distinct
    configuration is predicted once.
    """
    predictions: dict[tuple, tuple[int, int, float] | None] = {}
    observations = []
    for row in _train_rows(session, device_name):
        dropout = float((row.prediction or {}).get("config", {}).get("dropout", 0.0))
        key = (json.dumps(row.model_spec, sort_keys=True), row.seq_len, row.micro_batch, row.accumulation_steps,
               row.precision, row.optimizer, row.attention, row.recompute, dropout)
        if key not in predictions:
            predictions[key] = _predict(row, dropout, profile)
        if predictions[key] is None:
            continue  # a row from an older core whose spec or config no longer reads
        peak, activations, seconds = predictions[key]
        memory = (peak, row.peak_allocated_bytes) if row.peak_allocated_bytes else (activations, row.activation_bytes)
        observations.append(Observation(
            predicted_bytes=memory[0], measured_bytes=memory[1], predicted_s=seconds, measured_s=row.median_s,
            label=f"{row.model_name} micro {row.micro_batch} x{row.accumulation_steps} {row.recompute}",
        ))
    return calibrate(device_name, observations)


def _predict(row: TrainStepResult, dropout: float, profile: HardwareProfile) -> tuple[int, int, float] | None:
    """(peak bytes, saved-activation bytes, step seconds) the current core predicts for a stored step."""
    try:
        spec = ModelSpec(**row.model_spec)
        config = TrainConfig(seq_len=row.seq_len, micro_batch=row.micro_batch, precision=row.precision,
                             optimizer=row.optimizer, attention=row.attention,
                             recompute=parse_policy(row.recompute), dropout=dropout)
        predicted = estimate(spec, config, profile.device, row.accumulation_steps)
    except (ConfigError, TypeError):
        return None
    return predicted.peak_bytes, predicted.ledger.activation_bytes, step_time(predicted, profile, row.accumulation_steps).total_s


def measured_devices(url: str | None = None) -> list[str]:
    with open_store(url, mode="read") as store, store.session() as session:
        return _device_names(session)


def measured_profile(name: str, url: str | None) -> tuple[HardwareProfile, Calibration] | None:
    """The device named ``name`` as measured in the store, or None when the store has no such device.

    With no ``url`` and no HEADROOM_DB, a missing default store simply means
    nothing was measured yet; an explicit store that cannot be read is an error.
    """
    if url is None and ENV_VAR not in os.environ and not (data_dir() / STORE_FILENAME).exists():
        return None
    with open_store(url, mode="read") as store, store.session() as session:
        device_name = find_device(session, name)
        if device_name is None:
            return None
        profile = build_profile(session, device_name)
        return profile, calibration_for(session, device_name, profile)
