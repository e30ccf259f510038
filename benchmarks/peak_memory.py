"""Run a ``headroom`` command in a fresh interpreter and read its peak memory and wall time.

The peak is the child's own high-water mark (VmHWM in /proc/self/status,
read at exit), not ``ru_maxrss`` of children, which would carry the largest
earlier child, or this process's peak over the exec. Linux only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_WRAPPER = """
import atexit, runpy, sys
def _peak(path=sys.argv[1]):
    with open('/proc/self/status') as status, open(path, 'w') as out:
        out.write(next(line.split()[1] for line in status if line.startswith('VmHWM:')))
atexit.register(_peak)
sys.argv = ['headroom', *sys.argv[2:]]
runpy.run_module('headroom.cli.main', run_name='__main__')
"""


@dataclass(frozen=True, slots=True)
class Measured:
    returncode: int
    stdout: str
    stderr: str
    peak_mib: float
    wall_s: float


def run_headroom(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> Measured:
    """``headroom ARGS`` in a fresh Python; what it printed, its exit status, peak memory (MiB) and wall time."""
    with tempfile.TemporaryDirectory(prefix="headroom-peak-") as scratch:
        report = Path(scratch) / "peak"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", _WRAPPER, str(report), *args], capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})
        wall = time.perf_counter() - started
        peak = int(report.read_text()) / 1024 if report.exists() else float("nan")
    return Measured(done.returncode, done.stdout, done.stderr, peak, wall)
