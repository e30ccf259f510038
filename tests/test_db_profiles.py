"""db/profiles.py: the aggregates SQL takes give the figures headroom.core.measured.measurements takes from every row.

The reference reads every ok row of the device with the ORM and hands it to
the core as one record per row (what db/profiles.py did before it
aggregated); the aggregates must give the same profile, exactly, on SQLite
and on PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select

import headroom.db.profiles as profiles
from headroom.core.measured.measurements import (
    AttentionRecord,
    DispatchRecord,
    ElementwiseRecord,
    MatmulRecord,
    attention_throughput,
    copy_bandwidth,
    matmul_curve,
    profile_from_measurements,
)
from headroom.core.timing.collective_curves import CollectiveCurves, CollectiveRecord
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
from headroom.db.profiles import (
    attention_records,
    build_profile,
    collective_records,
    device_record,
    dispatch_records,
    elementwise_records,
    matmul_records,
    train_step_records,
)
from headroom.db.store import open_store
from tests.db_support import LLAMA2_7B, fingerprint, postgres_url, sqlite_url, store_url  # noqa: F401

H100 = "NVIDIA H100 80GB HBM3"
START = datetime(2026, 11, 1, tzinfo=timezone.utc)


def _matmul(m: int, n: int, k: int, rate: float, dtype: str = "bf16", status: str = "ok") -> MatmulResult:
    timed = 2 * m * n * k / (rate * 1e12) if rate > 0 else 1.0
    return MatmulResult(dtype=dtype, m=m, n=n, k=k, samples_s=[timed], median_s=timed, min_s=timed, max_s=timed,
                        tflop_per_s=rate if status == "ok" else None, status=status,
                        message=None if status == "ok" else "cuBLAS error")


def _copy(rate: float, op: str = "copy") -> ElementwiseResult:
    return ElementwiseResult(op=op, dtype="fp32", elements=2**20, bytes_moved=2**23, samples_s=[1e-4], median_s=1e-4,
                             min_s=1e-4, max_s=1e-4, gb_per_s=rate)


def _attention(backend: str, seq_len: int, forward: float, backward: float | None) -> AttentionResult:
    return AttentionResult(backend=backend, dtype="bf16", batch=2, seq_len=seq_len, n_heads=16, n_kv_heads=16,
                           head_dim=128, causal=True, forward_samples_s=[forward], forward_median_s=forward,
                           backward_samples_s=[backward] if backward else [], backward_median_s=backward)


def _collective(op: str, group: int, size: int, seconds: float) -> CollectiveResult:
    return CollectiveResult(op=op, backend="nccl", dtype="bf16", group_size=group, message_bytes=size,
                            samples_s=[seconds], median_s=seconds, min_s=seconds, max_s=seconds,
                            algbw_gb_per_s=size / seconds / 1e9 if seconds else 0.0,
                            busbw_gb_per_s=size / seconds / 1e9 if seconds else 0.0)


def _dispatch(mode: str, per_op: float) -> DispatchResult:
    return DispatchResult(mode=mode, ops=256, samples_s=[per_op], median_s=per_op, min_s=per_op, max_s=per_op)


def _step(seconds: float, micro_batch: int = 1, status: str = "ok") -> TrainStepResult:
    ok = status == "ok"
    return TrainStepResult(model_name="llama2-7b", model_spec=LLAMA2_7B, seq_len=4096, micro_batch=micro_batch,
                           samples_s=[seconds] if ok else [], median_s=seconds if ok else None,
                           min_s=seconds if ok else None, max_s=seconds if ok else None,
                           tokens_per_s=4096 * micro_batch / seconds if ok else None,
                           peak_allocated_bytes=60_000_000_000 if ok else None,
                           peak_reserved_bytes=66_000_000_000 if ok else None, status=status,
                           message=None if ok else "CUDA out of memory")


# Runs of the H100, in time order; every group below has repeats, odd and even counts, ties and rows the core
# ignores (rates of 0, results in error, groups of one rank, another device's rows).
RUNS = [
    [_matmul(4096, 4096, 4096, 500.0), _matmul(4096, 4096, 4096, 610.5), _matmul(8192, 8192, 8192, 700.0),
     _matmul(8192, 2048, 1024, 640.0), _matmul(2048, 2048, 2048, 0.0), _matmul(4096, 4096, 4096, 0.0, status="error"),
     _matmul(4096, 4096, 4096, 40.0, dtype="fp32"), _copy(2000.0), _copy(3100.0, op="add"), _copy(0.0),
     _attention("flash", 4096, 2e-3, 5e-3), _attention("math", 4096, 9e-3, None), _attention("flash", 2048, 6e-4, 1e-3),
     _collective("all_reduce", 8, 2**20, 1e-4), _collective("all_reduce", 8, 2**20, 3e-4),
     _collective("all_gather", 8, 2**20, 2e-4), _collective("all_reduce", 1, 2**20, 5e-5),
     _collective("all_reduce", 8, 2**30, 0.0), _step(1.0), _dispatch("forward", 8e-6), _dispatch("backward", 5e-6),
     _dispatch("selective-checkpoint", 40e-6)],
    [_matmul(4096, 4096, 4096, 580.25), _matmul(8192, 8192, 8192, 720.0), _matmul(1024, 8192, 2048, 660.0),
     _matmul(4096, 4096, 4096, 40.0, dtype="fp32"), _copy(2100.0), _copy(2100.0),
     _attention("flash", 4096, 2e-3, 4e-3), _attention("cudnn", 2048, 6e-4, 2e-3),
     _collective("all_reduce", 8, 2**20, 2e-4), _collective("all_reduce", 8, 2**24, 1e-3), _step(1.1), _step(2.0, 2),
     _dispatch("forward", 10e-6), _dispatch("backward", 6e-6), _dispatch("selective-checkpoint", 50e-6)],
    [_matmul(4096, 4096, 4096, 590.0), _matmul(4096, 4096, 4096, 601.0), _matmul(8192, 8192, 8192, 715.5),
     _matmul(1024, 1024, 1024, 90.0), _copy(2050.0), _collective("all_reduce", 8, 2**20, 2.5e-4),
     _collective("all_reduce", 4, 2**20, 1e-4), _step(1.2), _step(9.0, 4, status="oom")],
    [_matmul(1024, 1024, 1024, 95.0)],  # the latest run measured no training step
]


def _record(store, device_name: str, runs: list[list]) -> None:
    for number, results in enumerate(runs):
        started = START + timedelta(days=number)
        run = store.start_run(fingerprint(device_name=device_name), suite="standard", benchmark_version="1",
                              started_at=started)
        for result in results:
            store.add_result(run, result)
        store.finish_run(run)


@pytest.fixture
def measured(store_url):  # noqa: F811
    with open_store(store_url, mode="write") as store:
        _record(store, H100, RUNS)
        _record(store, "NVIDIA A100-SXM4-80GB", [[_matmul(4096, 4096, 4096, 9999.0), _copy(9999.0),
                                                  _collective("all_reduce", 8, 2**20, 1e-9)]])
    with open_store(store_url) as store, store.session() as session:
        yield session


def _every_row(session, model):
    query = (select(model).join(Run, model.run_id == Run.id).join(Fingerprint, Run.fingerprint_id == Fingerprint.id)
             .where(Fingerprint.device_name == H100, model.status == "ok").order_by(Run.started_at, model.id))
    return session.scalars(query).all()


def _reference(session) -> dict:
    """One core record per stored row."""
    return {
        "matmul": [MatmulRecord(r.dtype, 2 * r.m * r.n * r.k * r.batch, r.tflop_per_s * 1e12)
                   for r in _every_row(session, MatmulResult)],
        "attention": [AttentionRecord(r.batch, r.seq_len, r.n_heads, r.head_dim, r.forward_median_s, r.backward_median_s)
                      for r in _every_row(session, AttentionResult)],
        "elementwise": [ElementwiseRecord(r.op, r.gb_per_s * 1e9) for r in _every_row(session, ElementwiseResult)],
        "collectives": [CollectiveRecord(r.op, r.group_size, r.message_bytes, r.median_s)
                        for r in _every_row(session, CollectiveResult)],
        "dispatch": [DispatchRecord(r.mode, r.median_s) for r in _every_row(session, DispatchResult)],
    }


def test_each_aggregate_gives_the_figure_the_core_takes_from_every_row(measured):
    every = _reference(measured)
    assert matmul_curve(matmul_records(measured, H100)) == matmul_curve(every["matmul"])
    assert attention_throughput(attention_records(measured, H100)) == attention_throughput(every["attention"])
    assert copy_bandwidth(elementwise_records(measured, H100)) == copy_bandwidth(every["elementwise"]) == 2100e9
    assert (CollectiveCurves.from_records(collective_records(measured, H100), "x")
            == CollectiveCurves.from_records(every["collectives"], "x"))


def test_the_profile_from_aggregates_is_the_profile_from_every_row(measured):
    every = _reference(measured)
    steps = train_step_records(measured, H100)
    from_rows = profile_from_measurements(device_record(measured, H100), matmul=every["matmul"],
                                          attention=every["attention"], elementwise=every["elementwise"],
                                          train_steps=steps, collectives=every["collectives"],
                                          dispatch=every["dispatch"])
    assert build_profile(measured, H100) == from_rows
    # The box's own host costs: each mode's median over its rows (two runs: the mean of the two).
    host = from_rows.host
    assert (host.forward_op_s, host.backward_op_s, host.selective_checkpoint_op_s) == pytest.approx((9e-6, 5.5e-6, 45e-6))
    assert host.source == f"measured on {H100}"
    assert {r.mode: r.per_op_s for r in dispatch_records(measured, H100)} == pytest.approx(
        {"backward": 5.5e-6, "forward": 9e-6, "selective-checkpoint": 45e-6})


def test_sql_hands_over_one_record_per_group(measured):
    # bf16: 4096^3 (5 ok rates > 0: the median 590.0), 8192^3 (3), 8192x2048x1024 and 1024x8192x2048 (one size
    # in FLOPs: the mean of 640 and 660), 1024^3 (2); fp32 4096^3 (2). Zero rates and failed rows are no rate.
    rates = {(r.dtype, r.flops): r.flop_per_s / 1e12 for r in matmul_records(measured, H100)}
    assert rates == {("bf16", 2 * 4096**3): 590.0, ("bf16", 2 * 8192**3): 715.5, ("bf16", 2 * 8192 * 2048 * 1024): 650.0,
                     ("bf16", 2 * 1024**3): 92.5, ("fp32", 2 * 4096**3): 40.0}
    assert [(r.seq_len, r.forward_s, r.backward_s) for r in attention_records(measured, H100)] == [
        (4096, 2e-3, 5e-3), (2048, 6e-4, 1e-3)]  # the first of two equally fast runs, with its own backward
    assert sorted((r.op, r.group_size, r.message_bytes, r.median_s) for r in collective_records(measured, H100)) == [
        ("all_gather", 8, 2**20, 2e-4), ("all_reduce", 4, 2**20, 1e-4), ("all_reduce", 8, 2**20, 2.25e-4),
        ("all_reduce", 8, 2**24, 1e-3)]


def test_each_kind_comes_from_the_latest_runs_that_recorded_it(measured, monkeypatch):
    assert [(s.micro_batch, s.median_s) for s in train_step_records(measured, H100)] == [(1, 1.0), (1, 1.1), (2, 2.0),
                                                                                          (1, 1.2)]
    monkeypatch.setattr(profiles, "PROFILE_RUNS", 2)
    # The last run has no training step and no collective: the two before it count for those.
    assert [(s.micro_batch, s.median_s) for s in train_step_records(measured, H100)] == [(1, 1.1), (2, 2.0), (1, 1.2)]
    assert sorted((r.op, r.group_size, r.message_bytes, r.median_s) for r in collective_records(measured, H100)) == [
        ("all_reduce", 4, 2**20, 1e-4), ("all_reduce", 8, 2**20, 2.25e-4), ("all_reduce", 8, 2**24, 1e-3)]
    # Matmuls: the last two runs; 1024^3 in both.
    assert {(r.dtype, r.flops): r.flop_per_s / 1e12 for r in matmul_records(measured, H100)} == {
        ("bf16", 2 * 4096**3): 595.5, ("bf16", 2 * 8192**3): 715.5, ("bf16", 2 * 1024**3): 92.5}


def test_a_device_the_store_never_measured_is_named_not_a_crash(measured):
    from headroom.core.errors import ConfigError

    with pytest.raises(ConfigError, match="NVIDIA B200 has no measurements in the store; run `headroom agent run` on it"):
        profiles.build_profile(measured, "NVIDIA B200")
