"""The Calibration page's logic: each measured training step against the core's prediction.

Predictions are the ones stored with each step at measurement time
(``predicted_*`` columns). Memory compares peak allocated bytes where the
device reports them (CUDA) and saved-activation bytes otherwise (CPU, where
torch has no allocator statistics). One convention, core.calibration's:
``ratio`` is measured / predicted and ``error`` is ratio - 1 (positive: the
step took more than predicted).
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
        "basis": peak.map({True: "peak allocated", False: "saved activations"}),
    })
    return _finish(frame)


def time_points(train: pd.DataFrame) -> pd.DataFrame:
    """(device, policy, label, predicted, measured, error) in seconds per optimizer step."""
    frame = pd.DataFrame({
        "device": train["device_name"], "policy": train["recompute"], "label": _labels(train),
        "predicted": train["predicted_step_time_s"], "measured": train["median_s"],
    })
    return _finish(frame)


STATS_COLUMNS = ["device", "policy", "steps", "measured / predicted (median)", "median |error|", "worst |error|"]


def error_stats(points: pd.DataFrame) -> pd.DataFrame:
    """By device and policy: steps, median measured / predicted, median and worst |error|."""
    if not len(points):
        return pd.DataFrame(columns=STATS_COLUMNS)
    grouped = points.assign(abs_error=points["error"].abs())
    stats = grouped.groupby(["device", "policy"], as_index=False).agg(
        steps=("error", "size"), ratio=("ratio", "median"), median=("abs_error", "median"),
        worst=("abs_error", "max"),
    )
    stats.columns = STATS_COLUMNS
    return stats


def _labels(train: pd.DataFrame) -> pd.Series:
    return (train["model_name"] + " s" + train["seq_len"].astype(str) + " micro " + train["micro_batch"].astype(str)
            + " x" + train["accumulation_steps"].astype(str) + " " + train["recompute"] + " " + train["precision"])


def _finish(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.dropna(subset=["predicted", "measured"])
    frame = frame[(frame["predicted"] > 0) & (frame["measured"] > 0)].copy()
    frame["ratio"] = frame["measured"] / frame["predicted"]
    frame["error"] = frame["ratio"] - 1
    return frame.reset_index(drop=True)
