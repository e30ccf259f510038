"""Bundles: a store's runs as one JSON document, to ship results between stores.

A box without network to the fleet database exports a bundle, carries it
over, and the fleet imports it. The format::

    {
      "format": "headroom-bundle",
      "version": 1,
      "schema_revision": "0003",            # informational: the exporter's schema
      "runs": [
        {"uuid": ..., "suite": ..., "benchmark_version": ..., "started_at": ..., "finished_at": ...,
         "status": ..., "labels": {...},
         "fingerprint": {...every Fingerprint field but id and digest...},
         "results": {"matmul": [...], "elementwise": [...], "attention": [...], "train_step": [...]}}
      ]
    }

Result records carry every column of their table but the internal ids
(db.models documents each field). Times are ISO 8601 with offset.
Export is deterministic (runs by start time then uuid, results in the order
they were recorded), so exporting an imported bundle gives the same bytes.

Import is idempotent by run uuid: a run already stored is skipped, whole
(unless it was stored as ``running`` and the bundle has it finished: then the
finished copy replaces it, but only a copy from the same machine, its
fingerprint, holding every result already stored for the run; anything else
would let a bundle rewrite what a box measured, and is refused). Import is all-or-nothing: the whole bundle is read and checked before anything is
written, and the writes go in one transaction. A truncated or malformed
bundle adds nothing and the error names the run, record and field.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import zlib
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from uuid import UUID

from sqlalchemy import delete, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from db.engine import driver_message
from db.errors import BundleError
from db.migrate import head
from db.models import RESULT_MODELS, Fingerprint, Run
from db.store import Store, fingerprint_id, insert_run
from db.validate import check_record, data_columns, record_values

BUNDLE_FORMAT = "headroom-bundle"
BUNDLE_VERSION = 1
_GZIP_MAGIC = b"\x1f\x8b"
_RUN_KEYS = tuple(c.key for c in data_columns(Run))


@dataclass(frozen=True, slots=True)
class CheckedRun:
    """One run of a bundle, every record checked and normalised for its table."""

    run: dict[str, Any]
    fingerprint: dict[str, Any]
    results: dict[str, list[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class ImportReport:
    added: tuple[str, ...]
    """Run uuids written."""
    replaced: tuple[str, ...]
    """Run uuids stored as ``running`` and replaced by their finished copy."""
    skipped: tuple[str, ...]
    """Run uuids already in the store, left as they were."""
    results: int
    """Results written."""

    def __str__(self) -> str:
        finished = f"; completed {len(self.replaced)} runs stored as running" if self.replaced else ""
        return (f"added {len(self.added)} runs ({self.results:,} results){finished}; "
                f"skipped {len(self.skipped)} runs already present")


# ---- export ----------------------------------------------------------------------


def export_bundle(store: Store, uuids: Collection[str] | None = None) -> dict[str, Any]:
    """Every run in ``store`` (or those of ``uuids``) with its fingerprint and results, as a bundle document."""
    with store.session() as session:
        if store.backend == "postgresql":  # one snapshot for every query (a SQLite transaction is one already)
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        query = select(Run, Fingerprint).join(Fingerprint, Fingerprint.id == Run.fingerprint_id)
        if uuids is not None:
            query = query.where(Run.uuid.in_(list(uuids)))
        runs = session.execute(query.order_by(Run.started_at, Run.uuid)).all()
        wanted = [run.id for run, _ in runs]
        results: dict[int, dict[str, list[dict[str, Any]]]] = {}
        for kind, model in RESULT_MODELS.items():
            rows = select(model).order_by(model.run_id, model.id)
            for row in session.scalars(rows if uuids is None else rows.where(model.run_id.in_(wanted))):
                results.setdefault(row.run_id, {}).setdefault(kind, []).append(_plain(record_values(row)))
    documents = []
    for run, device in runs:
        document = _plain(record_values(run))
        document["fingerprint"] = _plain(record_values(device))
        found = results.get(run.id, {})
        document["results"] = {kind: found.get(kind, []) for kind in RESULT_MODELS}
        documents.append(document)
    return {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "schema_revision": head(), "runs": documents}


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in values.items()}


def write_bundle(bundle: dict[str, Any], path: Path, *, compress: bool | None = None) -> None:
    """Write ``bundle`` to ``path`` atomically (a temporary file renamed into place).

    Gzip when ``compress`` is true, or when it is None and the name ends in ``.gz``.
    """
    compress = path.name.endswith(".gz") if compress is None else compress
    data = json.dumps(bundle, indent=1, allow_nan=False).encode() + b"\n"
    if compress:
        data = gzip.compress(data, mtime=0)  # mtime=0: the same bundle gives the same bytes
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


# ---- import ----------------------------------------------------------------------


def read_bundle(path: Path) -> Any:
    """The parsed JSON of a bundle file, plain or gzip (recognised by its magic bytes)."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise BundleError(f"cannot read bundle {path}: {err.strerror}") from None
    if raw.startswith(_GZIP_MAGIC):
        raw = _gunzip(raw, path)
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise BundleError(f"{path}: not UTF-8 text, so not a bundle; nothing imported") from None
    except RecursionError:
        raise BundleError(f"{path}: JSON nested too deeply to be a bundle; nothing imported") from None
    except json.JSONDecodeError as err:
        raise BundleError(
            f"{path}: not valid JSON at line {err.lineno} column {err.colno} ({err.msg}); "
            "a truncated bundle ends early; nothing imported"
        ) from None


MAX_EXPANSION = 100
"""A gzip bundle may expand to this many times its size at most: exported bundles expand about 6x (the
H200 reference data: 5.9x); a file that expands 1000x is a decompression bomb, refused before it fills memory."""
_CHUNK = 1 << 20


def _gunzip(raw: bytes, path: Path) -> bytes:
    """``raw`` decompressed (every gzip member), refused as soon as it outgrows MAX_EXPANSION."""
    limit = max(MAX_EXPANSION * len(raw), 16 * _CHUNK)
    out, data = bytearray(), raw
    try:
        while data:
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            pending = data
            while pending and not inflate.eof:
                out += inflate.decompress(pending, _CHUNK)
                pending = inflate.unconsumed_tail
                if len(out) > limit:
                    raise BundleError(f"{path}: expands more than {MAX_EXPANSION}x its {len(raw):,} bytes, which "
                                      "no exported bundle does (a decompression bomb?); nothing imported")
            if not inflate.eof:
                raise EOFError("compressed file ended before the end-of-stream marker was reached")
            data = inflate.unused_data
    except (EOFError, zlib.error) as err:
        raise BundleError(f"{path}: truncated or damaged gzip ({err}); nothing imported") from None
    return bytes(out)


def _refuse_constant(name: str) -> None:
    raise json.JSONDecodeError(f"{name} is not a number a bundle may carry", name, 0)


def check_bundle(bundle: Any, source: str) -> list[CheckedRun]:
    """Check every part of a bundle document; raise `BundleError` at the first problem."""
    if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
        found = bundle.get("format") if isinstance(bundle, dict) else type(bundle).__name__
        raise BundleError(f"{source}: not a Headroom bundle (format {found!r}, expected {BUNDLE_FORMAT!r})")
    version = bundle.get("version")
    if version != BUNDLE_VERSION:
        newer = isinstance(version, int) and version > BUNDLE_VERSION
        raise BundleError(f"{source}: bundle version {version!r}; this headroom reads version {BUNDLE_VERSION}"
                          + (" (upgrade headroom to import it)" if newer else ""))
    unknown = sorted(set(bundle) - {"format", "version", "schema_revision", "runs"})
    if unknown or not isinstance(bundle.get("runs"), list):
        raise BundleError(f"{source}: expected the keys format, version, schema_revision and a list 'runs'"
                          + (f"; unknown key {unknown[0]!r}" if unknown else ""))
    checked, seen = [], set()
    for number, document in enumerate(bundle["runs"], start=1):
        try:
            run = _check_run(document, f"{source}: run {number}")
        except RecursionError:
            raise BundleError(f"{source}: run {number}: a document nested too deeply; nothing imported") from None
        if run.run["uuid"] in seen:
            raise BundleError(f"{source}: run {number}: uuid {run.run['uuid']} appears twice in the bundle")
        seen.add(run.run["uuid"])
        checked.append(run)
    return checked


def _check_run(document: Any, where: str) -> CheckedRun:
    if not isinstance(document, dict):
        raise BundleError(f"{where}: expected an object, got {type(document).__name__}")
    uuid = document.get("uuid")
    if not isinstance(uuid, str) or not _is_uuid(uuid):
        raise BundleError(f"{where}: field 'uuid' must be a UUID such as {UUID(int=0)}, got {uuid!r}")
    where = f"{where} ({uuid})"
    missing = [key for key in (*_RUN_KEYS, "fingerprint", "results") if key not in document]
    if missing:
        raise BundleError(f"{where}: missing field {missing[0]!r}")
    run = check_record(Run, {k: v for k, v in document.items() if k not in ("fingerprint", "results")},
                       where, BundleError)
    device = check_record(Fingerprint, document["fingerprint"], f"{where}: fingerprint", BundleError)
    found = document["results"]
    if not isinstance(found, dict) or set(found) - set(RESULT_MODELS):
        raise BundleError(f"{where}: field 'results' must map result kinds ({', '.join(RESULT_MODELS)}) to lists")
    results = {}
    for kind, records in found.items():
        if not isinstance(records, list):
            raise BundleError(f"{where}: results {kind!r} must be a list, got {type(records).__name__}")
        model = RESULT_MODELS[kind]
        results[kind] = [check_record(model, record, f"{where}: {kind} result {i}", BundleError)
                         for i, record in enumerate(records, start=1)]
    return CheckedRun(run=run, fingerprint=device, results=results)


def _is_uuid(text: str) -> bool:
    try:
        return str(UUID(text)) == text
    except ValueError:
        return False


def import_bundle(store: Store, bundle: Any, source: str = "bundle") -> ImportReport:
    """Check ``bundle`` whole, then write the runs ``store`` lacks in one transaction."""
    return write_runs(store, check_bundle(bundle, source), source)


def write_runs(store: Store, runs: list[CheckedRun], source: str) -> ImportReport:
    """Write checked runs in one transaction: new ones added, stored ones skipped.

    One exception to skipping: a run stored as ``running`` (exported while
    it was in progress) is replaced by a finished copy of itself, so a box
    that ships a bundle every night does not leave its runs incomplete in the
    fleet store forever.
    """
    added, replaced, skipped, results = [], [], [], 0
    try:
        with store.transaction() as session:
            for checked in runs:
                uuid, device = checked.run["uuid"], fingerprint_id(session, checked.fingerprint)
                run_row = insert_run(session, checked.run, device)
                if run_row is None and checked.run["status"] != "running" and _is_running(session, uuid):
                    _check_replacement(session, uuid, device, checked, source)
                    _drop_unfinished(session, uuid)
                    run_row = insert_run(session, checked.run, device)
                    replaced.append(uuid)
                elif run_row is None:
                    skipped.append(uuid)
                    continue
                else:
                    added.append(uuid)
                for kind, rows in checked.results.items():
                    if rows:
                        session.execute(RESULT_MODELS[kind].__table__.insert(), [r | {"run_id": run_row} for r in rows])
                        results += len(rows)
    except DBAPIError as err:
        raise BundleError(f"{source}: the store refused the import ({driver_message(err)}); nothing imported") from None
    return ImportReport(added=tuple(added), replaced=tuple(replaced), skipped=tuple(skipped), results=results)


def _is_running(session: Session, uuid: str) -> bool:
    return session.scalar(select(Run.status).where(Run.uuid == uuid)) == "running"


def _check_replacement(session: Session, uuid: str, device: int, checked: CheckedRun, source: str) -> None:
    """Refuse to replace the stored running run ``uuid`` with anything but a finished copy of itself."""
    stored = session.scalars(select(Run).where(Run.uuid == uuid)).one()
    if stored.fingerprint_id != device:
        raise BundleError(f"{source}: run {uuid} is running in the store on another machine than the bundle's copy "
                          "(the fingerprints differ): refusing to replace it; nothing imported")
    for kind, model in RESULT_MODELS.items():
        offered = {_canonical(row) for row in checked.results.get(kind, [])}
        kept = session.scalars(select(model).where(model.run_id == stored.id)).all()
        lacking = sum(1 for row in kept if _canonical(record_values(row)) not in offered)
        if lacking:
            raise BundleError(f"{source}: run {uuid} is running in the store with {len(kept)} {kind} results, "
                              f"{lacking} of which the bundle's copy lacks: refusing to replace it; nothing imported")


def _canonical(row: dict[str, Any]) -> str:
    """One result's data columns as text that two copies of the same result share (times in UTC)."""
    return json.dumps({k: v.astimezone(timezone.utc).isoformat() if isinstance(v, datetime) else v
                       for k, v in row.items()}, sort_keys=True)


def _drop_unfinished(session: Session, uuid: str) -> bool:
    """Delete the stored run ``uuid`` (its results go with it) if it is still ``running``."""
    return session.execute(delete(Run).where(Run.uuid == uuid, Run.status == "running")).rowcount == 1


def merge_stores(source: Store, destination: Store) -> ImportReport:
    """Copy the runs of ``source`` that ``destination`` lacks: export and import, in memory."""
    return import_bundle(destination, export_bundle(source), source=source.url)
