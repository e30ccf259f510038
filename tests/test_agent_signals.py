"""The agent stopped by a signal other than Ctrl-C (``kill``, Slurm's scancel, a pod deleted, ``docker stop``,
``timeout``, a closed terminal): its run is marked ``aborted`` as Ctrl-C marks it, not left ``running``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from headroom.cli.stop import Stopped, stop_signals
from headroom.db import queries
from headroom.db.errors import StoreError
from headroom.db.store import open_store

STARTUP_S = 120
"""Bound on the agent starting its run: importing torch on a loaded 2-core box takes seconds, not minutes."""


def _statuses(url: str) -> dict[str, int]:
    """Runs by status; none while the writer has not yet created the store."""
    try:
        with open_store(url) as store, store.session() as session:
            return queries.runs_by_status(session)
    except StoreError:
        return {}


def test_sigterm_marks_the_run_aborted_and_exits_143(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    env = {k: v for k, v in os.environ.items() if k != "HEADROOM_DB"} | {"XDG_DATA_HOME": str(tmp_path)}
    # A sweep of 1,000-step configurations: minutes of work, so the signal lands mid-run.
    agent = subprocess.Popen(
        [sys.executable, "-m", "headroom.cli.main", "agent", "train", "--model", "bench-llama-tiny", "--seq-len", "32",
         "--micro-batch", "1,2,4", "--recompute", "none,full", "--steps", "1000", "--device", "cpu", "--db", url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        deadline = time.monotonic() + STARTUP_S
        while _statuses(url) != {"running": 1}:
            assert agent.poll() is None, agent.communicate()[1]
            assert time.monotonic() < deadline, "the agent recorded no run start"
            time.sleep(0.1)
        agent.send_signal(signal.SIGTERM)
        _, stderr = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
    assert agent.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"interrupted by SIGTERM: the run is marked aborted; its finished results are kept in {url}")
    assert _statuses(url) == {"aborted": 1}


def test_stop_signals_raise_while_installed_and_are_restored_after():
    assert threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        with pytest.raises(Stopped) as stopped, stop_signals():
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(10)  # the handler raises from here
        assert stopped.value.signum == signal.SIGHUP and stopped.value.status == 129
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup: a hangup is not a stop
        with stop_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


def test_stop_signals_installs_nothing_off_the_main_thread():
    found = []

    def enter() -> None:
        with stop_signals():
            found.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    worker = threading.Thread(target=enter)
    worker.start()
    worker.join(timeout=10)
    assert found == [before]
