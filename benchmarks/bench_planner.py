"""Planner speed: candidates evaluated per second on a full llama3-70b plan.

    python benchmarks/bench_planner.py

Varies data-parallel ranks and sharding stages at s=8192 and prints, per plan,
the candidates evaluated, the wall time and the rate. Target: one plan well
under 0.5 s on a 2-core CPU.
"""

from __future__ import annotations

import time

from core.hardware import get_hardware
from core.planner import PlanRequest, plan
from core.presets import get_preset
from core.timing import datasheet_profile


def main() -> None:
    profile = datasheet_profile(get_hardware("h100-sxm"))
    spec = get_preset("llama3-70b")
    print(f"{'dp':>4} {'zero':>4} {'candidates':>10} {'fitting':>8} {'seconds':>8} {'cand/s':>8}")
    total_candidates, total_s = 0, 0.0
    for dp in (16, 32, 64, 128):
        for zero in (1, 2, 3):
            request = PlanRequest(spec=spec, seq_len=8192, global_batch=2 * dp * 8, dp=dp, zero=zero)
            start = time.perf_counter()
            result = plan(request, profile, advise=False)
            elapsed = time.perf_counter() - start
            n = len(result.candidates) + len(result.rejected)
            total_candidates, total_s = total_candidates + n, total_s + elapsed
            print(f"{dp:>4} {zero:>4} {n:>10} {len(result.candidates):>8} {elapsed:>8.3f} {n / elapsed:>8.0f}")
    print(f"all: {total_candidates} candidates in {total_s:.2f} s = {total_candidates / total_s:.0f} candidates/s, "
          f"{total_s / 12:.3f} s per plan")


if __name__ == "__main__":
    main()
