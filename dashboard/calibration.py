"""The Calibration page's logic: each measured training step against the core's prediction.

Predictions are the ones stored with each step at measurement time
(``predicted_*`` columns). Memory compares peak allocated bytes where the
device reports them (CUDA) and saved-activation bytes otherwise (CPU, where
torch has no allocator statistics). One convention, headroom.core.measured.calibration's:
``ratio`` is measured / predicted and ``error`` is ratio - 1 (positive: the
step took more than predicted).
"""

from __future__ import annotations

import math

import pandas as pd

from headroom.core.measured.measurements import TrainStepRecord
from headroom.core.units import GB


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
    """(device, policy, label, predicted, measured, error, noisy) in seconds per optimizer step; ``noisy`` says
    why a step is left out of the step-time factor (`noisy`), empty for a step it keeps."""
    frame = pd.DataFrame({
        "device": train["device_name"], "policy": train["recompute"], "label": _labels(train),
        "predicted": train["predicted_step_time_s"], "measured": train["median_s"], "noisy": noisy(train),
    })
    return _finish(frame)


def noisy(train: pd.DataFrame) -> pd.Series:
    """Why each step's timing cannot be trusted, "" where it can: headroom.core.measured.measurements.TrainStepRecord.noisy, the
    rule by which headroom.core.measured.calibration leaves a step out of the step-time (and communication) factor. The agent
    found the host busy, or the slowest repetition took more than its median again."""
    def reason(row) -> str:
        record = TrainStepRecord(
            model_name=row.model_name, model_spec={}, seq_len=row.seq_len, micro_batch=row.micro_batch,
            accumulation_steps=row.accumulation_steps, precision=row.precision, optimizer=row.optimizer,
            attention=row.attention, recompute=row.recompute, median_s=_number(row.median_s),
            min_s=_number(row.min_s), max_s=_number(row.max_s), busy=_number(row.host_busy) == 1)
        return record.noisy or ""

    return pd.Series([reason(row) for row in train.itertuples()], index=train.index, dtype=object)


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
