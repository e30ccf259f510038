"""Result-store benchmark: 100,000 matmul results over 50 devices, on SQLite and PostgreSQL.

    python benchmarks/bench_store.py
    python benchmarks/bench_store.py --results 100000 --devices 50 \\
        --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test

For each backend it prints

- the insert rate through the agent's writer API (`Store.add_result`): one
  transaction and one durable commit per result, as the agent writes them
  (SQLite WAL with synchronous=FULL; PostgreSQL with its default fsync);
- the insert rate of a bundle import of the same results (one transaction,
  batched inserts), the path of ``headroom db import`` and ``merge``;
- the time of "best bf16 TFLOP/s per device over the last 90 days"
  (`headroom.db.queries.best_tflop_per_s`), median over ``--repeats`` runs.

Runs start evenly over the last 180 days, so the query keeps about half of
them. SQLite writes to a temporary directory; PostgreSQL gets a new database
(dropped afterwards) on the server that ``--postgres`` names, which must
allow CREATE DATABASE. ``--postgres ''`` skips PostgreSQL.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone

from sqlalchemy import create_engine, text

from headroom.db.bundle import export_bundle, import_bundle
from headroom.db.models import Fingerprint, MatmulResult
from headroom.db.queries import best_tflop_per_s
from headroom.db.store import open_store

DEVICES = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H200", "NVIDIA L40S", "NVIDIA GeForce RTX 4090")
DTYPES = ("fp32", "tf32", "bf16", "fp16")
SHAPES = (1024, 2048, 4096, 8192)


def populate(url: str, n_results: int, n_devices: int, per_run: int, seed: int) -> float:
    """Write the results through the writer API; returns results per second."""
    rng = random.Random(seed)
    now = datetime.now(timezone.utc)
    n_runs = n_results // per_run
    started = time.perf_counter()
    with open_store(url, mode="write") as store:
        for run in range(n_runs):
            device = run % n_devices
            box = Fingerprint(device_type="cuda", device_name=DEVICES[device % len(DEVICES)], hostname=f"box-{device:02d}",
                              python_version="3.11.7", driver_version="550.54.15", cuda_version="12.4",
                              torch_version="2.13.0")
            start = now - timedelta(days=180 * (n_runs - run) / n_runs)
            run_id = store.start_run(box, suite="bench", benchmark_version="1", started_at=start)
            for i in range(per_run):
                size = SHAPES[i % len(SHAPES)]
                samples = [rng.uniform(1e-3, 2e-3) for _ in range(10)]
                median_s = statistics.median(samples)
                store.add_result(run_id, MatmulResult(
                    dtype=DTYPES[i % len(DTYPES)], m=size, n=size, k=size, precision="high", samples_s=samples,
                    median_s=median_s, min_s=min(samples), max_s=max(samples),
                    tflop_per_s=2 * size**3 / median_s / 1e12, recorded_at=start + timedelta(seconds=i),
                ))
            store.finish_run(run_id)
    return n_runs * per_run / (time.perf_counter() - started)


def bulk_import(source_url: str, url: str) -> float:
    """Import the populated store's runs as one bundle into an empty store; returns results per second."""
    with open_store(source_url) as source:
        bundle = export_bundle(source)
    with open_store(url, mode="write") as store:
        started = time.perf_counter()
        report = import_bundle(store, bundle)
        return report.results / (time.perf_counter() - started)


def query_ms(url: str, repeats: int) -> tuple[float, float, int]:
    """(first, median) milliseconds of the best-per-device query, and how many devices it returned."""
    since = datetime.now(timezone.utc) - timedelta(days=90)
    timings, found = [], 0
    with open_store(url) as store:
        for _ in range(repeats):
            with store.session() as session:
                started = time.perf_counter()
                found = len(best_tflop_per_s(session, "bf16", since))
                timings.append((time.perf_counter() - started) * 1e3)
    return timings[0], statistics.median(timings), found


def bench(name: str, url: str, import_url: str, args: argparse.Namespace) -> None:
    rate = populate(url, args.results, args.devices, args.per_run, args.seed)
    bulk = bulk_import(url, import_url)
    first, median, found = query_ms(url, args.repeats)
    print(f"{name:<11} writer API {rate:>9,.0f} results/s   bundle import {bulk:>9,.0f} results/s   "
          f"best bf16 per device, 90 days: {median:.1f} ms median ({first:.1f} ms first, {found} devices)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=int, default=100_000, help="matmul results to insert (default 100000)")
    parser.add_argument("--devices", type=int, default=50, help="distinct devices (hosts) (default 50)")
    parser.add_argument("--per-run", type=int, default=50, help="results per run (default 50)")
    parser.add_argument("--repeats", type=int, default=20, help="times the query runs (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="random seed for the sample timings (default 0)")
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
                        help="a PostgreSQL server to create scratch databases on; '' skips PostgreSQL")
    args = parser.parse_args()
    print(f"{args.results:,} matmul results, {args.devices} devices, {args.per_run} results per run")
    with tempfile.TemporaryDirectory() as scratch:
        bench("sqlite", f"sqlite:///{scratch}/bench.db", f"sqlite:///{scratch}/import.db", args)
    if args.postgres:
        admin = create_engine(args.postgres, isolation_level="AUTOCOMMIT")
        names = [f"headroom_bench_{uuid.uuid4().hex[:8]}" for _ in range(2)]
        urls = [admin.url.set(database=n).render_as_string(hide_password=False) for n in names]
        with admin.connect() as connection:
            for name in names:
                connection.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            bench("postgresql", *urls, args)
        finally:
            with admin.connect() as connection:
                for name in names:
                    connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


if __name__ == "__main__":
    main()
