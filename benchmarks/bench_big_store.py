"""A big store: memory and time of db export, import and merge, and of plan --hardware latest.

    python benchmarks/bench_big_store.py                 # 100,000 results, SQLite
    python benchmarks/bench_big_store.py --results 20000 --postgres postgresql+psycopg://postgres@127.0.0.1:5432/test

The store holds real H200 measurements copied until it has ``--results``
results (benchmarks/big_store.py says how). Each command runs in a fresh
interpreter (benchmarks/peak_memory.py): its wall time, its peak memory, and
the same for a store of one copy, so the ratio shows what grows with the
store. Targets (issue 17): export and import under 200 MB whatever the
store's size; plan --hardware latest under 1 s and 200 MB at 100,000 results.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text

from benchmarks.big_store import build_store
from benchmarks.peak_memory import run_headroom

PLAN = ("plan", "--model", "llama3-8b", "--global-batch", "256", "--dp", "8", "--zero", "3", "--hardware", "latest")


ROLES = ("store", "imported", "merged")


def commands(urls: dict[str, str], bundle: Path) -> dict[str, tuple[str, ...]]:
    return {
        "db export": ("db", "export", str(bundle), "--db", urls["store"]),
        "db import": ("db", "import", str(bundle), "--db", urls["imported"]),
        "db merge": ("db", "merge", urls["store"], "--db", urls["merged"]),
        "plan --hardware latest": (*PLAN, "--db", urls["store"]),
    }


def measure(urls: dict[str, str], bundle: Path) -> dict[str, tuple[float, float]]:
    figures = {}
    for name, args in commands(urls, bundle).items():
        done = run_headroom(*args)
        if done.returncode not in (0, 3):  # 3: plan found nothing that fits, still a plan
            sys.exit(f"headroom {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        figures[name] = (done.wall_s, done.peak_mib)
    return figures


def bench(backend: str, urls: dict[str, dict[str, str]], results: int, scratch: Path) -> None:
    """``urls``: for the one-copy ("small") and the big store, the store and the empty import and merge targets."""
    made = {size: build_store(urls[size]["store"], n) for size, n in (("small", 1), ("big", results))}
    print(f"{backend}: {made['big']:,} results (and {made['small']} in the one-copy store)")
    figures = {size: measure(urls[size], scratch / f"{backend}-{size}.json.gz") for size in ("small", "big")}
    print(f"  {'command':<24}{'wall s':>9}{'peak MiB':>10}{'one copy: s':>13}{'MiB':>7}{'peak ratio':>12}")
    for name, (wall, peak) in figures["big"].items():
        wall_1, peak_1 = figures["small"][name]
        print(f"  {name:<24}{wall:>9.2f}{peak:>10.0f}{wall_1:>13.2f}{peak_1:>7.0f}{peak / peak_1:>11.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=int, default=100_000, help="results in the big store (default 100000)")
    parser.add_argument("--postgres", default="", help="also on this PostgreSQL server (it must allow CREATE DATABASE)")
    args = parser.parse_args()
    sizes = ("small", "big")
    with tempfile.TemporaryDirectory(prefix="headroom-big-store-") as tmp:
        scratch = Path(tmp)
        bench("sqlite", {size: {role: f"sqlite:///{scratch / f'{role}-{size}.db'}" for role in ROLES} for size in sizes},
              args.results, scratch)
        if not args.postgres:
            return
        admin = create_engine(args.postgres, isolation_level="AUTOCOMMIT")
        tag = uuid.uuid4().hex[:6]
        names = {size: {role: f"headroom_bench_{role}_{size}_{tag}" for role in ROLES} for size in sizes}
        try:
            with admin.connect() as connection:
                for size in sizes:
                    for name in names[size].values():
                        connection.execute(text(f'CREATE DATABASE "{name}"'))
            bench("postgresql", {size: {role: admin.url.set(database=name).render_as_string(hide_password=False)
                                        for role, name in names[size].items()} for size in sizes},
                  args.results, scratch)
        finally:
            with admin.connect() as connection:
                for size in sizes:
                    for name in names[size].values():
                        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


if __name__ == "__main__":
    main()
