"""``headroom dashboard``: the Streamlit dashboard over a result store, bound to localhost by default."""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from headroom.core.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "dashboard",
        help="open the dashboard: plans, hardware rooflines, history across boxes, calibration",
        description="Start the Streamlit dashboard over a result store (read-only). It listens on 127.0.0.1 "
        "only; --host 0.0.0.0 exposes it to the network. Example: headroom dashboard --db results.db --port 8501",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("--db", help="result store URL (default: HEADROOM_DB or the default SQLite file; see `headroom db info`)")
    source.add_argument("--bundle", type=Path, metavar="PATH",
                        help="show a bundle instead of a store, e.g. a GPU check's reference data "
                        "(tests/data/reference/*.json.gz): it is loaded into a temporary store, deleted on exit")
    p.add_argument("--port", type=int, default=8501, help="port to listen on (default 8501)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, this machine only; 0.0.0.0 for every interface)")
    p.set_defaults(handler=run)


def command(host: str, port: int) -> list[str]:
    """The Streamlit command line for the dashboard."""
    app = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
    return [
        sys.executable, "-m", "streamlit", "run", str(app),
        "--server.address", host, "--server.port", str(port), "--server.headless", "true",
        "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer",
    ]


def check_host(host: str) -> None:
    """An address this machine can bind: an IP literal or a name it resolves (checked before Streamlit starts,
    which would otherwise fail with a traceback)."""
    try:
        socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError, ValueError) as err:
        raise ConfigError(f"--host {host!r} is not an address or a name this machine resolves "
                          f"({getattr(err, 'strerror', None) or err}); e.g. 127.0.0.1 or 0.0.0.0") from None


def check_port(host: str, port: int) -> None:
    """Refuse a port this machine cannot listen on, before the URL is printed: Streamlit would say it was
    serving there and only then stop ("Port 8501 is not available"). A port in use names a free one nearby."""
    try:
        _bind_probe(host, port)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            free = next((p for p in range(port + 1, min(port + 21, 65536)) if _can_bind(host, p)), None)
            raise ConfigError(f"port {port} on {host} is already in use (another dashboard or server listens there); "
                              "start this one on a free port with --port"
                              + (f", e.g. --port {free}" if free else "")) from None
        if err.errno == errno.EACCES:
            raise ConfigError(f"port {port} on {host} needs privileges this user does not have (ports below 1024 "
                              "do); choose another with --port, e.g. --port 8501") from None
        raise ConfigError(f"cannot listen on {host} port {port}: {err.strerror or err}; check --host (an address "
                          "of this machine, e.g. 127.0.0.1 or 0.0.0.0) and --port") from None


def _bind_probe(host: str, port: int) -> None:
    """Bind ``host``:``port`` as Streamlit's server does (SO_REUSEADDR but on Windows, so a port left in
    TIME_WAIT passes), listen on nothing, and let go. OSError when it cannot."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        if os.name != "nt":
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


def _can_bind(host: str, port: int) -> bool:
    try:
        _bind_probe(host, port)
    except OSError:
        return False
    return True


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {args.port}")
    check_host(args.host)
    check_port(args.host, args.port)
    try:
        import streamlit  # noqa: F401
    except ModuleNotFoundError:
        raise ConfigError("the dashboard needs its extra: pip install 'headroom[dashboard]'") from None
    env = dict(os.environ)
    if args.db:
        from headroom.db.location import resolve_url

        env["HEADROOM_DB"] = resolve_url(args.db)  # refuses what no store can be named (a NUL, not UTF-8)
    with tempfile.TemporaryDirectory(prefix="headroom-bundle-") as scratch:
        if args.bundle is not None:
            env["HEADROOM_DB"] = load_bundle(args.bundle, Path(scratch))
        print(f"headroom dashboard: http://{args.host}:{args.port}  (Ctrl-C stops it)", flush=True)
        return serve(command(args.host, args.port), env)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

STOP_GRACE_S = 5.0
"""Seconds Streamlit gets to exit after a stop signal before it is killed. Its own stop has no bound: uvicorn's
graceful shutdown waits for every browser connection to close, one whose browser stopped reading never does,
and a second signal only asks again."""


def serve(cmd: list[str], env: dict[str, str]) -> int:
    """Run Streamlit until it exits, handing it the first stop signal this process gets (Ctrl-C, ``kill``, a
    closed terminal), so that stopping ``headroom dashboard`` stops the server it started and then removes a
    bundle's temporary store. Streamlit still running ``STOP_GRACE_S`` later, or at a second stop signal, is
    killed (SIGKILL). Stopped by a signal: 128 + its number, as ``agent run`` (130 Ctrl-C, 143 SIGTERM, 129
    SIGHUP); else Streamlit's exit status."""
    server = subprocess.Popen(cmd, env=env)
    stopped: list[int] = []
    deadline = threading.Timer(STOP_GRACE_S, server.kill)
    deadline.daemon = True

    def forward(signum: int, _frame) -> None:
        stopped.append(signum)
        if len(stopped) == 1:
            server.send_signal(signum)
            deadline.start()
        else:
            server.kill()

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        status = server.wait()
    finally:
        deadline.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if server.poll() is None:  # this process is leaving for another reason: take the server with it
            server.terminate()
            try:
                server.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    return 128 + stopped[0] if stopped else status


def load_bundle(path: Path, scratch: Path) -> str:
    """A store in ``scratch`` holding the bundle's runs; its URL. A bad bundle is refused before anything is written."""
    from headroom.db.bundle import import_file

    report, url = import_file(path, f"sqlite:///{scratch / 'bundle.db'}")
    print(f"headroom dashboard: {path}: {report}", flush=True)
    return url
