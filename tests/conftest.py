from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def headroom(tmp_path_factory):
    """Run the CLI in a subprocess, as a user would: returns CompletedProcess.

    The default store lives in a fresh XDG data directory, so no test reads a
    developer's own ~/.local/share/headroom.
    """
    env = {k: v for k, v in os.environ.items() if k != "HEADROOM_DB"}
    env["XDG_DATA_HOME"] = str(tmp_path_factory.mktemp("xdg"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=300, env=env
        )

    return run


@pytest.fixture(scope="session")
def smoke_store(tmp_path_factory):
    """One CPU smoke run (micro-benchmarks and training steps) in a fresh SQLite store, shared by tests.

    Returns (url, RunReport).
    """
    torch = pytest.importorskip("torch")
    from agent.runner import run_suite
    from db.store import open_store

    url = f"sqlite:///{tmp_path_factory.mktemp('smoke') / 'results.db'}"
    with open_store(url, mode="write") as store:
        report = run_suite(store, torch.device("cpu"), "smoke", quiet=True)
    return url, report
