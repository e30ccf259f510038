"""The Calibration page's logic: each measured training step against the core's prediction.

Predictions are the ones stored with each step at measurement time
(``predicted_*`` columns). Memory compares peak allocated bytes where the
device reports them (CUDA) and saved-activation bytes otherwise (CPU, where
torch has no allocator statistics), as core.calibration does. ``error`` is
predicted / measured - 1: positive means the core over-predicted.
"""

from __future__ import annotations

import pandas as pd

from core.units import GB


def memory_points(train: pd.DataFrame) -> pd.DataFrame:
    """(device, policy, label, predicted, measured, error, basis) in GB."""
    peak = train["peak_allocated_bytes"].notna() & train["predicted_peak_bytes"].notna()
    frame = pd.DataFrame({
        "device": train["device_name"],
        "policy": train["recompute"],
        "label": _labels(train),
        "predicted": train["predicted_peak_bytes"].where(peak, train["predicted_activation_bytes"]) / GB,
        "measured": train["peak_allocated_bytes"].where(peak, train["activation_bytes"]) / GB,
        "basis": peak.map({True: "peak allocated", False: "activations"}),
    })
    return _finish(frame)


def time_points(train: pd.DataFrame) -> pd.DataFrame:
    """(device, policy, label, predicted, measured, error) in seconds per optimizer step."""
    frame = pd.DataFrame({
        "device": train["device_name"], "policy": train["recompute"], "label": _labels(train),
        "predicted": train["predicted_step_time_s"], "measured": train["median_s"],
    })
    return _finish(frame)


def error_stats(points: pd.DataFrame) -> pd.DataFrame:
    """By device and policy: steps, median predicted / measured, median and worst |error|."""
    if not len(points):
        return pd.DataFrame(columns=["device", "policy", "steps", "median_ratio", "median_abs_error", "worst_abs_error"])
    grouped = points.assign(ratio=points["predicted"] / points["measured"], abs_error=points["error"].abs())
    return grouped.groupby(["device", "policy"], as_index=False).agg(
        steps=("error", "size"), median_ratio=("ratio", "median"),
        median_abs_error=("abs_error", "median"), worst_abs_error=("abs_error", "max"),
    )


def _labels(train: pd.DataFrame) -> pd.Series:
    return (train["model_name"] + " s" + train["seq_len"].astype(str) + " micro " + train["micro_batch"].astype(str)
            + " x" + train["accumulation_steps"].astype(str) + " " + train["recompute"] + " " + train["precision"])


def _finish(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.dropna(subset=["predicted", "measured"])
    frame = frame[(frame["predicted"] > 0) & (frame["measured"] > 0)].copy()
    frame["error"] = frame["predicted"] / frame["measured"] - 1
    return frame.reset_index(drop=True)
