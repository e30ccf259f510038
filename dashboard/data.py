"""Cached, read-only queries of the result store, as pandas DataFrames.

Every function takes the store URL, so the cache keys on it. The store is
opened once per URL (`store`, a cached resource) in read mode: it never
migrates and its engine cannot write (headroom.db.engine). Query results are cached
on the store's version as well (`store_version`: the newest row id of every
table and the runs still running, a few index lookups), so a page's second
visit costs those lookups and a box's new run or result shows on the next
one; ``TTL_S`` only bounds how long an unused result stays in memory
(benchmarks/bench_dashboard.py times every page with 10,000 runs).

Only ``ok`` results are returned; units are as in headroom.db.models (``tflop_per_s``
1e12 FLOP/s, ``gb_per_s`` 1e9 bytes/s, ``_bytes`` bytes, ``_s`` seconds).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import streamlit as st
from sqlalchemy import String, cast, func, select

from headroom.core.measured.calibration import Calibration
from headroom.core.timing.step import HardwareProfile
from headroom.dashboard.planning import DATASHEET_PREFIX, MEASURED_PREFIX
from headroom.db.errors import OutdatedStoreError, StoreError
from headroom.db.hardware import resolve_hardware
from headroom.db.location import resolve_url
from headroom.db.models import (
    RESULT_MODELS,
    AttentionResult,
    ElementwiseResult,
    Fingerprint,
    MatmulResult,
    Run,
    TrainStepResult,
)
from headroom.db.profiles import device_names
from headroom.db.store import Store, open_store

TTL_S = 3600
MAX_ENTRIES = 64


@dataclass(frozen=True, slots=True)
class StoreState:
    """What the dashboard can read: ``ok``, ``missing`` (nothing recorded), ``outdated`` or ``error``."""

    url: str
    status: str
    message: str = ""
    upgrade_command: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def store_url() -> str:
    """The store the dashboard reads: ``HEADROOM_DB`` (set by ``headroom dashboard --db``), else the default file."""
    return resolve_url(None)


@st.cache_resource(max_entries=8)
def store(url: str) -> Store:
    """One read-only Store (engine and pool) per URL for the server's life, its file checked whole when opened
    (Store.verify, SQLite's quick_check: every page read once, ~0.1 s for 57 MB). Raises StoreError.

    A query meets damage only in the pages it reads: without the check, the Plan page planned on a store
    damaged in its fingerprints' pages without a word, while History stopped with a traceback. Every page
    now says the same (headroom.dashboard.notices); damage that appears while the server runs is met by the queries,
    and headroom.dashboard.app shows it the same way."""
    opened = open_store(url, mode="read")
    try:
        opened.verify()
    except BaseException:
        opened.close()
        raise
    return opened


def store_state(url: str) -> StoreState:
    """Open the store if possible and say why not otherwise (never raises for a store problem)."""
    try:
        store(url)
    except OutdatedStoreError as err:
        return StoreState(url, "outdated", str(err), err.upgrade_command)
    except StoreError as err:
        text = str(err)
        missing = "no result store at" in text or "is empty" in text
        return StoreState(url, "missing" if missing else "error", text)
    return StoreState(url, "ok")


def store_version(url: str) -> tuple:
    """What changes whenever the store gains a run or a result or a run finishes: the largest id of
    every table and the count of runs still running."""
    newest = [select(func.max(model.id)).scalar_subquery() for model in (Run, *RESULT_MODELS.values())]
    running = select(func.count()).select_from(Run).where(Run.status == "running").scalar_subquery()
    with store(url).engine.connect() as connection:
        return tuple(connection.execute(select(*newest, running)).one())


_QUERIES: dict[str, Callable] = {}


@st.cache_data(ttl=TTL_S, max_entries=MAX_ENTRIES, show_spinner=False)
def _cached(name: str, url: str, version: tuple, *args):
    return _QUERIES[name](url, *args)


def _by_version(query: Callable) -> Callable:
    """Cache ``query(url, *args)`` on its arguments and the store's version (one cache for them all,
    keyed by the query's name: Streamlit keys a cached function by its source, which wrappers share)."""
    _QUERIES[query.__name__] = query

    @functools.wraps(query)
    def call(url: str, *args):
        return _cached(query.__name__, url, store_version(url), *args)

    return call


def _frame(url: str, query) -> pd.DataFrame:
    """The rows of a Core query as a DataFrame: read through a plain connection, no ORM objects built."""
    with store(url).engine.connect() as connection:
        result = connection.execute(query)
        # Plain tuples: a Row with a column named "dtype" would look array-like to pandas.
        return pd.DataFrame.from_records([tuple(row) for row in result], columns=list(result.keys()))


def _with_run(model, *columns, device: str | None = None):
    """Select ok result columns with the run's and the device's identity, of one device or all."""
    query = (
        select(Run.id.label("run_id"), Run.uuid, Run.started_at, Fingerprint.device_name, Fingerprint.hostname,
               Fingerprint.device_type, *columns)
        .join(Run, model.run_id == Run.id)
        .join(Fingerprint, Run.fingerprint_id == Fingerprint.id)
        .where(model.status == "ok")
    )
    return query if device is None else query.where(Fingerprint.device_name == device)


@_by_version
def devices(url: str, device_type: str | None = None) -> list[str]:
    """Measured device names, sorted; of one device type where given (``cuda``: the Plan page starts on the
    first GPU)."""
    with store(url).session() as session:
        return device_names(session, device_type)


@_by_version
def runs(url: str) -> pd.DataFrame:
    """One row per run: identity, device, software stack, status; newest first."""
    query = (
        select(Run.id.label("run_id"), Run.uuid, Run.suite, Run.benchmark_version, Run.status, Run.started_at,
               Run.finished_at, Fingerprint.device_name, Fingerprint.device_type, Fingerprint.hostname,
               Fingerprint.driver_version, Fingerprint.cuda_version, Fingerprint.torch_version)
        .join(Fingerprint, Run.fingerprint_id == Fingerprint.id)
        .order_by(Run.started_at.desc())
    )
    return _frame(url, query)


@_by_version
def matmul(url: str, device: str | None = None) -> pd.DataFrame:
    """ok matmul results (of one device, or all), with ``flops`` = 2 m n k x batch."""
    m = MatmulResult
    query = _with_run(m, m.dtype, m.m, m.n, m.k, m.batch, m.median_s, m.tflop_per_s, m.peak_fraction,
                      device=device)
    frame = _frame(url, query)
    frame["flops"] = 2.0 * frame["m"] * frame["n"] * frame["k"] * frame["batch"]
    return frame


@_by_version
def elementwise(url: str, device: str | None = None) -> pd.DataFrame:
    """ok elementwise results: op, dtype, elements, bytes_moved, median_s, gb_per_s."""
    e = ElementwiseResult
    query = _with_run(e, e.op, e.dtype, e.elements, e.bytes_moved, e.median_s, e.gb_per_s, device=device)
    return _frame(url, query)


@_by_version
def attention(url: str, device: str | None = None) -> pd.DataFrame:
    """ok attention results (forward and backward medians, seconds)."""
    a = AttentionResult
    query = _with_run(a, a.backend, a.dtype, a.batch, a.seq_len, a.n_heads, a.n_kv_heads, a.head_dim, a.causal,
                      a.forward_median_s, a.backward_median_s, device=device)
    return _frame(url, query)


@_by_version
def train_steps(url: str, device: str | None = None) -> pd.DataFrame:
    """ok training steps with what was measured (the step time's median, fastest and slowest repetition, and
    ``host_busy``, the agent's verdict on the host) and what the core predicted at measurement time."""
    t = TrainStepResult
    # As headroom.db.profiles reads them: the host's verdict, and the dropout and stack the prediction was made for
    # (NULL on older rows); the layout as its JSON text (NULL on one device), decoded only where a page needs it.
    busy = t.details[("host", "busy")].as_boolean().label("host_busy")
    dropout = t.prediction[("config", "dropout")].as_float().label("dropout")
    stack = t.prediction[("config", "stack")].as_string().label("stack")
    query = _with_run(t, t.model_name, t.seq_len, t.micro_batch, t.accumulation_steps, t.recompute, t.attention,
                      t.precision, t.optimizer, t.fp8, t.compile, dropout, stack, cast(t.layout, String).label("layout"),
                      t.median_s, t.min_s, t.max_s, busy, t.tokens_per_s, t.mfu,
                      t.peak_allocated_bytes, t.peak_reserved_bytes, t.activation_bytes, t.predicted_peak_bytes,
                      t.predicted_activation_bytes, t.predicted_step_time_s, device=device)
    return _frame(url, query)


@_by_version
def measured(url: str, device: str) -> tuple[HardwareProfile, Calibration]:
    """The device's measured HardwareProfile and its calibration (headroom.db.hardware.resolve_hardware, from the store only)."""
    return resolve_hardware(device, url, source="measured", store=store(url))


def hardware(url: str, option: str) -> tuple[HardwareProfile, Calibration | None]:
    """A Plan-page hardware option: "measured: NAME" from the store (cached), "datasheet: KEY" from the table.

    The same resolution as ``headroom plan --hardware`` (headroom.db.hardware), told
    which source the option names. ConfigError when it names nothing known.
    """
    if option.startswith(MEASURED_PREFIX):
        return measured(url, option.removeprefix(MEASURED_PREFIX))
    return resolve_hardware(option.removeprefix(DATASHEET_PREFIX), source="datasheet")


@_by_version
def key_figures(url: str) -> pd.DataFrame:
    """headroom.dashboard.history.key_figures over the whole store (one row per run), cached: the History page's base.

    The best matmul rate per run and dtype and the best copy bandwidth per run are taken in SQL
    (GROUP BY): a run's figure is the maximum of its rows, so the database hands over one row per
    run instead of every result."""
    from headroom.dashboard.history import MATMUL_DTYPES
    from headroom.dashboard.history import key_figures as compute

    m, e = MatmulResult, ElementwiseResult
    best_matmul = (select(m.run_id, m.dtype, func.max(m.tflop_per_s).label("tflop_per_s"))
                   .where(m.status == "ok", m.dtype.in_(MATMUL_DTYPES)).group_by(m.run_id, m.dtype))
    best_copy = (select(e.run_id, e.op, func.max(e.gb_per_s).label("gb_per_s"))
                 .where(e.status == "ok", e.op == "copy").group_by(e.run_id, e.op))
    return compute(runs(url), _frame(url, best_matmul), _frame(url, best_copy), train_steps(url))
