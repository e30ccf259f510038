"""A writer process for the concurrency and crash tests (tests/test_db_concurrency.py).

    python tests/db_writer.py URL WORKER RUNS     # RUNS runs, each with one result of every kind
    python tests/db_writer.py URL WORKER forever  # one run, matmul results until killed

Prints one line per committed result in ``forever`` mode, so the parent knows
what must survive a SIGKILL.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headroom.db.store import open_store  # noqa: E402
from tests.db_support import fingerprint, results  # noqa: E402


def main(url: str, worker: int, runs: str) -> None:
    with open_store(url, mode="write") as store:
        if runs == "forever":
            run_id = store.start_run(fingerprint(hostname=f"worker-{worker}"), suite="crash", benchmark_version="1")
            print(run_id, flush=True)
            for i in range(10**9):
                store.add_result(run_id, results(seed=i)[0])
                print(i, flush=True)
        for i in range(int(runs)):
            # Every other run shares one fingerprint across all workers: concurrent inserts of one box.
            host = "shared" if i % 2 else f"worker-{worker}"
            with store.recording(fingerprint(hostname=host), suite="standard", benchmark_version="1",
                                 labels={"worker": str(worker), "run": str(i)}) as run_id:
                for result in results(seed=worker * 1000 + i):
                    store.add_result(run_id, result)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
