"""The Calibration page's logic: each measured training step against the core's prediction.

The points and their error statistics (`memory_points`, `time_points`, `error_stats`) use the predictions stored
with each step at measurement time (``predicted_*`` columns), by the core of that day, with no factor. The factor
table (`factor_table`) is the calibration plans apply: today's core predicts every step again, and the error after
its factor is in-sample (headroom.core.measured.calibration). Memory compares peak allocated bytes where the
device reports them (CUDA) and saved-activation bytes otherwise (CPU, where
torch has no allocator statistics). One convention, headroom.core.measured.calibration's:
``ratio`` is measured / predicted and ``error`` is ratio - 1 (positive: the
step took more than predicted).
"""

from __future__ import annotations

import json
import math
from urllib.parse import urlencode

import pandas as pd

from headroom.core.errors import ConfigError
from headroom.core.measured.calibration import Calibration
from headroom.core.measured.measurements import timing_noise
from headroom.core.specs.presets import PRESETS
from headroom.core.specs.run_config import COLUMNS as RUN_COLUMNS
from headroom.core.specs.run_config import RECIPE_COLUMNS, RunConfig
from headroom.core.specs.stack import stack_name
from headroom.core.units import GB
from headroom.dashboard.planning import MEASURED_PREFIX, PlanInputs

MISSING = "-"
"""What a text cell shows where nothing was measured (as headroom.dashboard.columns.MISSING, without Streamlit)."""


def memory_points(train: pd.DataFrame) -> pd.DataFrame:
    """(device, policy, label, predicted, measured, error, basis) in GB."""
    peak = train["peak_allocated_bytes"].notna() & train["predicted_peak_bytes"].notna()
    frame = pd.DataFrame({
        "device": train["device_name"],
        "policy": train["recompute"],
        "label": _labels(train),
        "predicted": train["predicted_peak_bytes"].where(peak, train["predicted_activation_bytes"]) / GB,
        "measured": train["peak_allocated_bytes"].where(peak, train["activation_bytes"]) / GB,
        "basis": peak.map({True: "peak allocated", False: "saved activations"}),
    })
    return _finish(frame)


def time_points(train: pd.DataFrame) -> pd.DataFrame:
    """(device, policy, label, predicted, measured, error, noisy, plan) in seconds per optimizer step; ``noisy``
    says why a step is left out of the step-time factor (`noisy`), empty for a step it keeps; ``plan`` is the
    Plan page's link that evaluates the step's configuration (`plan_links`)."""
    frame = pd.DataFrame({
        "device": train["device_name"], "policy": train["recompute"], "label": _labels(train),
        "predicted": train["predicted_step_time_s"], "measured": train["median_s"], "noisy": noisy(train),
        "plan": plan_links(train),
    })
    return _finish(frame)


STEP_KEYS = ["device_name", "model_name", *RUN_COLUMNS, *RECIPE_COLUMNS, "dropout", "stack", "layout"]
"""What a step's Plan-page link depends on: its device, model and run configuration."""


def plan_links(train: pd.DataFrame) -> pd.Series:
    """Each step's link to the Plan page (a URL of the dashboard's own, "/?..."), evaluating its run configuration
    on its device's measurements (headroom.dashboard.planning.PlanInputs.of_run); None where the page cannot: a
    model that is no preset, or a configuration today's core cannot read or plan (a sharding stage its stack does not
    run: torchtitan's ZeRO-1 over several ranks, which older agents measured with their own DDP). Built once per
    distinct step."""
    steps = train[STEP_KEYS].astype(object).fillna({"dropout": 0.0, "stack": "reference", "layout": ""})
    group = steps.groupby(STEP_KEYS, sort=False, dropna=False).ngroup()  # numbered as they first appear
    first = steps[~group.duplicated()]
    links = [_plan_link(dict(zip(STEP_KEYS, key, strict=True))) for key in first.itertuples(index=False, name=None)]
    return pd.Series([links[i] for i in group], index=train.index, dtype=object)


def _plan_link(step: dict) -> str | None:
    if step["model_name"] not in PRESETS:
        return None
    try:
        run = RunConfig.from_columns(step, dropout=float(step["dropout"]), stack=stack_name(step["stack"]),
                                     layout=json.loads(step["layout"]) if step["layout"] else None)
        run.train.check_sharding()
    except (ConfigError, ValueError):
        return None
    # The agent ran every rank of a step on one box: that box's GPUs are one node.
    node = max(PlanInputs().gpus_per_node, run.train.layout.world)
    inputs = PlanInputs.of_run(run, model=step["model_name"], hardware=MEASURED_PREFIX + step["device_name"],
                               gpus_per_node=node)
    default = PlanInputs().to_query()
    return "/?" + urlencode({key: value for key, value in inputs.to_query().items() if value != default[key]})


def noisy(train: pd.DataFrame) -> pd.Series:
    """Why each step's timing cannot be trusted, "" where it can: headroom.core.measured.measurements.timing_noise,
    the rule by which headroom.core.measured.calibration leaves a step out of the step-time (and communication)
    factor. The agent found the host busy, or the slowest repetition took more than its median again."""
    figures = [train[name].astype(float).to_numpy() for name in ("median_s", "min_s", "max_s")]
    busy = train["host_busy"].astype(float).to_numpy() == 1  # NULL (an older row) reads as NaN: not busy
    reasons = (timing_noise(bool(b), *map(_number, values)) for b, *values in zip(busy, *figures))
    return pd.Series([reason or "" for reason in reasons], index=train.index, dtype=object)


STATS_COLUMNS = ["device", "policy", "steps", "measured / predicted (median)", "median |error|", "worst |error|"]
NOISY_COLUMN = "noisy, left out"


def error_stats(points: pd.DataFrame) -> pd.DataFrame:
    """By device and policy: steps, median measured / predicted, median and worst |error|.

    Points with a ``noisy`` reason (step time: `time_points`) are left out of the statistics and counted in
    ``NOISY_COLUMN``, as the factor plans apply leaves them out; memory keeps every step (bytes do not depend
    on a busy host), and its table has no such column."""
    marked = "noisy" in points
    columns = [*STATS_COLUMNS, *([NOISY_COLUMN] if marked else [])]
    if not len(points):
        return pd.DataFrame(columns=columns)
    left_out = points["noisy"].astype(bool) if marked else pd.Series(False, index=points.index)
    groups = points[["device", "policy"]].drop_duplicates().sort_values(["device", "policy"])
    kept = points[~left_out].assign(abs_error=points["error"].abs())
    stats = kept.groupby(["device", "policy"], as_index=False).agg(
        steps=("error", "size"), ratio=("ratio", "median"), median=("abs_error", "median"),
        worst=("abs_error", "max"),
    )
    stats = groups.merge(stats, on=["device", "policy"], how="left").fillna({"steps": 0})
    stats["steps"] = stats["steps"].astype(int)
    if marked:
        counts = points[left_out].groupby(["device", "policy"]).size().rename("noisy").reset_index()
        stats = stats.merge(counts, on=["device", "policy"], how="left").fillna({"noisy": 0})
        stats["noisy"] = stats["noisy"].astype(int)
    stats.columns = columns
    return stats.reset_index(drop=True)


FACTOR_COLUMNS = ["quantity", "steps used", "factor (measured / predicted)", "applied", "median |error| before",
                  "median |error| after (in-sample)", "error range after (in-sample)", "left out"]
"""The factor table's columns: the ``before`` and ``after`` statistics are over the steps the factor is fitted on,
predicted by today's core; ``after`` is in-sample."""


def factor_table(fit: Calibration) -> pd.DataFrame:
    """What plans apply (headroom.core.measured.calibration): a row for peak memory, step time and communication,
    and one for the saved-activation check where it has steps. Text cells: "-" where no step was used, and in the
    ``after`` columns where no factor is applied (then ``before`` is what plans carry); one step is its own factor,
    so its ``after`` says so instead of 0%."""
    rows = []
    for what, one in (("peak memory", fit.memory), ("step time", fit.time), ("communication", fit.communication),
                      ("saved activations (check only)", fit.activations)):
        if what.startswith("saved") and not (one.samples or one.noisy or one.outliers):
            continue
        applied = one.applied and not what.startswith("saved")
        used = one.samples > 0
        low_high = one.error_range
        if not applied:
            after = spread = MISSING
        elif one.samples == 1:  # a factor fitted on one step leaves it no error: no accuracy to claim
            after, spread = "0% by construction (one step)", MISSING
        else:
            after, spread = f"{one.error:.1%}", f"{low_high[0]:+.1%} to {low_high[1]:+.1%}"
        rows.append({
            "quantity": what, "steps used": one.samples,
            "factor (measured / predicted)": f"x{one.factor:.3f}" if used else MISSING,
            "applied": "yes" if applied else "no",
            "median |error| before": f"{one.raw_error:.1%}" if used else MISSING,
            "median |error| after (in-sample)": after, "error range after (in-sample)": spread,
            "left out": one.noisy + len(one.outliers)})
    return pd.DataFrame(rows, columns=FACTOR_COLUMNS)


def _number(value) -> float | None:
    """A stored number as a float, None where it is missing (SQL NULL reaches pandas as None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def _labels(train: pd.DataFrame) -> pd.Series:
    return (train["model_name"] + " s" + train["seq_len"].astype(str) + " micro " + train["micro_batch"].astype(str)
            + " x" + train["accumulation_steps"].astype(str) + " " + train["recompute"] + " " + train["precision"])


def _finish(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.dropna(subset=["predicted", "measured"])
    frame = frame[(frame["predicted"] > 0) & (frame["measured"] > 0)].copy()
    frame["ratio"] = frame["measured"] / frame["predicted"]
    frame["error"] = frame["ratio"] - 1
    return frame.reset_index(drop=True)
