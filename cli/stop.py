"""Stop signals as Ctrl-C: SIGTERM and SIGHUP raise where Ctrl-C raises KeyboardInterrupt, so that what cleans
up after Ctrl-C (a run marked aborted, a half-written export removed) cleans up after them too."""

from __future__ import annotations

import argparse
import contextlib
import functools
import signal
import sys
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""What stops an agent besides Ctrl-C: ``kill``, Slurm's scancel, a deleted pod, ``docker stop`` and ``timeout``
send SIGTERM; a closed terminal sends SIGHUP."""


class Stopped(KeyboardInterrupt):
    """A stop signal, raised where Ctrl-C raises KeyboardInterrupt, so that what handles Ctrl-C handles it
    too: the store's `recording` marks the run aborted, keeping its finished results."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def status(self) -> int:
        """The exit status of a process the signal ended, as shells report it: 128 + the signal."""
        return 128 + self.signum


@contextlib.contextmanager
def stop_signals():
    """Raise `Stopped` on a `STOP_SIGNALS` signal while the block runs; the previous handlers are restored after.

    Without it SIGTERM ends the process where it stands and its run stays ``running`` in the store for good.
    A signal ignored already stays ignored (``nohup`` keeps a hangup from stopping the agent), a handler
    installed outside Python (which could not be restored) is left alone, and only the main thread may
    install handlers: anywhere else nothing changes. The first signal stops the command; repeats are ignored
    until the block ends, so that one cannot cut short the marking of the run as aborted.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    previous = {sig: handler for sig in STOP_SIGNALS
                if (handler := signal.getsignal(sig)) not in (signal.SIG_IGN, None)}

    def stop(signum: int, _frame) -> None:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    for sig in previous:
        signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stoppable(command):
    """A command that a stop signal ends as Ctrl-C does (`stop_signals`), with exit status 128 + the
    signal. Stopped during a run, the command names the run it aborted (`interrupted`); before or after one,
    this says what stopped it."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            with stop_signals():
                return command(args)
        except Stopped as stop:
            print(f"headroom: stopped by {stop}", file=sys.stderr)
            return stop.status

    return run
