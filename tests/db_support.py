"""Shared by tests/test_db_*.py: sample records, and fresh SQLite and PostgreSQL stores.

PostgreSQL: each test that asks for ``postgres_url`` gets a new, uniquely
named database on the server at ``HEADROOM_TEST_POSTGRES`` (default
postgresql+psycopg://postgres@127.0.0.1:5432/test), dropped afterwards. When
no server answers the test is skipped, unless ``CI`` is set: CI runs
PostgreSQL, so there a missing server fails.
"""

from __future__ import annotations

import os
import random
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.exc import OperationalError

from headroom.core.specs.presets import get_preset
from headroom.db.models import (
    RESULT_MODELS,
    AttentionResult,
    CollectiveResult,
    DispatchResult,
    ElementwiseResult,
    Fingerprint,
    MatmulResult,
    Run,
    TrainStepResult,
)
from headroom.db.store import Store, open_store

PG_ADMIN_URL = os.environ.get("HEADROOM_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
WRITER = Path(__file__).with_name("db_writer.py")
LLAMA2_7B = get_preset("llama2-7b").to_dict()
"""A training step's model as the agent stores it (every field of headroom.core.specs.model.ModelSpec)."""


def fingerprint(**fields) -> Fingerprint:
    base = dict(device_type="cuda", device_name="NVIDIA H100 80GB HBM3", hostname="gpu-07", python_version="3.11.7",
                device_memory_bytes=85_520_809_984, sm_count=132, compute_capability="9.0", form_factor="SXM",
                driver_version="550.54.15", cuda_version="12.4", torch_version="2.13.0", cpu_model="AMD EPYC 9454",
                details={"max_sm_clock_mhz": 1980, "power_limit_w": 700.0})
    return Fingerprint(**base | fields)


def results(seed: int = 0) -> list:
    """One result of each kind, with values that differ by ``seed``."""
    samples = [1e-3 + seed * 1e-6 + i * 1e-5 for i in range(5)]
    return [
        MatmulResult(dtype="bf16", m=8192, n=8192, k=8192, precision="high", samples_s=samples,
                     median_s=samples[2], min_s=samples[0], max_s=samples[-1],
                     tflop_per_s=2 * 8192**3 / samples[2] / 1e12, peak_fraction=0.71),
        ElementwiseResult(op="copy", dtype="fp32", elements=2**28, bytes_moved=2 * 4 * 2**28, samples_s=samples,
                          median_s=samples[2], min_s=samples[0], max_s=samples[-1], gb_per_s=2147.5 + seed),
        AttentionResult(backend="flash", dtype="bf16", batch=4, seq_len=4096, n_heads=32, n_kv_heads=8, head_dim=128,
                        causal=True, forward_samples_s=samples, forward_median_s=samples[2],
                        backward_samples_s=[], status="ok"),
        TrainStepResult(model_name="llama2-7b", model_spec=LLAMA2_7B, seq_len=4096,
                        micro_batch=1, status="oom", message="CUDA out of memory. Tried to allocate 2.00 GiB",
                        prediction={"memory_bytes": {"peak": 123_456_789_012 + seed, "activations": 9_876_543_210}},
                        predicted_peak_bytes=123_456_789_012 + seed, predicted_activation_bytes=9_876_543_210),
        CollectiveResult(op="all_reduce", backend="nccl", dtype="bf16", group_size=8, message_bytes=2**30,
                         samples_s=samples, median_s=samples[2], min_s=samples[0], max_s=samples[-1],
                         algbw_gb_per_s=2**30 / samples[2] / 1e9, busbw_gb_per_s=2**30 / samples[2] / 1e9 * 1.75),
        DispatchResult(mode="forward", ops=256, samples_s=[s / 100 for s in samples], median_s=samples[2] / 100,
                       min_s=samples[0] / 100, max_s=samples[-1] / 100),
    ]


def record_run(store: Store, seed: int = 0, **fingerprint_fields) -> str:
    """A completed run with one result of each kind; returns its id."""
    with store.recording(fingerprint(**fingerprint_fields), suite="standard", benchmark_version="1",
                         labels={"rack": "b7"}) as run_id:
        for result in results(seed):
            store.add_result(run_id, result)
    return run_id


def row_counts(store: Store) -> dict[str, int]:
    with store.session() as session:
        return {model.__tablename__: session.scalar(select(func.count()).select_from(model))
                for model in (Fingerprint, Run, *RESULT_MODELS.values())}


def sqlite_integrity(path: Path) -> list[str]:
    """``PRAGMA integrity_check`` rows ("ok" when sound) plus any foreign-key violations."""
    with sqlite3.connect(path) as connection:
        rows = [r[0] for r in connection.execute("PRAGMA integrity_check")]
        rows += [f"foreign key: {r}" for r in connection.execute("PRAGMA foreign_key_check")]
    return rows


def file_state(path: Path) -> tuple[bytes, list[str]]:
    """A file's bytes and the names in its directory: a refused store must leave both alone."""
    return path.read_bytes(), sorted(p.name for p in path.parent.iterdir())


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'results.db'}"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    try:
        with admin.connect() as connection:
            connection.execute(text("SELECT 1"))
    except OperationalError as err:
        admin.dispose()
        message = f"no PostgreSQL answers at {PG_ADMIN_URL} ({str(err.orig).strip().splitlines()[0]})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must run PostgreSQL tests")
        pytest.skip(f"{message}; CI runs these tests, or set HEADROOM_TEST_POSTGRES")
    name = f"headroom_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin.url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def fleet(tmp_path: Path) -> str:
    """A destination store that already holds one run."""
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(url, mode="write") as store:
        record_run(store, seed=7, hostname="fleet-1")
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request) -> str:
    """A fresh store URL on each backend in turn."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "postgres_url")


DAMAGE_AT = 12288
"""Pages 4 and 5 of a store (4 KiB pages): the fingerprints table and its unique index, which every reader and
writer of runs uses. A store with one run already has 40 pages (the schema's)."""
DAMAGE = random.Random(DAMAGE_AT).randbytes(8192)


def one_run_store(path: Path) -> Path:
    """A SQLite store at ``path`` holding one recorded run."""
    from headroom.db.store import open_store

    with open_store(str(path), mode="write") as store:
        record_run(store)
    return path


def damaged_bytes(store: Path) -> bytes:
    """``store``'s file with pages 4 and 5 overwritten by random bytes: a store damaged inside."""
    data = bytearray(store.read_bytes())
    data[DAMAGE_AT:DAMAGE_AT + len(DAMAGE)] = DAMAGE
    return bytes(data)
