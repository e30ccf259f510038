"""Fit the time model's kernel gap and host costs (headroom.core.timing.op_time) to the H200 reference run, and print them.

    python benchmarks/fit_time_constants.py

The only constants of the time model fitted to data, and the only data they are fitted to: the 20 steps of
tests/data/reference without offload (llama3.2-1b, s 2048, micro-batches 1-8, every checkpoint policy). Each
constant is tried over a grid, one at a time, for a few rounds, keeping the value with the least sum of squared
log(measured / predicted). Offload's host bandwidth is solved from the two offload steps alone. What this prints
is what core/timing/op_time.py and core/timing/step.py state, rounded; docs/time-model.md says so.
"""

from __future__ import annotations

import math

from h200_reference import config_of, h200_profile, predicted_s, train_steps

from headroom.core.memory.estimate import estimate
from headroom.core.specs.model import ModelSpec
from headroom.core.timing.op_time import HostCosts
from headroom.core.timing.step import step_time

GRIDS = {
    "kernel_gap_s": [g * 1e-6 for g in (1, 2, 3, 4, 5, 6)],
    "forward_op_s": [g * 1e-6 for g in range(5, 65, 5)],
    "backward_op_s": [g * 1e-6 for g in range(2, 32, 2)],
    "selective_checkpoint_op_s": [g * 1e-6 for g in range(0, 160, 10)],
}


def loss(values: dict[str, float], rows: tuple[dict, ...]) -> float:
    host = HostCosts(**{k: v for k, v in values.items() if k != "kernel_gap_s"})
    profile = h200_profile(host, values["kernel_gap_s"])
    return sum(math.log(r["median_s"] / predicted_s(r, profile)) ** 2 for r in rows)


def main() -> None:
    rows = tuple(r for r in train_steps() if r["recompute"] != "offload")
    default = HostCosts()
    values = {"kernel_gap_s": h200_profile().kernel_gap_s, "forward_op_s": default.forward_op_s,
              "backward_op_s": default.backward_op_s,
              "selective_checkpoint_op_s": default.selective_checkpoint_op_s}
    for _ in range(3):
        for name, grid in GRIDS.items():
            values[name] = min(grid, key=lambda v: loss(values | {name: v}, rows))
    for name, value in values.items():
        print(f"{name} = {value * 1e6:.0f} us")
    print(f"sum of squared log ratios: {loss(values, rows):.4f} over {len(rows)} steps")

    profile = h200_profile(HostCosts(**{k: v for k, v in values.items() if k != "kernel_gap_s"}),
                           values["kernel_gap_s"])
    for r in (r for r in train_steps() if r["recompute"] == "offload"):
        spec = ModelSpec(**r["model_spec"])
        steps = r["accumulation_steps"]
        predicted = step_time(estimate(spec, config_of(r), "cuda", steps), profile, steps)
        without = predicted.total_s - steps * predicted.offload_s
        host_bytes = estimate(spec, config_of(r), "cuda", steps).ledger.host_bytes
        print(f"offload micro {r['micro_batch']}: host bandwidth "
              f"{2 * host_bytes * steps / (r['median_s'] - without) / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
