"""Predicted vs measured training steps in a store: the check behind issue 6's GPU target.

    python benchmarks/compare_train.py --db sqlite:///results.db [--device NAME]

For every ``ok`` training step, prints the core's prediction made at
measurement time next to what was measured: peak allocated memory (CUDA) or
saved-activation bytes (CPU), and step time; then the median and worst
absolute error. Target on a GPU (issue 6): peak memory error median <= 3%,
worst <= 8%.

The GPU check itself, on a box with CUDA:

    headroom agent train --model llama3.2-1b --seq-len 2048 --micro-batch 1,2,4,8 \\
        --recompute none,full,every-2,selective,op-selective --db sqlite:///gpu.db
    python benchmarks/compare_train.py --db sqlite:///gpu.db
    headroom db export train-gpu.json.gz --db sqlite:///gpu.db
"""

from __future__ import annotations

import argparse
import statistics

from sqlalchemy import select

from headroom.db.models import Fingerprint, Run, TrainStepResult
from headroom.db.store import open_store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="result store URL")
    parser.add_argument("--device", help="only this device name")
    args = parser.parse_args()
    with open_store(args.db) as store, store.session() as session:
        query = (select(TrainStepResult, Fingerprint.device_name)
                 .join(Run, TrainStepResult.run_id == Run.id).join(Fingerprint, Run.fingerprint_id == Fingerprint.id))
        if args.device:
            query = query.where(Fingerprint.device_name == args.device)
        rows = session.execute(query.order_by(TrainStepResult.id)).all()
    memory_errors, time_errors = [], []
    print(f"{'device':<24}{'configuration':<44}{'status':<8}{'memory pred/meas GB':>22}{'err':>8}{'step pred/meas s':>20}{'err':>8}")
    for row, device in rows:
        label = f"{row.model_name} s{row.seq_len} micro {row.micro_batch} x{row.accumulation_steps} {row.recompute}"
        if row.status != "ok":
            print(f"{device[:23]:<24}{label:<44}{row.status:<8}{row.message or ''}")
            continue
        measured = row.peak_allocated_bytes or row.activation_bytes
        predicted = row.predicted_peak_bytes if row.peak_allocated_bytes else row.predicted_activation_bytes
        mem_err = measured / predicted - 1 if measured and predicted else None  # measured / predicted, as calibration
        time_err = row.median_s / row.predicted_step_time_s - 1 if row.predicted_step_time_s else None
        if mem_err is not None:
            memory_errors.append(abs(mem_err))
        if time_err is not None:
            time_errors.append(abs(time_err))
        mem = f"{predicted / 1e9:.3f}/{measured / 1e9:.3f}" if mem_err is not None else "-"
        step = f"{row.predicted_step_time_s:.4f}/{row.median_s:.4f}" if time_err is not None else f"-/{row.median_s:.4f}"
        print(f"{device[:23]:<24}{label:<44}{'ok':<8}{mem:>22}{_pct(mem_err):>8}{step:>20}{_pct(time_err):>8}")
    for name, errors in (("memory", memory_errors), ("step time", time_errors)):
        if errors:
            print(f"{name}: |error| median {statistics.median(errors):.1%}, worst {max(errors):.1%} over {len(errors)} steps")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


if __name__ == "__main__":
    main()
