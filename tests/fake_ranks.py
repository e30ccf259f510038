"""Stand-in ranks for headroom.agent.train_ranks under torch's launcher: the same protocol, no training.

Each setup is begun and reported at once, with the rank's process id and the
setup's place in the launch, except where the setup's ``steps`` asks for a
failure (rank 1 fails it, rank 0 waits as on a collective until the launcher
stops it):

- ``FAIL_STEPS``: rank 1 reports an error row and exits 1, as a real rank does.
- ``CRASH_STEPS``: rank 1 exits 1 without a word, as a killed process would.
- ``BROKEN_STEPS`` on the first setup: every rank exits before beginning any
  setup, as a broken environment would make it.

Rank 1 fails a setup only once rank 0 has reported its row for it (`_arrive`,
`_await_rank_0`): real ranks meet in a collective at every step, so neither
runs ahead of the other, while these stand-ins would; rank 1 could fail and
have the launcher stop rank 0 before rank 0 had reported the setups before.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from headroom.agent.launch import (
    emit,  # the standard library only: these ranks start in milliseconds
)


def begin_key(index: int) -> str:  # headroom.agent.train_ranks' keys (tests/test_launch.py checks they agree)
    return f"begin {index}"


def step_key(index: int) -> str:
    return f"step {index}"


FAIL_STEPS, CRASH_STEPS, BROKEN_STEPS = 13, 14, 15
MEETING_S = 60.0
"""How long rank 1 waits for rank 0 before failing anyway (the test's launch timeout)."""


def _meeting_point(index: int) -> Path:
    """A file rank 0 creates once it has reported setup ``index``; named by this launch's run id."""
    return Path(tempfile.gettempdir()) / f"headroom-fake-ranks-{os.environ['TORCHELASTIC_RUN_ID']}-{index}"


def _arrive(index: int) -> None:
    _meeting_point(index).touch()


def _await_rank_0(index: int) -> None:
    point, deadline = _meeting_point(index), time.monotonic() + MEETING_S
    while not point.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    point.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device-type")
    parser.add_argument("--setups")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    setups = {int(i): doc for i, doc in json.loads(args.setups).items()}
    if next(iter(setups.values()))["steps"] == BROKEN_STEPS:
        return 1
    for position, (index, doc) in enumerate(setups.items(), start=1):
        emit(begin_key(index), rank, {})
        if doc["steps"] in (FAIL_STEPS, CRASH_STEPS) and rank == 0:
            emit(step_key(index), rank, {"details": {"pid": os.getpid(), "setup_in_launch": position}})
            _arrive(index)
            time.sleep(120)  # waiting for rank 1, as in a collective; the launcher stops this process
        if doc["steps"] in (FAIL_STEPS, CRASH_STEPS):
            _await_rank_0(index)
        if doc["steps"] == FAIL_STEPS:
            emit(step_key(index), rank, {"status": "error", "message": "RuntimeError: injected by the test"})
            return 1
        if doc["steps"] == CRASH_STEPS:
            return 1
        emit(step_key(index), rank, {"details": {"pid": os.getpid(), "setup_in_launch": position}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
