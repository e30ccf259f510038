"""Progress for long suites: a bar with ETA on a terminal, one line per case in a log."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from headroom.core.units import format_duration


class Progress:
    """ETA scales the remaining cases' expected times by how fast the finished ones actually went."""

    def __init__(self, expected_s: list[float], stream: TextIO | None = None, quiet: bool = False) -> None:
        """``stream``: where it writes, by default the ``sys.stderr`` of the moment it is made (a default bound
        when the module was imported can be a stream closed since, a test's captured stderr)."""
        self.expected_s = expected_s
        self.stream = stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = not quiet and stream.isatty()
        self.done = 0
        self.started = time.perf_counter()

    def eta_s(self) -> float:
        spent = time.perf_counter() - self.started
        expected_done = sum(self.expected_s[: self.done]) or 1e-9
        return sum(self.expected_s[self.done :]) * spent / expected_done if self.done else sum(self.expected_s)

    def update(self, name: str, outcome: str = "") -> None:
        """Call with an empty outcome when a case starts, and with its outcome when it ends."""
        if self.quiet:
            return
        total = len(self.expected_s)
        if outcome:
            self.done += 1
        if self.tty:
            width = 24
            filled = width * self.done // max(1, total)
            line = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{total} {name[:48]:<48} ETA {format_duration(self.eta_s())}"
            self.stream.write("\r" + line + ("\n" if self.done == total and outcome else ""))
        elif outcome:
            self.stream.write(f"[{self.done}/{total}] {name}: {outcome}\n")
        self.stream.flush()
