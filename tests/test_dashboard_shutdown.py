"""Stopping ``headroom dashboard`` ends its server whatever the server does with the signal: one that ignores
it (as Streamlit's own stop can, waiting without bound on a browser connection) is killed after the grace
period, or at once on a second signal; one that exits on it is left to exit. Each test runs the real CLI in a
process, with a small Python script standing in for Streamlit."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import headroom.cli.dashboard

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_BUNDLE = ROOT / "tests" / "data" / "reference" / "nvidia-h200-2026-11-30.json.gz"
WAIT_S = 60
"""Bound on every wait: reached only when stopping hangs, so the test fails instead of the suite hanging."""

DRIVER = """
import subprocess, sys
import headroom.cli.dashboard as dashboard
from headroom.cli.main import main

grace, server, *args = sys.argv[1:]
dashboard.STOP_GRACE_S = float(grace)
dashboard.command = lambda host, port: [sys.executable, "-c", server]
started = []


class Recorded(subprocess.Popen):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        started.append(self)


dashboard.subprocess.Popen = Recorded
status = main(["dashboard", *args])
print("server status", started[0].returncode, flush=True)
sys.exit(status)
"""
"""``headroom dashboard ARGS`` with the stand-in for Streamlit and the grace period given; it prints the
server's exit status as it reaped it (-9: killed by SIGKILL) and exits with the CLI's status."""

HANDLERS_SET = """
import os, signal, time
status = f"/proc/{os.getppid()}/status"
while os.path.exists(status) and not int(
        next(line for line in open(status) if line.startswith("SigCgt:")).split()[1], 16) >> (signal.SIGHUP - 1) & 1:
    time.sleep(0.01)
"""
"""Each stand-in's start: on Linux it waits until the CLI catches SIGHUP, the last stop signal ``serve`` takes
over once it has started the server, so that its "ready" means a signal now goes to ``serve``'s handler."""

IGNORES_STOP = HANDLERS_SET + """
import signal, time
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(3600)
"""

NOTES_STOP = HANDLERS_SET + """
import signal, time
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda signum, _frame: print("got", signum, flush=True))
print("ready", flush=True)
while True:
    time.sleep(3600)
"""
"""Does not stop either, but says each signal it got."""

EXITS_ON_STOP = HANDLERS_SET + """
import time
print("ready", flush=True)
time.sleep(3600)
"""
"""SIGTERM's default action ends it."""

STOPS_CLEANLY = HANDLERS_SET + """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
print("ready", flush=True)
time.sleep(3600)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dashboard_running(grace_s: float, server: str, *args: str, env: dict[str, str] | None = None):
    """``headroom dashboard ARGS`` (default: a free ``--port``) with ``server`` standing in for Streamlit."""
    dashboard = Dashboard(grace_s, server, *args, env=env)
    try:
        yield dashboard
    finally:
        dashboard.close()


class Dashboard:
    """``headroom dashboard`` in its own session (so a failed test can kill it and its server), its stdout
    read line by line on a thread."""

    def __init__(self, grace_s: float, server: str, *args: str, env: dict[str, str] | None = None) -> None:
        env = {k: v for k, v in (env or os.environ).items() if k != "HEADROOM_DB"}
        args = args or ("--port", str(_free_port()))
        self.process = subprocess.Popen([sys.executable, "-c", DRIVER, str(grace_s), server, *args], cwd=ROOT,
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, wanted: str) -> None:
        """Wait for the line ``wanted`` on stdout."""
        try:
            while self.lines.get(timeout=WAIT_S) != wanted:
                pass
        except queue.Empty:
            pytest.fail(f"headroom dashboard printed no {wanted!r} in {WAIT_S} s")

    def stop(self, signum: int) -> tuple[int, str]:
        """Send ``signum`` to the CLI alone and wait for it: its exit status, and the server's as it was reaped
        ("-9": killed by SIGKILL)."""
        self.process.send_signal(signum)
        status = self.process.wait(timeout=WAIT_S)
        self.reader.join(timeout=WAIT_S)
        lines = []
        while not self.lines.empty():
            lines.append(self.lines.get())
        assert lines and lines[-1].startswith("server status "), (status, lines, self.process.stderr.read())
        return status, lines[-1].removeprefix("server status ")

    def close(self) -> None:
        """Kill what is left of it (a test that failed) and close its pipes."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=WAIT_S)
        self.process.stdout.close()
        self.process.stderr.close()


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace_period():
    with dashboard_running(0.5, IGNORES_STOP) as dashboard:
        dashboard.expect("ready")
        assert dashboard.stop(signal.SIGTERM) == (143, "-9")


def test_a_second_ctrl_c_kills_the_server_at_once():
    """With an hour's grace, only the second signal can have ended it."""
    with dashboard_running(3600, NOTES_STOP) as dashboard:
        dashboard.expect("ready")
        dashboard.process.send_signal(signal.SIGINT)
        dashboard.expect(f"got {signal.SIGINT.value}")  # forwarded, and ignored
        assert dashboard.stop(signal.SIGINT) == (130, "-9")


def test_a_server_that_stops_on_the_signal_is_not_killed():
    """A grace far longer than these servers need: each ends of the signal it was handed."""
    with dashboard_running(WAIT_S, EXITS_ON_STOP) as dashboard:
        dashboard.expect("ready")
        assert dashboard.stop(signal.SIGTERM) == (143, f"-{signal.SIGTERM.value}")
    with dashboard_running(WAIT_S, EXITS_ON_STOP) as dashboard:
        dashboard.expect("ready")
        assert dashboard.stop(signal.SIGHUP) == (129, f"-{signal.SIGHUP.value}")
    with dashboard_running(WAIT_S, STOPS_CLEANLY) as dashboard:
        dashboard.expect("ready")
        assert dashboard.stop(signal.SIGTERM) == (143, "0")


def test_a_killed_server_still_leaves_no_bundle_store_behind(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ) | {"TMPDIR": str(scratch), "XDG_DATA_HOME": str(tmp_path)}
    with dashboard_running(0.5, IGNORES_STOP, "--bundle", str(REFERENCE_BUNDLE), "--port", str(_free_port()),
                           env=env) as dashboard:
        dashboard.expect("ready")
        assert [p.name.startswith("headroom-bundle-") for p in scratch.iterdir()] == [True]
        assert dashboard.stop(signal.SIGTERM) == (143, "-9")
    assert list(scratch.iterdir()) == []


def test_a_server_that_exits_by_itself_gives_its_status_and_the_handlers_back():
    before = {sig: signal.getsignal(sig) for sig in headroom.cli.dashboard.STOP_SIGNALS}
    assert headroom.cli.dashboard.serve([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ)) == 3
    assert {sig: signal.getsignal(sig) for sig in headroom.cli.dashboard.STOP_SIGNALS} == before
