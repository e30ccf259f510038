"""The H200 reference run (tests/data/reference) as the time model's validation set: its measured training
steps predicted again now, and the planner's regret recomputed from the stored sweep.

    python benchmarks/h200_reference.py

prints each step's predicted and measured time (uncalibrated: the datasheet and the cited curves of
headroom.core.timing.device_curves; then calibrated on the same steps, in-sample), and the regret at 80 GB and at the tight
budget. Imported by benchmarks/validation.py and tests/test_time_model.py.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import statistics
from functools import cache
from pathlib import Path

from headroom.core.measured.calibration import (
    Calibration,
    Observation,
    calibrate,
    uncalibrated,
)
from headroom.core.measured.measurements import (
    TrainStepRecord,
    allocator_fragmentation,
    fragmentation_by_policy,
)
from headroom.core.memory.estimate import estimate
from headroom.core.planning.planner import PlanRequest, plan
from headroom.core.planning.regret import MeasuredConfig, Regret, regret, tight_budget
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.run_config import RunConfig
from headroom.core.timing.op_time import HostCosts
from headroom.core.timing.step import HardwareProfile, datasheet_profile, step_time
from headroom.core.units import GB

BUNDLE = Path(__file__).resolve().parent.parent / "tests" / "data" / "reference" / "nvidia-h200-2026-11-30.json.gz"


@cache
def bundle_runs() -> tuple[dict, ...]:
    """The bundle's runs: the quick suite's and the GPU check's."""
    with gzip.open(BUNDLE, "rt") as f:
        return tuple(json.load(f)["runs"])


def train_steps() -> tuple[dict, ...]:
    """The bundle's 22 measured training steps (llama3.2-1b, s 2048, amp-bf16, global batch 8)."""
    return tuple(r for run in bundle_runs() for r in run["results"].get("train_step", []) if r["status"] == "ok")


def config_of(row: dict) -> TrainConfig:
    return RunConfig.from_columns(row).train


def predicted_s(row: dict, profile: HardwareProfile) -> float:
    """The time model's step time for a measured row, now."""
    spec = ModelSpec(**row["model_spec"])
    steps = row["accumulation_steps"]
    return step_time(estimate(spec, config_of(row), "cuda", steps), profile, steps).total_s


def h200_profile(host: HostCosts | None = None, kernel_gap_s: float | None = None) -> HardwareProfile:
    """The H200's datasheet profile and the cited curves, with the allocator's fragmentation the run measured
    (the median of peak reserved / peak allocated over its steps, and over each policy's, as a measured profile
    takes them: headroom.core.measured.measurements), and other host costs or kernel gap where given (the fit's trials)."""
    profile = datasheet_profile(get_hardware("h200"))
    steps = [TrainStepRecord(model_name=r["model_name"], model_spec=r["model_spec"], seq_len=r["seq_len"],
                             micro_batch=r["micro_batch"], accumulation_steps=r["accumulation_steps"],
                             precision=r["precision"], optimizer=r["optimizer"], attention=r["attention"],
                             recompute=r["recompute"], median_s=r["median_s"],
                             peak_allocated_bytes=r["peak_allocated_bytes"],
                             peak_reserved_bytes=r["peak_reserved_bytes"]) for r in train_steps()]
    changes = {k: v for k, v in (("host", host), ("kernel_gap_s", kernel_gap_s)) if v is not None}
    return dataclasses.replace(profile, fragmentation=allocator_fragmentation(steps),
                               fragmentation_by_policy=fragmentation_by_policy(steps), **changes)


def label(row: dict) -> str:
    return f"micro {row['micro_batch']} x{row['accumulation_steps']} {row['recompute']}"


def ratios(profile: HardwareProfile, rows: tuple[dict, ...] | None = None) -> list[float]:
    """measured / predicted for each row."""
    return [row["median_s"] / predicted_s(row, profile) for row in rows or train_steps()]


def calibration_of(profile: HardwareProfile) -> Calibration:
    """The in-sample calibration of step time on the same 22 steps, as `headroom` fits it on a store."""
    return calibrate("h200", [Observation(None, None, predicted_s(row, profile), row["median_s"], label(row))
                              for row in train_steps()])


def _measured() -> list[MeasuredConfig]:
    return [MeasuredConfig(RunConfig.from_columns(r), r["status"], r["tokens_per_s"], r["peak_reserved_bytes"])
            for r in train_steps()]


def regrets(profile: HardwareProfile, calibration: Calibration | None = None) -> dict[str, Regret]:
    """The planner's pick against the best measured configuration that fit, at 80 GB and the tight budget."""
    row = train_steps()[0]
    request = PlanRequest(spec=ModelSpec(**row["model_spec"]), train=config_of(row),
                          global_batch=row["micro_batch"] * row["accumulation_steps"], allow_offload=True)
    calibration = calibration or uncalibrated(profile.name)
    roomy = plan(dataclasses.replace(request, budget_bytes=80 * GB), profile, calibration)
    out = {"80 GB": regret(roomy, _measured())}
    tight = tight_budget(roomy, _measured())
    if tight is not None:
        out[f"{tight / GB:.3f} GB (tight)"] = regret(
            plan(dataclasses.replace(request, budget_bytes=tight), profile, calibration), _measured())
    return out


def summary(values: list[float]) -> tuple[float, float]:
    """Median and worst |ratio - 1|."""
    errors = [abs(r - 1) for r in values]
    return statistics.median(errors), max(errors)


def main() -> None:
    profile = h200_profile()
    calibration = calibration_of(profile)
    factor = calibration.time.correction
    print(f"{'configuration':28} {'measured s':>10} {'predicted s':>11} {'ratio':>6} {'calibrated':>10}")
    for row in train_steps():
        p = predicted_s(row, profile)
        print(f"{label(row):28} {row['median_s']:10.3f} {p:11.3f} {row['median_s'] / p:6.2f} "
              f"{row['median_s'] / (p * factor):10.2f}")
    raw = ratios(profile)
    print(f"\nuncalibrated: median {summary(raw)[0]:.1%}, worst {summary(raw)[1]:.1%} over {len(raw)} steps")
    print(f"calibrated (x{factor:.3f}, in-sample): median {summary([r / factor for r in raw])[0]:.1%}, "
          f"worst {summary([r / factor for r in raw])[1]:.1%}")
    for cal_name, cal in (("uncalibrated", None), ("calibrated", calibration)):
        for budget, outcome in regrets(profile, cal).items():
            print(f"regret at {budget}, {cal_name}: {outcome.regret:.1%} (picked {outcome.recommended}, "
                  f"best {outcome.best})" if outcome.regret is not None else
                  f"regret at {budget}, {cal_name}: {outcome.outcome}")


if __name__ == "__main__":
    main()
