"""Bundles: a store's runs as one JSON document, to ship results between stores.

A box without network to the fleet database exports a bundle, carries it
over, and the fleet imports it. The format::

    {
      "format": "headroom-bundle",
      "version": 1,
      "schema_revision": "0005",            # informational: the exporter's schema
      "runs": [
        {"uuid": ..., "suite": ..., "benchmark_version": ..., "started_at": ..., "finished_at": ...,
         "status": ..., "labels": {...},
         "fingerprint": {...every Fingerprint field but id and digest...},
         "results": {"matmul": [...], "elementwise": [...], "attention": [...], "train_step": [...],
                     "collective": [...]}}
      ]
    }

Result records carry every column of their table but the internal ids
(headroom.db.models documents each field). Times are ISO 8601 with offset.
Export is deterministic (runs by start time then uuid, results in the order
they were recorded), so exporting an imported bundle gives the same bytes.
Export, import and merge stream: memory holds one run at a time, whatever
the size of the store or the bundle (db/bundle_file.py reads and writes the
files).

Import is idempotent by run uuid: a run already stored is skipped, whole
(unless it was stored as ``running`` and the bundle has it finished: then the
finished copy replaces it, but only a copy from the same machine, its
fingerprint, holding every result already stored for the run; anything else
would let a bundle rewrite what a box measured, and is refused). Import is
all-or-nothing: the whole bundle is read and checked before anything is
written, and the writes go in one transaction. A truncated or malformed
bundle adds nothing and the error names the run, record and field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO
from uuid import UUID

from sqlalchemy import delete, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from headroom.db.bundle_file import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    HEADER_KEYS,
    BundleCounts,
    BundleFile,
    bundle_target,
    check_header,
    dump_bundle,
    read_runs,
    write_bundle,
)
from headroom.db.engine import SIDECARS, driver_message, sqlite_file
from headroom.db.errors import BundleError, StoreError
from headroom.db.migrate import head
from headroom.db.models import RESULT_MODELS, Fingerprint, Run
from headroom.db.store import Store, fingerprint_id, insert_run, open_destination
from headroom.db.validate import check_record, data_columns, record_values

__all__ = ["BUNDLE_FORMAT", "BUNDLE_VERSION", "BundleCounts", "CheckedRun", "ImportReport", "check_bundle",
           "check_file", "check_runs", "export_bundle", "export_file", "export_runs", "import_bundle", "import_file",
           "merge_stores", "print_runs", "read_runs", "write_runs"]

_RUN_KEYS = tuple(c.key for c in data_columns(Run))
_BATCH = 100
"""Rows fetched at a time when exporting."""


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


def export_runs(store: Store, uuids: Collection[str] | None = None) -> Iterator[dict[str, Any]]:
    """Every run in ``store`` (or those of ``uuids``) as a bundle's run document, in export order.

    One snapshot of the store (one transaction) read through a cursor per
    table, each in the runs' order, ``_BATCH`` rows at a time: memory holds
    one run's results, whatever the store's size.
    """
    with store.session() as session:
        if store.backend == "postgresql":  # one snapshot for every query (a SQLite transaction is one already)
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        order = (Run.started_at, Run.uuid)
        picked = (lambda query: query) if uuids is None else (lambda query: query.where(Run.uuid.in_(list(uuids))))
        run_columns, device_columns = data_columns(Run), data_columns(Fingerprint)
        runs = session.execute(
            picked(select(Run.id, *run_columns, *device_columns).join(Fingerprint, Fingerprint.id == Run.fingerprint_id))
            .order_by(*order), execution_options={"yield_per": _BATCH})
        results = {
            kind: _Grouped(session.execute(
                picked(select(model.run_id, *data_columns(model)).join(Run, Run.id == model.run_id))
                .order_by(*order, model.id), execution_options={"yield_per": _BATCH}), data_columns(model))
            for kind, model in RESULT_MODELS.items()
        }
        split = 1 + len(run_columns)
        for row in runs:
            document = _plain(zip((c.key for c in run_columns), row[1:split], strict=True))
            document["fingerprint"] = _plain(zip((c.key for c in device_columns), row[split:], strict=True))
            document["results"] = {kind: list(rows.take(row[0])) for kind, rows in results.items()}
            yield document


class _Grouped:
    """Result rows in the runs' order (run id first), handed out one run's worth at a time as plain records."""

    def __init__(self, rows: Iterable[Any], columns: list) -> None:
        self._rows = iter(rows)
        self._keys = [c.key for c in columns]
        self._next = next(self._rows, None)

    def take(self, run_id: int) -> Iterator[dict[str, Any]]:
        while self._next is not None and self._next[0] == run_id:
            yield _plain(zip(self._keys, self._next[1:], strict=True))
            self._next = next(self._rows, None)


def _plain(items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in items}


def export_bundle(store: Store, uuids: Collection[str] | None = None) -> dict[str, Any]:
    """A (small) store's runs as one bundle document in memory; `export_runs` streams them."""
    return {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "schema_revision": head(),
            "runs": list(export_runs(store, uuids))}


def export_file(store: Store, path: Path, *, compress: bool | None = None) -> BundleCounts:
    """Write every run of ``store`` to the bundle file ``path`` (headroom.db.bundle_file.write_bundle), streamed.

    ``path`` may not be the store's own file, nor one SQLite keeps beside it
    (``-wal``, ``-shm``, ``-journal``): the bundle would replace the store.
    """
    _refuse_store_files(store, path)
    return write_bundle(export_runs(store), path, head(), compress=compress)


def _refuse_store_files(store: Store, path: Path) -> None:
    """Refuse a bundle path that is, or leads to, the SQLite store being exported or a file SQLite keeps with it."""
    own = sqlite_file(store.engine.url)
    if own is None:  # PostgreSQL
        return
    target = str(bundle_target(path))  # refuses first a name no file can have
    for suffix in ("", *SIDECARS):
        kept = f"{own}{suffix}"
        if target == os.path.realpath(kept) or _same_file(target, kept):
            what = f"SQLite's {suffix[1:]} file of the store being exported" if suffix else "the store being exported"
            raise BundleError(f"cannot export to {path}: it is {what} ({kept}) and the bundle would replace it; "
                              f"give PATH a new file name, such as {Path(own).with_name('results.json.gz')}")


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either does not exist
        return False


def print_runs(store: Store, uuids: Collection[str], out: TextIO) -> BundleCounts:
    """Write the runs ``uuids`` of ``store`` to ``out`` as a bundle, streamed."""
    return dump_bundle(export_runs(store, uuids), out, head())


# ---- import ----------------------------------------------------------------------


def check_runs(documents: Iterable[Any], source: str) -> Iterator[CheckedRun]:
    """Each run document checked (`BundleError` at the first problem, naming the run), in order."""
    seen = set()
    for number, document in enumerate(documents, start=1):
        try:
            run = _check_run(document, f"{source}: run {number}")
        except RecursionError:
            raise BundleError(f"{source}: run {number}: a document nested too deeply; nothing imported") from None
        if run.run["uuid"] in seen:
            raise BundleError(f"{source}: run {number}: uuid {run.run['uuid']} appears twice in the bundle")
        seen.add(run.run["uuid"])
        yield run


def check_bundle(bundle: Any, source: str) -> list[CheckedRun]:
    """Check every part of a bundle document held in memory; raise `BundleError` at the first problem."""
    if not isinstance(bundle, dict):
        raise BundleError(f"{source}: not a Headroom bundle (a JSON {type(bundle).__name__}, a bundle is an object "
                          f"with format {BUNDLE_FORMAT!r})")
    check_header(bundle, source)
    unknown = sorted(set(bundle) - {*HEADER_KEYS, "runs"})
    if unknown or not isinstance(bundle.get("runs"), list):
        raise BundleError(f"{source}: expected the keys {', '.join(HEADER_KEYS)} and a list 'runs'"
                          + (f"; unknown key {unknown[0]!r}" if unknown else ""))
    return list(check_runs(bundle["runs"], source))


def check_file(path: Path) -> int:
    """Read and check the whole bundle file at ``path``, a run at a time; how many runs it holds."""
    return sum(1 for _ in check_runs(read_runs(path), str(path)))


def import_file(path: Path, url: str | None) -> tuple[ImportReport, str]:
    """Import the bundle file at ``path`` into the store at ``url``: the report and the store's URL.

    The file is opened once and read through twice, a run at a time (a pipe
    from a copy taken on the first reading: headroom.db.bundle_file.BundleFile): once
    to check it whole, before the store is even opened (a bad bundle creates
    no store), then to write it in one transaction. Memory holds a run,
    whatever the bundle's size.
    """
    source = str(path)
    with BundleFile(path) as bundle:
        for _ in check_runs(bundle.runs(), source):
            pass
        with open_destination(url) as store:  # a new store is removed again if the import fails
            store.verify()
            return write_runs(store, check_runs(bundle.runs(), source), source), store.url


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
    """Check a bundle document held in memory whole, then write the runs ``store`` lacks in one transaction."""
    return write_runs(store, check_bundle(bundle, source), source)


def write_runs(store: Store, runs: Iterable[CheckedRun], source: str) -> ImportReport:
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
    except OSError as err:  # the store's disk failed (headroom.db.engine.sqlite_failure): the transaction was rolled back
        raise OSError(err.errno, f"{err.strerror or err}; nothing imported") from err
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
    """Copy the runs of ``source`` that ``destination`` lacks, streamed from one to the other a run at a time.

    Every run is checked as a bundle's would be, and the writes go in one
    transaction: a run the destination refuses leaves it as it was. An error
    reading the source is the source's, not a refusal of the destination.
    """
    return write_runs(destination, check_runs(_read_source(source), source.url), source.url)


def _read_source(source: Store) -> Iterator[dict[str, Any]]:
    """`export_runs` of a merge's source, its database errors said to be the source's."""
    try:
        yield from export_runs(source)
    except DBAPIError as err:
        raise StoreError(f"cannot read the merge source {source.url}: {driver_message(err)}; nothing merged") from None
