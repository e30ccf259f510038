"""Run a module on N local ranks with torch's own launcher, and read the results they print.

The parent (the CLI process, which owns the result store) starts
``python -m torch.distributed.run --nproc-per-node N --standalone -m MODULE``
in a process group of its own. Ranks report each result as one line on
stdout::

    HEADROOM-RESULT {"key": "...", "rank": 0, "row": {...}}

and the parent picks them up as they come (`Launch.result`), so a benchmark
case's row is stored the moment it exists. The launch is bounded: when no
result has come for its timeout, the launch is stopped (the launcher stops
its ranks), so a rank stuck in a collective never leaves the parent
waiting, nor runs on. When a rank dies the
launcher stops the others (``--max-restarts 0``) and `Launch.result` raises
`LaunchFailed` naming the exit, for the results that never came.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

MARKER = "HEADROOM-RESULT "
STOP_GRACE_S = 45.0
"""How long the launcher may take to stop its ranks: it gives each 30 s after SIGTERM before SIGKILL."""
ROOT = Path(__file__).resolve().parents[1]


class LaunchFailed(RuntimeError):
    """The ranks exited, or ran past their deadline, before reporting a result; the message says how."""


def emit(key: str, rank: int, row: dict) -> None:
    """Rank side: report one result to the parent (one line, flushed; lines under 4 KiB stay whole)."""
    sys.stdout.write(MARKER + json.dumps({"key": key, "rank": rank, "row": row}) + "\n")
    sys.stdout.flush()


class Launch:
    """``module`` on ``nproc`` local ranks, started on the first `result` call.

    ``timeout_s`` bounds each wait: from the start to the first result, from each result to the next,
    and from the last to the exit.
    """

    def __init__(self, module: str, nproc: int, args: Sequence[str] = (), *, timeout_s: float,
                 env: dict[str, str] | None = None) -> None:
        if nproc < 1:
            raise ValueError(f"nproc must be >= 1, got {nproc}")
        self.command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                        "--standalone", "--max-restarts", "0", "--module", module, *args]
        self.timeout_s = timeout_s
        self.env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
        self.env |= env or {}
        self.process: subprocess.Popen | None = None
        self.deadline = 0.0
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.tail: collections.deque[str] = collections.deque(maxlen=60)
        self.results: dict[tuple[str, int], dict] = {}
        self.killed = False
        self.failure: str | None = None
        """Why the launch ended early, once it has."""

    def start(self) -> None:
        if self.process is not None:
            return
        self.deadline = time.monotonic() + self.timeout_s
        self.process = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        errors="replace", start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def result(self, key: str, rank: int = 0) -> dict:
        """The row rank ``rank`` reported under ``key``; waits for it. LaunchFailed if it cannot come.
        Interrupted (Ctrl-C, or a stop signal the CLI raises as one), it stops the ranks first."""
        self.start()
        try:
            return self._wait_for(key, rank)
        except KeyboardInterrupt:
            self.kill()
            raise

    def _wait_for(self, key: str, rank: int) -> dict:
        while (key, rank) not in self.results:
            if self.failure is not None:
                raise LaunchFailed(f"no result for {key!r} from rank {rank}: {self.failure}")
            remaining = self.deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(remaining, 0.0)) if remaining > 0 else None
            except queue.Empty:
                line = None
            if line is None:  # the ranks' output ended, or the deadline passed
                self.failure = self._failure()
                continue
            if line.startswith(MARKER):
                found = json.loads(line[len(MARKER):])
                self.results[(found["key"], found["rank"])] = found["row"]
                self.deadline = time.monotonic() + self.timeout_s
            else:
                self.tail.append(line.rstrip("\n"))
        return self.results.pop((key, rank))

    def reported(self, key: str) -> bool:
        """Whether any rank has reported ``key``, among the results read so far and not yet taken."""
        return any(found == key for found, _ in self.results)

    def _failure(self) -> str:
        """Why results stopped coming: the deadline (after killing the ranks) or the launcher's exit."""
        code = self.close()
        if self.killed:
            return f"the ranks reported nothing for {self.timeout_s:g} s and were killed"
        lines = [line for line in self.tail if "rror" in line or "exitcode" in line or "Signal" in line]
        detail = "; ".join(lines[-3:]) if lines else (self.tail[-1] if self.tail else "no output")
        return f"the launch exited with code {code} ({detail[-600:]})"

    def close(self) -> int | None:
        """Wait for the launch to end (killing it past its deadline); its exit code."""
        if self.process is None:
            return None
        try:
            self.process.wait(timeout=max(self.deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            self.kill()
        return self.process.returncode

    def kill(self) -> None:
        """Stop the launch: SIGTERM to the launcher, which stops its ranks (torch starts each in a session of
        its own, out of reach of a signal to the launcher's group) and exits; SIGKILL to the group if it has
        not within `STOP_GRACE_S`."""
        if self.process is not None and self.process.poll() is None:
            self.killed = True
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait()
