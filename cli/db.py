"""``headroom db``: look into, upgrade, export, import and merge result stores.

Every action takes ``--db URL`` (else ``HEADROOM_DB``, else the default file;
see db/location.py). ``info`` and ``export`` only read: they never migrate or
create a store. ``import``, ``merge`` and ``upgrade`` write: they create a
missing SQLite store and upgrade an older one. SQLAlchemy is imported inside
the handlers, so other subcommands never load it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from headroom.cli.stop import stoppable
from headroom.cli.wrap import wrap
from headroom.core.safe_text import printable_lines
from headroom.db.location import ENV_VAR, default_url

if TYPE_CHECKING:
    from headroom.db.store import Store


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "db", help="the result store: info, upgrade, export, import, merge",
        description="Look into and move results between result stores (SQLite files or PostgreSQL databases). "
        "Example: headroom db export results.json.gz && headroom db import results.json.gz --db postgresql://fleet/headroom",
    )
    actions = parser.add_subparsers(dest="db_command", required=True, metavar="ACTION")

    def action(name: str, summary: str, handler) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")
        sub.add_argument(
            "--db", metavar="URL",
            help=f"store: sqlite:///PATH, a file path, or postgresql+psycopg://USER@HOST/DB "
            f"(default: ${ENV_VAR} if set, else {default_url()})",
        )
        sub.set_defaults(handler=handler)
        return sub

    info = action("info", "location, schema revision, counts by device and incomplete runs of a store", run_info)
    info.add_argument("--json", action="store_true", help="the same as one JSON object (times in UTC, ISO 8601)")
    action("upgrade", "bring a store to this headroom's schema revision (creates a missing SQLite store)", run_upgrade)
    export = action("export", "write every run of a store to a JSON bundle", run_export)
    export.add_argument("path", metavar="PATH", type=Path,
                        help="bundle file to write: a new name or a regular file, not the store (a symlink: the file "
                        "it points to is replaced, the link kept); gzip when it ends in .gz")
    export.add_argument("--gzip", action="store_true", help="gzip the bundle whatever its name")
    imported = action("import", "add the runs of a bundle that the store lacks (all or nothing)", run_import)
    imported.add_argument("path", metavar="PATH", type=Path, help="bundle to read, plain or gzip JSON")
    merge = action("merge", "copy into the store the runs another store has and it lacks", run_merge)
    merge.add_argument("source", metavar="SRC_URL", help="the store to copy from (read only; never migrated)")


def run_info(args: argparse.Namespace) -> int:
    from headroom.db.store import open_store

    with open_store(args.db, mode="read") as store:
        info = store_info(store)
    print(json.dumps(info, indent=2) if args.json else wrap(render_info(info)))
    return 0


def run_upgrade(args: argparse.Namespace) -> int:
    from headroom.db.store import open_store

    with open_store(args.db, mode="write") as store:
        store.verify()  # "nothing to do" would otherwise pass a damaged store whose damage no upgrade step read
        if store.upgraded_from is None:
            print(f"{store.url} is at schema revision {store.revision}: nothing to do")
        elif store.upgraded_from == "empty":
            print(f"created a store at schema revision {store.revision} in {store.url}")
        else:
            print(f"upgraded {store.url} from schema revision {store.upgraded_from} to {store.revision}")
    return 0


@stoppable
def run_export(args: argparse.Namespace) -> int:
    """SIGTERM or SIGHUP stops an export as Ctrl-C does (headroom.cli.stop.stoppable): the temporary file is removed,
    PATH left as it was, and the exit status is 128 + the signal."""
    from headroom.db.bundle import export_file
    from headroom.db.store import open_store

    with open_store(args.db, mode="read") as store:
        counts = export_file(store, args.path, compress=True if args.gzip else None)
    print(f"exported {counts.runs} runs ({counts.results:,} results) from {store.url} to {args.path}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    from headroom.db.bundle import import_file

    report, url = import_file(args.path, args.db)  # checked whole before the store is opened
    print(f"{args.path} -> {url}: {report}")
    return 0


def run_merge(args: argparse.Namespace) -> int:
    """The source is checked whole before the destination is opened (a damaged source creates no store), and
    a damaged store is named as the merge's source or destination."""
    from headroom.db.bundle import merge_stores
    from headroom.db.engine import display_url
    from headroom.db.errors import DamagedStoreError, StoreError
    from headroom.db.location import resolve_url
    from headroom.db.store import open_destination, open_store, same_store

    if (both := same_store(args.source, args.db)) is not None:
        raise StoreError(f"source and destination are the same store: SRC_URL {display_url(resolve_url(args.source))} "
                         f"and --db {display_url(resolve_url(args.db))} both name {both}; give --db another store")
    try:
        opened = open_store(args.source, mode="read")
    except DamagedStoreError as err:
        raise err.naming("merge source", "SRC_URL") from None
    except StoreError as err:  # its words name --db, the option a store usually comes from: here it is SRC_URL
        text = str(err).replace("--db expects", "SRC_URL expects").replace(
            "--db or HEADROOM_DB point elsewhere", "SRC_URL names another store")
        raise StoreError(f"merge source: {text}") from None
    try:
        with opened as source:
            source.verify()
            with open_destination(args.db) as destination:
                destination.verify()
                report = merge_stores(source, destination)
                print(f"{source.url} -> {destination.url}: {report}")
    except DamagedStoreError as err:
        if err.url == display_url(resolve_url(args.source)):
            raise err.naming("merge source", "SRC_URL") from None
        raise err.naming("merge destination", "--db") from None
    return 0


def store_info(store: Store) -> dict:
    """What ``headroom db info`` reports, as a JSON document."""
    from sqlalchemy import text

    from headroom.db import queries

    with store.session() as session:
        statuses = queries.runs_by_status(session)
        kinds = queries.results_by_kind(session)
        devices = queries.counts_by_device(session)
        incomplete = queries.incomplete_runs(session)
        if store.backend == "sqlite":
            engine = f"sqlite {session.scalar(text('SELECT sqlite_version()'))}, " + _journal(store, session)
        else:
            engine = f"postgresql {session.scalar(text('SHOW server_version'))}"
    return {
        "store": store.url, "engine": engine, "schema_revision": store.revision, "runs": statuses, "results": kinds,
        "devices": [_document(d) for d in devices], "incomplete_runs": [_document(r) for r in incomplete],
    }


def _journal(store: Store, session) -> str:
    """How SQLite journals the store, or that it reads it immutable (db/engine.py: a read-only file system),
    where ``PRAGMA journal_mode`` would say DELETE of a WAL store."""
    from sqlalchemy import text

    from headroom.db.engine import read_only_file_system, sqlite_file

    path = sqlite_file(store.engine.url)
    if store.mode == "read" and path is not None and read_only_file_system(path):
        return "read-only file system, read as immutable"
    return f"{session.scalar(text('PRAGMA journal_mode')).upper()} journal"


def _document(row) -> dict:
    return {name: value.isoformat() if isinstance(value, datetime) else value
            for name, value in dataclasses.asdict(row).items()}


def render_info(info: dict) -> str:
    """The text of ``headroom db info`` from `store_info`."""
    statuses, kinds = info["runs"], info["results"]
    lines = [
        f"store     {info['store']}",
        f"engine    {info['engine']}",
        f"schema    revision {info['schema_revision']} (current)",
        f"runs      {sum(statuses.values()):,}" + _breakdown(statuses),
        f"results   {sum(kinds.values()):,}" + _breakdown(kinds),
    ]
    devices, incomplete = info["devices"], info["incomplete_runs"]
    if devices:
        lines += ["", f"{'device':<36}{'host':<24}{'runs':>8}{'results':>10}  last run (UTC)"]
        lines += [f"{d['device_name']:<36}{d['hostname']:<24}{d['runs']:>8,}{d['results']:>10,}  "
                  f"{_when(d['last_started_at'])}" for d in devices]
    if incomplete:
        lines += ["", f"{len(incomplete)} incomplete runs (status running: still in progress, or the writer died):"]
        lines += [f"  {r['run_id']}  {r['device_name']} on {r['hostname']}, started {_when(r['started_at'])}, "
                  f"{r['results']} results" + (f", last at {_when(r['last_result_at'])}" if r['last_result_at'] else "")
                  for r in incomplete]
    return printable_lines(lines)


def _breakdown(counts: dict[str, int]) -> str:
    shown = [f"{count:,} {name}" for name, count in counts.items() if count]
    return f": {', '.join(shown)}" if shown else ""


def _when(moment: str) -> str:
    """An ISO 8601 time as the table shows it, to the second."""
    return datetime.fromisoformat(moment).strftime("%Y-%m-%d %H:%M:%S")
