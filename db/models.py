"""The result store's tables, as SQLAlchemy 2 typed ORM classes.

One `Fingerprint` per distinct device + host + software stack (runs on the
same box with the same driver, CUDA and torch share it); one `Run` per
execution of a benchmark suite; one row per benchmark in the table of its kind
(`MatmulResult`, `ElementwiseResult`, `AttentionResult`, `TrainStepResult`,
`CollectiveResult`, `DispatchResult`).

Every result records ``status`` (``ok``, ``oom``, ``error``, ``skipped``)
and a ``message``: an out-of-memory benchmark is a result, not a crash
(docs/measurement.md), and so is a case the device cannot run, with the reason. Raw timing samples are kept as a JSON list next to their median,
min and max.

Units are in the names: ``_s`` seconds, ``_bytes`` bytes (ints),
``tflop_per_s`` 1e12 FLOP/s, ``gb_per_s`` 1e9 bytes/s. Times are
timezone-aware UTC.

Indexes serve the questions planners ask: results of one device
(``fingerprints.device_name``, ``runs.fingerprint_id``), of a time range
(``runs.started_at``) and of a software version (``fingerprints.driver_version``,
``cuda_version``, ``torch_version``).

The classes are dataclasses (``MappedAsDataclass``): the agent builds a result
with typed keyword arguments, ``MatmulResult(dtype="bf16", m=8192, ...)``, and
hands it to ``headroom.db.store.Store.add_result``. A change here needs a migration in
``db/migrations/versions`` (tests/test_db_migrations.py checks that the two
agree).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Double,
    Enum,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, MappedAsDataclass, mapped_column
from sqlalchemy.types import TypeDecorator

from headroom.core.specs.hardware import DTYPES
from headroom.core.specs.run_config import COLUMNS as RUN_COLUMNS
from headroom.core.specs.run_config import RECIPE_COLUMNS, RunConfig
from headroom.core.specs.stack import stack_name
from headroom.core.timing.collective_ops import OPS as COLLECTIVE_OPS

RUN_STATUSES: tuple[str, ...] = ("running", "completed", "failed", "aborted")
RESULT_STATUSES: tuple[str, ...] = ("ok", "oom", "error", "skipped")
DEVICE_TYPES: tuple[str, ...] = ("cuda", "cpu")
MATMUL_PRECISIONS: tuple[str, ...] = ("highest", "high", "medium")
"""``torch.get_float32_matmul_precision()`` values: whether fp32 matmuls may use tf32 or bf16."""

# Named constraints and indexes keep migrations reproducible on every backend
# (Alembic's SQLite batch mode recreates tables by constraint name).
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend.

    PostgreSQL stores ``timestamp with time zone``; SQLite has no time zones,
    so the value is stored as naive UTC and read back as aware UTC. A naive
    datetime is refused: its meaning depends on the writer's clock settings.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()}: give a timezone (UTC)")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


# JSON documents and lists; an absent document is SQL NULL, not the JSON text 'null'.
_JSON = JSON(none_as_null=True)


def _status(name: str, values: tuple[str, ...]) -> Enum:
    """A closed set of strings, enforced by a CHECK constraint (no native enum type to migrate)."""
    return Enum(*values, name=name, native_enum=False, create_constraint=True, length=16, validate_strings=True)


class Base(MappedAsDataclass, DeclarativeBase, kw_only=True):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    # SQLite's INTEGER is 64-bit and only an INTEGER primary key auto-increments.
    type_annotation_map = {
        int: BigInteger().with_variant(Integer(), "sqlite"),
        float: Double(),
        str: String(),
        datetime: UTCDateTime(),
    }


class Fingerprint(Base):
    """A device on a host with its software stack: what a measurement was made on.

    Rows are shared: ``digest`` (SHA-256 of every other field) makes a box
    that reruns the suite without changes point at the same row.
    """

    __tablename__ = "fingerprints"

    id: Mapped[int] = mapped_column(primary_key=True, init=False)
    digest: Mapped[str] = mapped_column(String(64), unique=True, init=False)
    """SHA-256 (hex) of the other fields; set by the store."""
    device_type: Mapped[str] = mapped_column(info={"choices": DEVICE_TYPES})
    """``cuda`` (NVIDIA or ROCm through torch.cuda) or ``cpu``; CPU results are never mixed with GPU ones."""
    device_name: Mapped[str] = mapped_column(index=True)
    """As torch reports it, e.g. "NVIDIA H100 80GB HBM3"; the CPU model for ``cpu``."""
    hostname: Mapped[str]
    python_version: Mapped[str]
    device_memory_bytes: Mapped[int | None] = mapped_column(default=None)
    """Total device memory, bytes."""
    sm_count: Mapped[int | None] = mapped_column(default=None)
    """Streaming multiprocessors (compute units on ROCm)."""
    compute_capability: Mapped[str | None] = mapped_column(default=None)
    """e.g. "9.0"."""
    form_factor: Mapped[str | None] = mapped_column(default=None)
    """e.g. "SXM", "PCIe", where knowable."""
    driver_version: Mapped[str | None] = mapped_column(default=None, index=True)
    cuda_version: Mapped[str | None] = mapped_column(default=None, index=True)
    torch_version: Mapped[str | None] = mapped_column(default=None, index=True)
    cpu_model: Mapped[str | None] = mapped_column(default=None)
    details: Mapped[dict[str, Any]] = mapped_column(_JSON, default_factory=dict)
    """Anything else read from the box: clocks, power limit, ECC mode."""


class Run(Base):
    """One execution of a benchmark suite on one device."""

    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_fingerprint_id_started_at", "fingerprint_id", "started_at"),)

    id: Mapped[int] = mapped_column(primary_key=True, init=False)
    uuid: Mapped[str] = mapped_column(String(36), unique=True)
    """The run's identity across stores: bundles and merges deduplicate by it."""
    fingerprint_id: Mapped[int] = mapped_column(ForeignKey("fingerprints.id"), init=False)
    suite: Mapped[str]
    """Which benchmark suite ran, e.g. "standard" or "quick"."""
    benchmark_version: Mapped[str]
    """Changes whenever a measurement method changes; compare like with like."""
    started_at: Mapped[datetime] = mapped_column(index=True, default_factory=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    status: Mapped[str] = mapped_column(_status("run_status", RUN_STATUSES), default="running", index=True)
    """``running`` until the writer finishes it; a writer killed mid-run leaves ``running`` (incomplete)."""
    labels: Mapped[dict[str, str]] = mapped_column(_JSON, default_factory=dict)
    """Free-form tags given by the operator, e.g. {"rack": "b7"}."""


class Result(Base):
    """Columns every benchmark result has. Subclasses name the fields an ``ok`` result must carry."""

    __abstract__ = True
    KIND: ClassVar[str]
    """The name of this result kind in bundles and in ``Store.add_result``."""
    OK_REQUIRES: ClassVar[tuple[str, ...]]

    # sort_order=-1: the shared columns come first in every result table.
    id: Mapped[int] = mapped_column(primary_key=True, init=False, sort_order=-1)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), init=False, sort_order=-1)
    status: Mapped[str] = mapped_column(_status("result_status", RESULT_STATUSES), default="ok", sort_order=-1)
    """``ok``; ``oom`` (out of memory: a result, not a crash); ``error``; ``skipped``: the case cannot
    run on this device or stack (fp8 before Hopper, an SDPA backend that refuses the shape)."""
    message: Mapped[str | None] = mapped_column(default=None, sort_order=-1)
    """Why a result is not ``ok`` (required for ``error`` and ``skipped``)."""
    recorded_at: Mapped[datetime] = mapped_column(default_factory=utcnow, sort_order=-1)
    details: Mapped[dict[str, Any] | None] = mapped_column(_JSON, default=None, sort_order=10)
    """How it was measured, beyond the columns (revision 0003; NULL on older rows): ``clocks`` (the GPU's
    SM and memory clocks and active throttle reasons when the timing ended), ``calls_per_sample`` (calls
    timed back to back in one sample), ``kernel`` (the attention op that actually ran), ``use_fast_accum``
    (fp8), ``phase_peak_bytes`` (a training step's peak allocated bytes in forward+backward and optimizer)."""


class TimedResult(Result):
    """A result timed as one operation repeated: its raw samples and their median, min and max."""

    __abstract__ = True

    samples_s: Mapped[list[float]] = mapped_column(_JSON, default_factory=list)
    """Every timed repetition, seconds (empty when the result is not ``ok``)."""
    median_s: Mapped[float | None] = mapped_column(default=None)
    min_s: Mapped[float | None] = mapped_column(default=None)
    max_s: Mapped[float | None] = mapped_column(default=None)


class MatmulResult(TimedResult):
    """(batch x) (m x k) @ (k x n) in one dtype: 2 m n k FLOPs per product."""

    __tablename__ = "matmul_results"
    # Covers "best ok TFLOP/s per device and dtype over a time range" without reading the table.
    __table_args__ = (
        Index("ix_matmul_results_run_id_dtype_status_tflop_per_s", "run_id", "dtype", "status", "tflop_per_s"),
    )
    KIND = "matmul"
    OK_REQUIRES = ("median_s", "tflop_per_s")

    dtype: Mapped[str] = mapped_column(info={"choices": DTYPES})
    m: Mapped[int]
    n: Mapped[int]
    k: Mapped[int]
    batch: Mapped[int] = mapped_column(default=1)
    precision: Mapped[str | None] = mapped_column(default=None, info={"choices": MATMUL_PRECISIONS})
    """``torch.get_float32_matmul_precision()`` while measuring."""
    tflop_per_s: Mapped[float | None] = mapped_column(default=None)
    """2 m n k x batch / median_s / 1e12."""
    peak_fraction: Mapped[float | None] = mapped_column(default=None)
    """tflop_per_s over the datasheet dense peak for this dtype; None when the device has no datasheet row."""


class ElementwiseResult(TimedResult):
    """A memory-bound op (copy, add, relu, gelu, ...): its achieved bandwidth."""

    __tablename__ = "elementwise_results"
    __table_args__ = (Index("ix_elementwise_results_run_id", "run_id"),)
    KIND = "elementwise"
    OK_REQUIRES = ("median_s", "gb_per_s")

    op: Mapped[str]
    dtype: Mapped[str] = mapped_column(info={"choices": DTYPES})
    elements: Mapped[int]
    bytes_moved: Mapped[int]
    """Bytes read plus bytes written per call (a copy counts twice)."""
    gb_per_s: Mapped[float | None] = mapped_column(default=None)
    """bytes_moved / median_s / 1e9."""


class AttentionResult(Result):
    """Scaled dot-product attention through one backend, forward and backward timed apart."""

    __tablename__ = "attention_results"
    __table_args__ = (Index("ix_attention_results_run_id", "run_id"),)
    KIND = "attention"
    OK_REQUIRES = ("forward_median_s",)

    backend: Mapped[str]
    """SDPA backend: flash, efficient, cudnn or math."""
    dtype: Mapped[str] = mapped_column(info={"choices": DTYPES})
    batch: Mapped[int]
    seq_len: Mapped[int]
    n_heads: Mapped[int]
    n_kv_heads: Mapped[int]
    head_dim: Mapped[int]
    causal: Mapped[bool]
    forward_samples_s: Mapped[list[float]] = mapped_column(_JSON, default_factory=list)
    forward_median_s: Mapped[float | None] = mapped_column(default=None)
    forward_min_s: Mapped[float | None] = mapped_column(default=None)
    forward_max_s: Mapped[float | None] = mapped_column(default=None)
    backward_samples_s: Mapped[list[float]] = mapped_column(_JSON, default_factory=list)
    """Empty when only the forward pass was measured."""
    backward_median_s: Mapped[float | None] = mapped_column(default=None)
    backward_min_s: Mapped[float | None] = mapped_column(default=None)
    backward_max_s: Mapped[float | None] = mapped_column(default=None)


class TrainStepResult(TimedResult):
    """One optimizer step of a real model (samples are step times), with the core's predictions."""

    __tablename__ = "train_step_results"
    __table_args__ = (Index("ix_train_step_results_run_id", "run_id"),)
    KIND = "train_step"
    OK_REQUIRES = ("median_s", "tokens_per_s")

    model_name: Mapped[str]
    model_spec: Mapped[dict[str, Any]] = mapped_column(_JSON)
    """headroom.core.specs.model.ModelSpec as a dict (dataclasses.asdict)."""
    seq_len: Mapped[int]
    micro_batch: Mapped[int]
    accumulation_steps: Mapped[int] = mapped_column(default=1)
    recompute: Mapped[str] = mapped_column(default="none")
    """Activation-checkpoint policy, as headroom.core.specs.recompute names it."""
    attention: Mapped[str] = mapped_column(default="flash")
    precision: Mapped[str] = mapped_column(default="amp-bf16")
    optimizer: Mapped[str] = mapped_column(default="adamw")
    tokens_per_s: Mapped[float | None] = mapped_column(default=None)
    mfu: Mapped[float | None] = mapped_column(default=None)
    """Model FLOPs / step time / dense datasheet peak (no recompute counted); None without a datasheet row."""
    hfu: Mapped[float | None] = mapped_column(default=None)
    """As ``mfu`` but counting the FLOPs the hardware ran, recompute included."""
    optimizer_median_s: Mapped[float | None] = mapped_column(default=None)
    """Median time of ``optimizer.step()`` and ``zero_grad()`` within a step, seconds."""
    peak_allocated_bytes: Mapped[int | None] = mapped_column(default=None)
    """torch.cuda.max_memory_allocated() at steady state (the second step or later)."""
    peak_reserved_bytes: Mapped[int | None] = mapped_column(default=None)
    activation_bytes: Mapped[int | None] = mapped_column(default=None)
    """Saved-for-backward bytes measured with saved_tensors_hooks, deduplicated by storage."""
    prediction: Mapped[dict[str, Any] | None] = mapped_column(_JSON, default=None)
    """The core's full prediction at measurement time: `headroom estimate --json`, plus ``step_time_s``."""
    # The predictions calibration compares with activation_bytes, peak_allocated_bytes and median_s
    # (revision 0002 promoted them out of ``prediction``).
    predicted_peak_bytes: Mapped[int | None] = mapped_column(default=None)
    predicted_activation_bytes: Mapped[int | None] = mapped_column(default=None)
    predicted_step_time_s: Mapped[float | None] = mapped_column(default=None)
    # One row per rank of a multi-rank step (revision 0004); a one-device step is rank 0 of 1.
    rank: Mapped[int] = mapped_column(default=0, server_default="0")
    """This row's global rank."""
    world_size: Mapped[int] = mapped_column(default=1, server_default="1")
    """Ranks that trained the step together, one process each."""
    layout: Mapped[dict[str, Any] | None] = mapped_column(_JSON, default=None)
    """headroom.core.specs.layout.Layout as a dict (tp, sp, pp, schedule, virtual_stages, cp, dp, zero, ep); None on one device."""
    communication_median_s: Mapped[float | None] = mapped_column(default=None)
    """Median exposed communication within a step on this rank: the time it waited for collectives, seconds."""
    predicted_communication_s: Mapped[float | None] = mapped_column(default=None)
    """The core's exposed communication per step (headroom.core.timing.step.StepTime.communication_s)."""
    # The recipe beyond the precision (revision 0007): a step stored before it ran neither.
    fp8: Mapped[str] = mapped_column(default="off", server_default="off")
    """The FP8 recipe of its linears (headroom.core.specs.float8), or ``off``."""
    compile: Mapped[bool] = mapped_column(default=False, server_default=false())
    """Its blocks compiled with torch.compile (headroom.agent.compiled)."""

    @property
    def run_config(self) -> RunConfig:
        """The configuration the step ran: its columns, the layout, and the dropout and stack its prediction was
        made for (as headroom.db.profiles.train_step_records reads them). ConfigError where today's core cannot
        read it."""
        said = (self.prediction or {}).get("config") or {}
        return RunConfig.from_columns({key: getattr(self, key) for key in (*RUN_COLUMNS, *RECIPE_COLUMNS)},
                                      dropout=float(said.get("dropout") or 0.0),
                                      stack=stack_name(said.get("stack") or "reference"), layout=self.layout)


class CollectiveResult(TimedResult):
    """One collective over a group of local ranks (samples: seconds per call, the slowest rank's).

    Bandwidths follow nccl-tests (doc/PERFORMANCE.md): ``algbw`` is the message
    size over the time, ``busbw`` is ``algbw`` times the op's bus factor
    (all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n;
    send/recv 1), comparable with the link's per-direction bandwidth.
    """

    __tablename__ = "collective_results"
    __table_args__ = (Index("ix_collective_results_run_id_op_group_size", "run_id", "op", "group_size"),)
    KIND = "collective"
    OK_REQUIRES = ("median_s", "algbw_gb_per_s", "busbw_gb_per_s")

    op: Mapped[str] = mapped_column(info={"choices": COLLECTIVE_OPS})
    backend: Mapped[str]
    """torch.distributed backend: nccl or gloo."""
    dtype: Mapped[str] = mapped_column(info={"choices": DTYPES})
    group_size: Mapped[int]
    """Ranks in the collective (one process per device)."""
    message_bytes: Mapped[int]
    """nccl-tests' S: the whole buffer (all-gather: the gathered output; reduce-scatter: the full input)."""
    algbw_gb_per_s: Mapped[float | None] = mapped_column(default=None)
    """message_bytes / median_s / 1e9."""
    busbw_gb_per_s: Mapped[float | None] = mapped_column(default=None)
    """algbw_gb_per_s x the op's bus factor."""


DISPATCH_MODES = ("forward", "backward", "selective-checkpoint")


class DispatchResult(TimedResult):
    """What the host pays to dispatch one op of eager PyTorch (samples: seconds per op; headroom.agent.bench_dispatch).

    ``forward``: a forward op autograd records; ``backward``: a backward kernel; ``selective-checkpoint``: what a
    selective-checkpoint context adds to a forward op (revision 0006).
    """

    __tablename__ = "dispatch_results"
    __table_args__ = (Index("ix_dispatch_results_run_id", "run_id"),)
    KIND = "dispatch"
    OK_REQUIRES = ("median_s",)

    mode: Mapped[str] = mapped_column(info={"choices": DISPATCH_MODES})
    ops: Mapped[int]
    """Ops dispatched in one sample."""


RESULT_MODELS: dict[str, type[Result]] = {
    model.KIND: model
    for model in (MatmulResult, ElementwiseResult, AttentionResult, TrainStepResult, CollectiveResult, DispatchResult)
}
