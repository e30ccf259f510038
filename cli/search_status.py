"""A status line on a terminal while a layout search runs: how far it is, and about how long is left.

A search over thousands of GPUs tries a thousand layouts and can take tens of seconds; a user staring at a
silent terminal cannot tell it from a hang. The line is drawn on stderr only when stderr is a terminal
(nothing lands in a log, a pipe or the JSON on stdout), only once a search has run for ``after_s`` (a
quick plan prints nothing), at most every ``every_s``, and is erased when the plan is printed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from headroom.core.units import format_duration

ERASE = "\r\033[K"
"""Carriage return, then erase to the end of the line (ANSI)."""


class SearchStatus:
    """A ``headroom.core.planning.planner.SearchProgress`` that draws one line: ``searching layouts of 512 GPUs: 312/832, about
    24s left``. What is left is the layouts left at the pace of those done so far in this search; the pace
    restarts with each search (the advice's searches are named by the change they try)."""

    def __init__(self, stream: TextIO | None = None, *, after_s: float = 1.0, every_s: float = 0.2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.after_s, self.every_s, self.clock = after_s, every_s, clock
        self.begun = clock()
        self.what: str | None = None
        self.paced_from: tuple[float, int] = (self.begun, 0)
        """When this search's pace is counted from, and the layouts done by then."""
        self.last_done = 0
        self.drawn_at: float | None = None

    def __call__(self, done: int, total: int, what: str) -> None:
        if not self.tty:
            return
        now = self.clock()
        if self.what is not None and (what != self.what or done <= self.last_done):
            self.paced_from = (now, done)  # a new search: its pace counts from its first layout done
        self.what, self.last_done = what, done
        if now - self.begun < self.after_s or (self.drawn_at is not None and now - self.drawn_at < self.every_s):
            return
        since, done_then = self.paced_from
        pace = (now - since) / (done - done_then) if done > done_then else None
        left = f", about {format_duration(pace * (total - done))} left" if pace is not None else ""
        self.stream.write(f"{ERASE}searching {what}: {done:,}/{total:,}{left}")
        self.stream.flush()
        self.drawn_at = now

    def close(self) -> None:
        """Erase the line, if one was drawn, so that what is printed next starts a clean line."""
        if self.drawn_at is not None:
            self.stream.write(ERASE)
            self.stream.flush()
            self.drawn_at = None
