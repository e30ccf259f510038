"""A large result store made of real measurements: the H200 reference runs, copied until it holds N results.

Each copy is the reference data's runs (tests/data/reference, measured on an
NVIDIA H200 on 2026-11-30) with new uuids and every time moved back by a day
per copy, as a box that reran the same suite every night would have stored
them. The figures are the H200's own; only their number is made up.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from headroom.db.bundle import check_runs, read_runs, write_runs
from headroom.db.store import open_store

REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "reference" / "nvidia-h200-2026-11-30.json.gz"
_TIMES = ("started_at", "finished_at", "recorded_at")


def _results(run: dict[str, Any]) -> int:
    return sum(len(rows) for rows in run["results"].values())


def copied_runs(results: int) -> Iterator[dict[str, Any]]:
    """Copies of the reference runs, newest first in time, until at least ``results`` results."""
    reference = list(read_runs(REFERENCE))
    made, copy = 0, 0
    while made < results:
        for run in reference:
            yield _moved(run, copy)
            made += _results(run)
        copy += 1


def _moved(run: dict[str, Any], days: int) -> dict[str, Any]:
    def shift(record: dict[str, Any]) -> dict[str, Any]:
        return {k: (datetime.fromisoformat(v) - timedelta(days=days)).isoformat() if k in _TIMES and v else v
                for k, v in record.items()}

    moved = shift(run)
    moved["uuid"] = str(uuid.uuid5(uuid.UUID(run["uuid"]), str(days)))
    moved["results"] = {kind: [shift(r) for r in rows] for kind, rows in run["results"].items()}
    return moved


def build_store(url: str, results: int) -> int:
    """A store at ``url`` holding at least ``results`` results copied from the reference runs; how many."""
    with open_store(url, mode="write") as store:
        return write_runs(store, check_runs(copied_runs(results), "reference copies"), "reference copies").results
