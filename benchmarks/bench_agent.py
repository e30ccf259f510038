"""Agent timings on a quiet and on a busy host: the CPU smoke suite's wall time and what its figures are worth.

    python benchmarks/bench_agent.py [--load N]

Runs the CPU smoke suite twice into a temporary store: quiet, then next to
``--load`` busy processes this script starts itself (default: one per CPU).
For each it prints the suite's wall time split by kind, the results flagged
busy (agent/host_load.py), and the ratio of the stored fp32 matmul rate
(512^3) and copy bandwidth to a careful measurement taken just before on the
quiet host: the best of 20 blocks of at least 50 ms each, the same tensors.
A ratio near 1 quiet says the suite's quick figures are the box's; under
load the ratio says how far a busy box's figures fall, and the busy count
whether the results say so.

Target (issue 14): the quiet smoke suite under 30 s on 2 cores.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from collections import defaultdict

import torch

from headroom.agent.bench_elementwise import streaming_elements
from headroom.agent.runner import run_suite
from headroom.db.models import ElementwiseResult, MatmulResult
from headroom.db.store import open_store

CPU = torch.device("cpu")
MATMUL_N = 512
"""The smoke suite's largest square matmul."""


def careful_s(fn, min_block_s: float = 0.05, blocks: int = 20) -> float:
    """Seconds per call: the best of ``blocks`` blocks of calls, each at least ``min_block_s`` long."""
    fn()
    start = time.perf_counter()
    fn()
    calls = max(1, int(min_block_s / max(time.perf_counter() - start, 1e-9)) + 1)
    best = float("inf")
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def reference() -> dict[str, float]:
    """Careful fp32 matmul TFLOP/s at 512^3 and copy GB/s at the smoke suite's copy size."""
    a, b = torch.randn(MATMUL_N, MATMUL_N), torch.randn(MATMUL_N, MATMUL_N)
    matmul = 2 * MATMUL_N**3 / careful_s(lambda: a @ b) / 1e12
    elements = streaming_elements(CPU, "fp32", 8 * 2**20)
    x = torch.randn(elements // 1024, 1024)
    out = torch.empty_like(x)
    copy = 2 * x.numel() * 4 / careful_s(lambda: out.copy_(x)) / 1e9
    return {"matmul": matmul, "copy": copy}


def smoke(label: str, careful: dict[str, float]) -> None:
    with tempfile.TemporaryDirectory() as tmp, open_store(f"sqlite:///{tmp}/bench.db", mode="write") as store:
        report = run_suite(store, CPU, "smoke", quiet=True)
    by_kind: dict[str, float] = defaultdict(float)
    for (case, _), seconds in zip(report.rows, report.case_seconds, strict=True):
        by_kind[case.kind] += seconds
    ok = [row for _, row in report.rows if row.status == "ok"]
    busy = [row for row in ok if ((row.details or {}).get("host") or {}).get("busy")]
    matmul = max((r.tflop_per_s for r in ok if isinstance(r, MatmulResult) and r.dtype == "fp32"
                  and (r.m, r.n, r.k) == (MATMUL_N,) * 3), default=float("nan"))
    copy = next((r.gb_per_s for r in ok if isinstance(r, ElementwiseResult) and r.op == "copy"), float("nan"))
    split = ", ".join(f"{kind} {seconds:.1f} s" for kind, seconds in by_kind.items())
    print(f"{label}: smoke suite {report.seconds:.1f} s ({split}); {len(busy)} of {len(ok)} results flagged busy")
    print(f"  fp32 matmul {MATMUL_N}^3 {matmul:.4f} TFLOP/s = {matmul / careful['matmul']:.2f} x careful; "
          f"copy {copy:.1f} GB/s = {copy / careful['copy']:.2f} x careful")


def _spin(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1,
                        help="busy processes for the loaded run (default: one per CPU)")
    args = parser.parse_args()
    careful = reference()
    print(f"careful (quiet, best of 20 blocks >= 50 ms): fp32 matmul {MATMUL_N}^3 {careful['matmul']:.4f} TFLOP/s, "
          f"copy {careful['copy']:.1f} GB/s; threads {torch.get_num_threads()}, CPUs {os.cpu_count()}")
    smoke("quiet", careful)
    stop_at = time.monotonic() + 600
    spinners = [multiprocessing.Process(target=_spin, args=(stop_at,), daemon=True) for _ in range(args.load)]
    for p in spinners:
        p.start()
    try:
        smoke(f"with {args.load} busy processes", careful)
    finally:
        for p in spinners:
            p.terminate()
            p.join()


if __name__ == "__main__":
    main()
