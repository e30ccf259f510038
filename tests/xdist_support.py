"""Tests under pytest-xdist (``python -m pytest -n auto``): which worker this is, and fixtures built once a run.

Each worker is a pytest session of its own, so a session fixture is built once per worker that asks for it.
The few that cost processes (the smoke run, the multi-rank fleet, the two-rank TP/FSDP/DDP launch, the GPU
check kit, Liger's interpreted kernels) go through ``once_per_run`` instead.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

WORKER = os.environ.get("PYTEST_XDIST_WORKER")
"""This process's name among pytest-xdist's workers (``-n``: gw0, gw1, ...); None when pytest runs alone."""


def once_per_run(tmp_path_factory, name: str, build: Callable[[Path], Any]) -> Any:
    """What ``build(folder)`` returns (JSON: lists for tuples), built once per test run.

    ``build`` makes what it needs under ``folder`` and returns its description. Alone, a session fixture
    is built once anyway. Under pytest-xdist each worker has its own session, so the first worker to ask
    builds it under a lock in the run's shared temporary folder and the others wait and read the value:
    a fixture of 15-40 s of processes is paid once, not once per worker.
    """
    if not WORKER:
        return json.loads(json.dumps(build(tmp_path_factory.mktemp(name))))
    shared = tmp_path_factory.getbasetemp().parent  # this run's, above each worker's own basetemp
    value = shared / f"{name}.json"
    with FileLock(shared / f"{name}.lock"):
        if value.exists():
            return json.loads(value.read_text())
        folder = shared / name
        shutil.rmtree(folder, ignore_errors=True)  # a build that raised in another worker
        folder.mkdir()
        described = json.dumps(build(folder))
        value.write_text(described)
        return json.loads(described)
