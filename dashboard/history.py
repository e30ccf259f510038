"""The History page's logic: key figures per run, side by side, and drops over time.

Key figures of a run:

- ``matmul bf16 TFLOP/s``: its best ok bf16 matmul (fp32 on a box without bf16 results);
- ``copy GB/s``: its best copy bandwidth;
- ``train tokens/s``: tokens/s of the device's reference training step, the
  configuration (model, sequence, micro-batch, accumulation, policy, precision)
  that most of that device's runs measured, so runs compare like with like.

A drop is a value more than ``DROP_FRACTION`` below the median of the same
figure over that device's earlier runs.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import pandas as pd

DROP_FRACTION = 0.05
FIGURES = ("matmul bf16 TFLOP/s", "copy GB/s", "train tokens/s")
MATMUL_DTYPES = ("bf16", "fp32")
"""The dtypes the matmul figure reads: bf16, else fp32."""
TRAIN_KEY = ["model_name", "seq_len", "micro_batch", "accumulation_steps", "recompute", "precision"]


def key_figures(runs: pd.DataFrame, matmul: pd.DataFrame, elementwise: pd.DataFrame,
                train: pd.DataFrame) -> pd.DataFrame:
    """One row per run (run_id, uuid, device, hostname, started_at, ...) with the key figures as columns.

    ``matmul`` and ``elementwise`` may hold every result or only each run's best per dtype or op (the
    figures are maxima, so both give the same table)."""
    out = runs[["run_id", "uuid", "device_name", "hostname", "started_at", "status", "suite",
                "driver_version", "cuda_version", "torch_version"]].rename(columns={"device_name": "device"})
    out = out.set_index("run_id")
    if len(matmul):
        best = matmul.groupby(["run_id", "dtype"])["tflop_per_s"].max().unstack()
        figure = best["bf16"] if "bf16" in best else pd.Series(dtype=float)
        if "fp32" in best:
            figure = figure.reindex(best.index).fillna(best["fp32"])
        out[FIGURES[0]] = figure
    if len(elementwise):
        copies = elementwise[elementwise["op"] == "copy"]
        out[FIGURES[1]] = copies.groupby("run_id")["gb_per_s"].max()
    if len(train):
        text = train[TRAIN_KEY].astype(str)
        config = text[TRAIN_KEY[0]]
        for column in TRAIN_KEY[1:]:  # column by column, not row by row
            config = config + " " + text[column]
        keyed = train.assign(config=config)
        reference = keyed.groupby(["device_name", "config"])["run_id"].nunique().reset_index()
        reference = reference.sort_values(["device_name", "run_id", "config"], ascending=[True, False, True])
        chosen = reference.drop_duplicates("device_name").set_index("device_name")["config"]
        mine = keyed[keyed["config"] == keyed["device_name"].map(chosen)]
        out[FIGURES[2]] = mine.groupby("run_id")["tokens_per_s"].median()
    for figure in FIGURES:
        if figure not in out:
            out[figure] = float("nan")
    return out.reset_index()


def timeline(figures: pd.DataFrame, figure: str) -> pd.DataFrame:
    """One figure over time per device, each value flagged ``drop`` when it falls more than
    DROP_FRACTION below the median of that device's earlier values (``change`` is relative to it)."""
    rows = figures.dropna(subset=[figure]).sort_values("started_at")
    rows = rows[["device", "hostname", "uuid", "started_at", figure]].rename(columns={figure: "value"})
    previous = rows.groupby("device")["value"].transform(lambda v: v.expanding().median().shift(1))
    rows = rows.assign(figure=figure, previous_median=previous, change=rows["value"] / previous - 1)
    rows["drop"] = (rows["change"] < -DROP_FRACTION).fillna(False).astype(bool)
    return rows.reset_index(drop=True)


FIELD_NAMES = {"device": "device", "hostname": "host", "started_at": "started (UTC)", "suite": "suite",
               "status": "status", "driver_version": "driver", "cuda_version": "CUDA", "torch_version": "torch"}
"""The identity and software rows of `side_by_side`, by column and as a reader names them; the key figures follow."""


def cell_text(value: object) -> str:
    """One cell of `side_by_side`: a date to the minute, a number with separators and four significant digits,
    "-" for nothing recorded."""
    if value is None or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, pd.Timestamp):
        return f"{value:%Y-%m-%d %H:%M}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def side_by_side(figures: pd.DataFrame, run_ids: list[int]) -> pd.DataFrame:
    """The chosen runs as columns and their identity, software and key figures as rows, as text that reads."""
    chosen = figures[figures["run_id"].isin(run_ids)].copy()
    chosen["column"] = chosen["device"] + " " + chosen["uuid"].str[:8]
    table = chosen.set_index("column")[[*FIELD_NAMES, *FIGURES]].rename(columns=FIELD_NAMES)
    return table.T.map(cell_text)


def still_chosen(previous: Sequence[Hashable] | None, options: Sequence[Hashable],
                 default: Sequence[Hashable]) -> list:
    """What a multiselect holds once its options change: the previous choices still offered, in their order.

    ``default`` on the first visit (``previous`` None), and when none of a non-empty choice survives; an
    empty choice the user made stays empty. Streamlit (1.67) drops the choices no longer offered and leaves
    what remains, even nothing: narrowing the History page's devices to ones none of the compared runs ran
    on emptied the comparison. Done here, it holds whatever a Streamlit version does to a widget whose
    options change."""
    if previous is None:
        return list(default)
    offered = set(options)
    kept = [choice for choice in previous if choice in offered]
    return kept if kept or not previous else list(default)
