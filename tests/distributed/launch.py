"""Run tests/distributed/worker.py under ``torch.distributed.run`` and read what each rank wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class LaunchError(RuntimeError):
    """The launch failed or ran past its timeout; the message carries the ranks' output."""


def launch(world_size: int, suites: list[str], *, timeout_s: float = 180.0,
           collective_timeout_s: float = 60.0, out_dir: Path | None = None) -> list[dict]:
    """Measure ``suites`` on ``world_size`` CPU processes (gloo); return each rank's record, by rank.

    The launcher runs in its own process group: on a timeout the whole group
    (launcher and ranks) is killed, so nothing is left waiting on a collective.
    """
    with tempfile.TemporaryDirectory(prefix="headroom-dist-") as scratch:
        out = out_dir or Path(scratch)
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world_size), "--standalone",
            "--max-restarts", "0", "--module", "tests.distributed.worker",
            "--out", str(out), "--timeout-s", str(collective_timeout_s), "--suites", *suites,
        ]
        env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
            filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            raise LaunchError(f"{world_size} ranks ran past {timeout_s:g} s:\n{output[-4000:]}") from None
        if process.returncode != 0:
            raise LaunchError(f"{world_size} ranks failed (exit {process.returncode}):\n{output[-4000:]}")
        records = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world_size)]
    return records
