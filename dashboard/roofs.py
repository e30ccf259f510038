"""The Hardware page's logic: a device's roofs and its measurements as roofline points.

Intensities (FLOP per byte of device memory traffic), per measurement kind:

- matmul (m x k)(k x n): 2mnk FLOPs over reading both operands and writing
  the result once (headroom.core.timing.roofline.matmul_intensity), at the dtype's element size;
- attention: 4 b s^2 h d FLOPs forward (QK^T and PV), halved for causal
  attention as FlashAttention's benchmarks count it (headroom.core.memory.flops.attention_kernel_flops:
  fused kernels skip the masked half), over reading Q, K, V and writing O once;
- elementwise: one FLOP per element (an add, a relu; a copy does none, so
  this places it, not measures it) over the op's ``bytes_moved``.

Each dtype has its own roofs, and its measurements are drawn against them:
an fp8 matmul under the fp8 peak, an fp32 one under the fp32 peak, never all
under bf16's. A dtype's measured roof is the device's best matmul rate in that
dtype and the best bandwidth any memory-bound op reached (an add, two reads to
a write, outruns a copy on an H200: 4,384 against 4,181 GB/s), so that no
measurement lies above it; its datasheet roof is the dense peak for that dtype
and the HBM bandwidth of the device's datasheet row
(headroom.core.specs.hardware).
"""

from __future__ import annotations

import pandas as pd

from headroom.core.memory.flops import attention_kernel_flops
from headroom.core.specs.hardware import DTYPES, HardwareSpec, match_device
from headroom.core.timing.roofline import matmul_intensity

ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def datasheet_row(device_name: str, device_type: str) -> HardwareSpec | None:
    """The datasheet row of a GPU; a CPU has none."""
    return match_device(device_name).spec if device_type == "cuda" else None


def roofs(spec: HardwareSpec | None, matmul: pd.DataFrame, elementwise: pd.DataFrame,
          dtype: str) -> dict[str, tuple[float, float]]:
    """Roof name -> (peak FLOP/s, bytes/s): the datasheet's and the measured one, when known."""
    found: dict[str, tuple[float, float]] = {}
    if spec is not None and dtype in spec.peak_flop_per_s:
        found[f"datasheet {dtype}"] = (spec.peak_flop_per_s[dtype], spec.hbm_bytes_per_s)
    rates = matmul.loc[matmul["dtype"] == dtype, "tflop_per_s"] if len(matmul) else pd.Series(dtype=float)
    if len(rates) and len(elementwise):
        found[f"measured {dtype}"] = (float(rates.max()) * 1e12, float(elementwise["gb_per_s"].max()) * 1e9)
    return found


POINT_COLUMNS = ["kind", "dtype", "label", "intensity", "tflop_per_s"]
ROOF_COLUMNS = ["roof", "source", "dtype", "peak_flop_per_s", "bytes_per_s"]


def roof_table(spec: HardwareSpec | None, matmul: pd.DataFrame, elementwise: pd.DataFrame,
               dtypes: list[str]) -> pd.DataFrame:
    """Every roof of each of ``dtypes`` (`roofs`), one row each (`ROOF_COLUMNS`): ``source`` is "datasheet" or
    "measured", ``roof`` its name ("datasheet fp8"), the peak in FLOP/s and the bandwidth in bytes/s."""
    rows = [{"roof": name, "source": name.split(" ")[0], "dtype": dtype, "peak_flop_per_s": peak,
             "bytes_per_s": bandwidth}
            for dtype in dtypes for name, (peak, bandwidth) in roofs(spec, matmul, elementwise, dtype).items()]
    return pd.DataFrame(rows, columns=ROOF_COLUMNS)


def present_dtypes(points: pd.DataFrame) -> list[str]:
    """The dtypes of the roofline's points (`roofline_points`), in headroom.core.specs.hardware.DTYPES' order."""
    held = set(points["dtype"])
    return [dtype for dtype in DTYPES if dtype in held]


def roofline_points(matmul: pd.DataFrame, attention: pd.DataFrame, elementwise: pd.DataFrame) -> pd.DataFrame:
    """Every measurement as (kind, dtype, label, intensity, tflop_per_s): medians over runs of each shape; the
    kind is "matmul", "attention <backend>" or "elementwise"."""
    frames = []
    if len(matmul):
        mm = matmul.groupby(["dtype", "m", "n", "k", "batch"], as_index=False)["tflop_per_s"].median()
        mm["intensity"] = [matmul_intensity(m, n, k, ELEMENT_BYTES[d]) for d, m, n, k in
                           zip(mm["dtype"], mm["m"], mm["n"], mm["k"], strict=False)]
        mm["kind"] = "matmul"
        mm["label"] = [f"{b}x {m}x{k} @ {k}x{n}" for b, m, n, k in zip(mm["batch"], mm["m"], mm["n"], mm["k"], strict=False)]
        frames.append(mm[POINT_COLUMNS])
    if len(attention):
        keys = ["backend", "dtype", "batch", "seq_len", "n_heads", "n_kv_heads", "head_dim", "causal"]
        at = attention.groupby(keys, as_index=False)["forward_median_s"].median()
        flops = pd.Series([float(attention_kernel_flops(b, s, h, d, bool(c))) for b, s, h, d, c in
                           zip(at["batch"], at["seq_len"], at["n_heads"], at["head_dim"], at["causal"], strict=False)], index=at.index)
        element = at["dtype"].map(ELEMENT_BYTES)
        moved = element * at["batch"] * at["seq_len"] * at["head_dim"] * (2 * at["n_heads"] + 2 * at["n_kv_heads"])
        at["intensity"] = flops / moved
        at["tflop_per_s"] = flops / at["forward_median_s"] / 1e12
        at["kind"] = "attention " + at["backend"]
        at["label"] = [f"{d} b{b} s{s} h{h} d{hd}" for d, b, s, h, hd in
                       zip(at["dtype"], at["batch"], at["seq_len"], at["n_heads"], at["head_dim"], strict=False)]
        frames.append(at[POINT_COLUMNS])
    if len(elementwise):
        ew = elementwise.groupby(["op", "dtype", "elements", "bytes_moved"], as_index=False)["median_s"].median()
        ew["intensity"] = ew["elements"] / ew["bytes_moved"]
        ew["tflop_per_s"] = ew["elements"] / ew["median_s"] / 1e12
        ew["kind"] = "elementwise"
        ew["label"] = ew["op"] + " " + ew["dtype"]
        frames.append(ew[POINT_COLUMNS])
    if not frames:
        return pd.DataFrame(columns=POINT_COLUMNS)
    points = pd.concat(frames, ignore_index=True)
    return points[points["tflop_per_s"] > 0]
