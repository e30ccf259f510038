from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.xdist_support import WORKER, once_per_run

FIXTURES = Path(__file__).parent / "fixtures"

if WORKER:
    # One thread per worker: torch's OpenMP pool spins while it waits, and two workers' pools on two cores
    # took 6-13x as long over the in-process autograd tests. Set before any test module imports torch.
    os.environ["OMP_NUM_THREADS"] = "1"


def pytest_collection_modifyitems(config, items):
    """Under workers, slow tests first: each starts a process or a launch, and begun early they run beside the
    quick ones instead of leaving one worker busy at the end. Alone, the files' order stands."""
    if WORKER:
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def headroom(tmp_path_factory):
    """Run the CLI in a subprocess, as a user would: returns CompletedProcess.

    The default store lives in a fresh XDG data directory, so no test reads a
    developer's own ~/.local/share/headroom. Without $COLUMNS (a developer's
    own is not passed on) the text is wrapped at the width of a pipe
    (headroom.cli.wrap).
    """
    env = {k: v for k, v in os.environ.items() if k not in ("HEADROOM_DB", "COLUMNS")}
    env["XDG_DATA_HOME"] = str(tmp_path_factory.mktemp("xdg"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "headroom.cli.main", *args], capture_output=True, text=True, timeout=300, env=env
        )

    return run


@pytest.fixture
def run_cli(monkeypatch, tmp_path_factory, capsys):
    """Run the CLI in this process: ``main(args)``, returned like `headroom`'s CompletedProcess.

    For tests where the process is not the point (a start-up costs a second, several with transformers or
    torch to import): the exit status, stdout and stderr are main's. Warnings go to stderr as a fresh
    interpreter's default filters would print them, so a test that stderr is one line still sees them.
    What only a process shows (imports at start-up, signals, peak memory) stays with `headroom`.
    """
    import warnings

    from headroom.cli.main import main

    monkeypatch.delenv("HEADROOM_DB", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)  # a test that sets its own sets it after this
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg")))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        with warnings.catch_warnings(record=True) as caught:
            warnings.resetwarnings()
            warnings.simplefilter("default")
            for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.filterwarnings("ignore", category=quiet)
            try:
                code = main(list(args))
            except SystemExit as exit:  # argparse: --help, --version, a usage error
                code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
        out, err = capsys.readouterr()
        err += "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught)
        return subprocess.CompletedProcess(["headroom", *args], code, out, err)

    return run


@pytest.fixture
def plan_json(run_cli):
    """Run ``headroom plan ... --json --top 0`` in this process and return its document; a failed plan fails the
    test with its stderr."""
    import json

    def run(*args: str) -> dict:
        result = run_cli("plan", *args, "--json", "--top", "0")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    return run


class SmokeStore(NamedTuple):
    url: str
    device_name: str
    """The name the run stored for this CPU."""


@pytest.fixture(scope="session")
def smoke_store(tmp_path_factory) -> SmokeStore:
    """One CPU smoke run (micro-benchmarks and training steps) in a fresh SQLite store, shared by tests."""
    torch = pytest.importorskip("torch")

    def build(folder: Path) -> list[str]:
        from headroom.agent.runner import run_suite
        from headroom.db.store import open_store

        url = f"sqlite:///{folder / 'results.db'}"
        with open_store(url, mode="write") as store:
            report = run_suite(store, torch.device("cpu"), "smoke", quiet=True)
        return [url, report.device_name]

    return SmokeStore(*once_per_run(tmp_path_factory, "smoke", build))


@pytest.fixture(scope="session")
def two_ranks(tmp_path_factory) -> list[dict]:
    """Tensor parallelism, FSDP2, DDP, expert parallelism and torch's ring attention on two gloo ranks (tests/distributed/): each rank's
    record (about 20-30 s on 2 cores), measured once per test run."""
    pytest.importorskip("torch")
    from tests.distributed.launch import launch

    return once_per_run(tmp_path_factory, "two-ranks",
                        lambda folder: launch(2, ["tp", "fsdp", "fsdp-schedule", "ddp", "ep", "cp"]))


@pytest.fixture(scope="session")
def four_ranks(tmp_path_factory) -> list[dict]:
    """FSDP2, its collectives under each resharding setting, and torch's ring attention on four gloo ranks (four processes on however
    many cores there are; slow tests only), measured once per test run."""
    pytest.importorskip("torch")
    from tests.distributed.launch import launch

    return once_per_run(tmp_path_factory, "four-ranks", lambda folder: launch(4, ["fsdp", "fsdp-schedule", "cp"]))


MARKUP_NAME = "[click here](https://evil.example) ![x](https://evil.example/p.png) *GPU*"
"""A device name a forged bundle could carry: Markdown that would render as a link and a remote image."""


@pytest.fixture(scope="session")
def markup_store(smoke_store, tmp_path_factory):
    """A copy of the smoke store whose device is named ``MARKUP_NAME``; returns its URL."""
    import sqlite3

    source = sqlite3.connect(smoke_store[0].removeprefix("sqlite:///"))
    path = tmp_path_factory.mktemp("markup") / "results.db"
    copy = sqlite3.connect(path)
    source.backup(copy)
    with copy:
        copy.execute("UPDATE fingerprints SET device_name = ?", (MARKUP_NAME,))
    source.close()
    copy.close()
    return f"sqlite:///{path}"
