"""Check one record against its table before anything is written.

The writer API and bundle import share these checks, driven by the ORM
columns in headroom.db.models: a field the table does not have, a missing required
field, a value of the wrong type, a non-finite number, a string outside its
column's ``info["choices"]``, an ``ok`` result without its measurements, a
negative time or rate, an integer beyond 64 bits, text holding a NUL or a
lone surrogate (neither SQLite nor PostgreSQL round-trips them), a name
longer than headroom.core.safe_text allows or holding a line break, control or
bidirectional formatting character (a message may break lines), a run that
finished before it started, a size that must count at least one (a matmul's m, n, k, a
sequence, a group of ranks: `AT_LEAST_ONE`), timing statistics out of order
(min <= median <= max), a training step whose model spec the core refuses. Every error names the record, the field and what would be valid, so
a bad bundle can be fixed by hand; SQLite and PostgreSQL get the same checks.

Timestamps may arrive as datetimes or ISO 8601 strings (bundles); both must
carry a time zone.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, Boolean, Column, Double, Enum, Integer, String

from headroom.core.safe_text import MAX_LABELS, text_problem, unstorable
from headroom.db.errors import StoreError
from headroom.db.models import Base, Result, UTCDateTime

# Columns the store fills in itself: surrogate keys, links and the fingerprint digest.
INTERNAL = frozenset({"id", "run_id", "fingerprint_id", "digest"})


def data_columns(model: type[Base]) -> list[Column]:
    """The columns a record of ``model`` carries, in table order."""
    return list(_schema(model).columns)


def record_values(record: Base) -> dict[str, Any]:
    """An ORM object's data fields as a plain dict."""
    return {key: getattr(record, key) for key in _schema(type(record)).keys}


@dataclass(frozen=True)
class _Schema:
    """What checking a record of one table needs, worked out once per table."""

    columns: tuple[Column, ...]
    keys: tuple[str, ...]
    required: tuple[str, ...]
    defaults: dict[str, Any]
    """Immutable defaults of the optional fields."""
    factories: dict[str, Callable[[], Any]]
    """Default factories of the optional fields (a fresh list, dict or time for each record)."""


@functools.cache
def _schema(model: type[Base]) -> _Schema:
    columns = tuple(c for c in model.__table__.columns if c.key not in INTERNAL)
    keys = tuple(c.key for c in columns)
    by_name = {f.name: f for f in fields(model) if f.name in keys}
    required = tuple(f.name for f in fields(model) if f.init and f.default is MISSING and f.default_factory is MISSING)
    # The ORM holds a column's default itself (the dataclass field's is a marker): read it off a record.
    template = model(**dict.fromkeys(required))
    return _Schema(
        columns=columns, keys=keys, required=required,
        defaults={n: getattr(template, n) for n, f in by_name.items() if f.default is not MISSING},
        factories={n: f.default_factory for n, f in by_name.items() if f.default_factory is not MISSING},
    )


def complete(model: type[Base], values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every field of ``model`` the record leaves out at its default, in table order: the
    fields ``model(**values)`` would hold, without building the ORM object."""
    schema = _schema(model)
    return {key: values[key] if key in values else
            schema.defaults[key] if key in schema.defaults else schema.factories[key]()
            for key in schema.keys}


def check_record(model: type[Base], values: Mapping[str, Any], where: str, error: type[StoreError] = StoreError) -> dict[str, Any]:
    """Return ``values`` checked and normalised for ``model``'s table; raise ``error`` naming ``where``.

    Optional fields left out take their defaults, so the result is the
    complete row.
    """
    if not isinstance(values, Mapping):
        raise error(f"{where}: expected an object of fields, got {type(values).__name__}")
    schema = _schema(model)
    unknown = sorted(set(values).difference(schema.keys))
    if unknown:
        raise error(f"{where}: unknown field {unknown[0]!r}; valid fields: {', '.join(schema.keys)}")
    missing = [name for name in schema.required if name not in values]
    if missing:
        raise error(f"{where}: missing field {missing[0]!r} (required: {', '.join(schema.required)})")
    row = complete(model, values)
    for column in schema.columns:
        value = row[column.key]
        if value is None:
            if not column.nullable:
                raise error(f"{where}: field {column.key!r} must not be null")
            continue
        problem = _type_problem(column, value)
        if problem:
            raise error(f"{where}: field {column.key!r} {problem}, got {_shown(value)}")
        row[column.key] = _normalise(column, value)
    if issubclass(model, Result):
        _check_status(model, row, where, error)
        _check_measured(row, where, error)
    if row.get("started_at") and row.get("finished_at") and row["finished_at"] < row["started_at"]:
        raise error(f"{where}: finished_at {row['finished_at'].isoformat()} is before started_at "
                    f"{row['started_at'].isoformat()}")
    if model.__tablename__ == "train_step_results":
        _check_model_spec(row["model_spec"], where, error)
    return row


def _shown(value: Any) -> str:
    """The start of ``value``'s repr, as an error quotes it (an integer too long to print is named by its size)."""
    if isinstance(value, int) and value.bit_length() > 10_000:
        return f"an integer of about {int(value.bit_length() * math.log10(2)):,} digits"
    return f"{value!r:.80}"


AT_LEAST_ONE = frozenset({"m", "n", "k", "batch", "elements", "bytes_moved", "seq_len", "n_heads", "n_kv_heads",
                          "head_dim", "micro_batch", "accumulation_steps", "group_size", "message_bytes", "ops"})
"""Result fields that count things a measurement ran on, none of which is measured at zero."""
TIMING_PREFIXES = ("", "forward_", "backward_")
"""The prefixes of a result's ``min_s``, ``median_s`` and ``max_s`` columns."""

MAX_INTEGER = 2**63 - 1
"""The largest integer both stores hold (SQLite INTEGER, PostgreSQL BIGINT)."""


def _check_model_spec(spec: Any, where: str, error: type[StoreError]) -> None:
    """A training step's model is one the core accepts: a row it refuses would stop every plan on the store."""
    from headroom.core.errors import ConfigError
    from headroom.core.specs.model import ModelSpec

    try:
        ModelSpec(**spec)
    except (ConfigError, TypeError) as err:
        raise error(f"{where}: field 'model_spec' is not a model the core accepts: {err}") from None


def _type_problem(column: Column, value: Any) -> str | None:
    """Why ``value`` cannot go into ``column``, or None when it can."""
    kind = column.type
    if isinstance(kind, Integer):
        if isinstance(value, bool) or not isinstance(value, int):
            return "must be an integer"
        if value < 0:
            return "must not be negative"
        if value > MAX_INTEGER:
            return f"must be at most {MAX_INTEGER:,} (64 bits)"
    elif isinstance(kind, Double):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
            return "must be a finite number"
        if value < 0:
            return "must not be negative (every stored time, rate and fraction is)"
    elif isinstance(kind, Boolean):
        if not isinstance(value, bool):
            return "must be true or false"
    elif isinstance(kind, (String, Enum)):
        if not isinstance(value, str) or not value:
            return "must be a non-empty string"
        choices = kind.enums if isinstance(kind, Enum) else column.info.get("choices")
        if choices and value not in choices:
            return f"must be one of {', '.join(choices)}"
        if kind.length and len(value) > kind.length:
            return f"must be at most {kind.length} characters"
        return text_problem(value, message=column.key == "message")
    elif isinstance(kind, UTCDateTime):
        return _time_problem(value)
    elif isinstance(kind, JSON):
        return _json_problem(column, value)
    return None


def _finite(value: int | float) -> bool:
    """Whether ``value`` is a finite number a float holds (an integer of 400 digits is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _time_problem(value: Any) -> str | None:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return "must be an ISO 8601 time such as 2025-01-31T12:00:00+00:00"
    if not isinstance(value, datetime):
        return "must be a time"
    if value.tzinfo is None:
        return "must carry a time zone (e.g. +00:00)"
    try:
        value.astimezone(timezone.utc)  # how the store keeps it
    except OverflowError:
        return "must fall between years 1 and 9999 in UTC"
    return None


def _json_problem(column: Column, value: Any) -> str | None:
    if column.key.endswith("samples_s"):
        if not isinstance(value, list) or not _seconds(value):
            return "must be a list of non-negative finite numbers (seconds)"
        return None
    if not isinstance(value, dict):
        return "must be an object"
    if column.key == "labels":
        return _labels_problem(value)
    return _document_problem(value)


def _labels_problem(labels: dict) -> str | None:
    """Why a run's labels cannot be stored: each key and value is a name (headroom.core.safe_text)."""
    if len(labels) > MAX_LABELS:
        return f"must hold at most {MAX_LABELS} labels (it has {len(labels):,})"
    for key, value in labels.items():
        if not isinstance(value, str):
            return "must map names to strings"
        if problem := text_problem(key) or text_problem(value):
            return f"{problem} in label {key[:40]!r}"
    return None


def _seconds(values: list) -> bool:
    """Whether every item is a non-negative finite number (not a bool) a float can hold."""
    try:
        if set(map(type, values)) <= {float, int}:  # the usual case, checked at C speed
            return all(map(math.isfinite, values)) and (not values or min(values) >= 0)
        return all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                   for x in values)
    except OverflowError:  # an integer beyond any float
        return False


def _document_problem(value: Any) -> str | None:
    """Why a JSON document cannot be stored: NaN or infinity (strict JSON cannot carry them), integers beyond
    64 bits, text with a NUL or a lone surrogate; None when it can."""
    kind = type(value)  # JSON's own types first (a bundle's documents hold nothing else), then subclasses
    if kind is float:
        return None if math.isfinite(value) else "must hold only finite numbers"
    if kind is str:
        return unstorable(value)
    if kind is int:
        return None if -MAX_INTEGER - 1 <= value <= MAX_INTEGER else "must hold only 64-bit integers"
    if value is None or kind is bool:
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "must hold only finite numbers"
    if isinstance(value, int) and not isinstance(value, bool):
        return None if -MAX_INTEGER - 1 <= value <= MAX_INTEGER else "must hold only 64-bit integers"
    if isinstance(value, str):
        return unstorable(value)
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return "must have text keys"
            if problem := unstorable(k) or _document_problem(v):
                return problem
    if isinstance(value, list):
        for v in value:
            if problem := _document_problem(v):
                return problem
    return None


def _normalise(column: Column, value: Any) -> Any:
    if isinstance(column.type, UTCDateTime) and isinstance(value, str):
        return datetime.fromisoformat(value)
    if isinstance(column.type, Double):
        return float(value)
    return value


def _check_measured(row: dict[str, Any], where: str, error: type[StoreError]) -> None:
    """What a measurement cannot be: a size of zero (`AT_LEAST_ONE`, in an ``ok`` result: one that failed or was
    skipped measured nothing, and older agents stored some with a zero), a median outside its min and max."""
    if row["status"] == "ok":
        for key in sorted(AT_LEAST_ONE.intersection(row)):  # sorted: the same field named whatever the hash seed
            if row[key] == 0:
                raise error(f"{where}: field {key!r} must be at least 1, got 0")
    for prefix in TIMING_PREFIXES:
        low, median, high = (row.get(f"{prefix}{name}_s") for name in ("min", "median", "max"))
        present = [value for value in (low, median, high) if value is not None]
        if present != sorted(present):
            shown = ", ".join(f"{prefix}{name}_s {value:g}" for name, value in zip(("min", "median", "max"),
                                                                                    (low, median, high))
                              if value is not None)
            raise error(f"{where}: timing statistics out of order ({shown}); min <= median <= max")


def _check_status(model: type[Result], row: dict[str, Any], where: str, error: type[StoreError]) -> None:
    if row["status"] == "ok":
        missing = [key for key in model.OK_REQUIRES if row[key] is None]
        if missing:
            raise error(f"{where}: an ok {model.KIND} result needs {', '.join(missing)}")
    elif row["status"] in ("error", "skipped") and not row["message"]:
        raise error(f"{where}: a result with status {row['status']} needs a message saying why")

