"""What a device family achieves, where the store has no measurement of it: the time model's cited defaults.

A datasheet gives peaks (headroom.core.specs.hardware); a training step runs at the rates its kernels reach. Each row here
says, for one datasheet device, how many streaming multiprocessors its GEMMs spread over (the wave
quantization of headroom.core.timing.op_time), what fraction of the dense bf16 peak a large GEMM reaches, what a fused causal
attention kernel reaches, and what fraction of the HBM bandwidth a large copy reaches, each with its source.
A figure nobody has published is marked ``assumed`` in its source, and every plan that uses it says so.

GEMM efficiency comes from one cited large bf16 GEMM, its shape and its rate: the "maximum achievable matmul
FLOPS" (MAMF) of a sweep over large shapes, as Stas Bekman's ml-engineering book tabulates it
(compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table", bf16, and the B200 row of
its Blackwell notes), or for the H200 Headroom's own measurement (tests/data/reference). MAMF is a short
burst's best, which a training step does not sustain: MAMF rows are scaled by ``SUSTAINED_OVER_BURST``, the
ratio the H200 measured; the H200's own row is its sustained figure.
Attention efficiency is the forward rate over the FLOPs a causal kernel executes (half of those counted in
full, headroom.core.memory.flops).
"""

from __future__ import annotations

from dataclasses import dataclass

from headroom.core.specs.hardware import HARDWARE_BY_KEY

_MAMF = "ml-engineering MAMF table (Bekman), bf16"
_H200_REFERENCE = "Headroom's H200 reference run (tests/data/reference, 2026-11-30)"

H200_BF16_TFLOP_PER_S = 709.8
"""The H200 reference run's bf16 GEMM at 8192^3, sustained (tests/data/reference)."""
SUSTAINED_OVER_BURST = H200_BF16_TFLOP_PER_S / 776.0
"""What a GEMM sustains over what a short burst reaches: on the H200 reference run, 709.8 TFLOP/s at 8192^3 (the
median of five, at 1,590 MHz under the 700 W cap) against the sweep's best, 776.0 at 4096x1024x4096 (1,920 MHz).
A MAMF figure is a burst's best; a training step runs sustained, so MAMF rows are scaled by this."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceCurves:
    sms: int
    """Streaming multiprocessors (compute units on AMD): the tiles of one wave."""
    matmul_shape: tuple[int, int, int]
    """(m, n, k) of the cited large bf16 GEMM."""
    matmul_tflop_per_s: float
    """Its rate: the shape model's anchor is set so that it reproduces it (headroom.core.timing.op_time.anchor_efficiency)."""
    matmul_source: str
    attention_efficiency: float
    """A fused causal attention forward's executed FLOP/s over the dense bf16 peak."""
    attention_source: str
    bandwidth_efficiency: float = 0.85
    """A large copy's bytes/s (read plus written) over the datasheet bandwidth."""
    bandwidth_source: str = "assumed: as the H200's copy (0.87), rounded down"
    fp8_matmul_tflop_per_s: float | None = None
    """A cited large fp8 GEMM's rate at ``matmul_shape``; None: the bf16 anchor times ``FP8_OVER_BF16``."""
    fp8_matmul_source: str = ""


_HOPPER_ATTENTION = (0.56, f"{_H200_REFERENCE}: cuDNN SDPA, b1 s8192 32 heads of 128, 558 TFLOP/s executed "
                           "(the same Hopper SM as the H100's)")


def _a100(form: str, shape: tuple[int, int, int], mamf_tflop_per_s: float, part: str = "") -> DeviceCurves:
    """An A100's row: its form factor's MAMF, at the burst-to-sustained ratio, and FlashAttention-2's rate."""
    return DeviceCurves(
        sms=108, matmul_shape=shape, matmul_tflop_per_s=mamf_tflop_per_s * SUSTAINED_OVER_BURST,
        matmul_source=f"{_MAMF}: A100 {form} {mamf_tflop_per_s} of 312 TFLOP/s{part}",
        attention_efficiency=0.50,
        attention_source="FlashAttention-2 (Dao 2023): 50-73% of the A100's peak, the low end")


H200_FP8_TFLOP_PER_S = 1266.3
"""The H200 reference run's fp8 ``_scaled_mm`` at 8192^3 (tests/data/reference), the same run as its bf16 709.8."""
_H200 = HARDWARE_BY_KEY["h200"]
FP8_OVER_BF16 = (H200_FP8_TFLOP_PER_S * 1e12 / _H200.peak("fp8")) / (H200_BF16_TFLOP_PER_S * 1e12 / _H200.peak("bf16"))
"""What fraction of its fp8 peak a large fp8 GEMM reaches over what fraction of its bf16 peak a bf16 one reaches,
on the H200 (0.892): taken for every other device with fp8 units, none of which has a published fp8 MAMF here
(``assumed`` in each plan)."""

CURVES: dict[str, DeviceCurves] = {
    "h100-sxm": DeviceCurves(
        sms=132, matmul_shape=(6144, 17920, 2816), matmul_tflop_per_s=792.1 * SUSTAINED_OVER_BURST,
        matmul_source=f"{_MAMF}: H100 SXM 792.1 of 989 TFLOP/s",
        attention_efficiency=_HOPPER_ATTENTION[0], attention_source=_HOPPER_ATTENTION[1]),
    "h100-hbm2e": DeviceCurves(
        sms=132, matmul_shape=(6144, 17920, 2816), matmul_tflop_per_s=792.1 * SUSTAINED_OVER_BURST,
        matmul_source="assumed: the 700 W H100 SXM's MAMF (what the 500 W limit costs is not published)",
        attention_efficiency=_HOPPER_ATTENTION[0], attention_source="assumed: the H200's cuDNN fraction"),
    "h100-pcie": DeviceCurves(
        sms=114, matmul_shape=(6144, 17920, 2816), matmul_tflop_per_s=792.1 * 756 / 989.4 * SUSTAINED_OVER_BURST,
        matmul_source="assumed: the H100 SXM's MAMF, scaled to its peak",
        attention_efficiency=_HOPPER_ATTENTION[0], attention_source="assumed: the H200's cuDNN fraction"),
    "h200": DeviceCurves(
        sms=132, matmul_shape=(8192, 8192, 8192), matmul_tflop_per_s=H200_BF16_TFLOP_PER_S,
        matmul_source=f"{_H200_REFERENCE}: 709.8 TFLOP/s at 8192^3, the median of five, power-capped at 1,590 MHz "
                      "(a short burst reaches 776: a training step runs sustained)",
        attention_efficiency=_HOPPER_ATTENTION[0], attention_source=_HOPPER_ATTENTION[1],
        bandwidth_efficiency=0.87, bandwidth_source=f"{_H200_REFERENCE}: 4.18 of 4.8 TB/s copying 512 MiB",
        fp8_matmul_tflop_per_s=H200_FP8_TFLOP_PER_S,
        fp8_matmul_source=f"{_H200_REFERENCE}: fp8 _scaled_mm at 8192^3, 1,266.3 TFLOP/s (without fast "
                          "accumulation, as torchao runs both backward GEMMs; 1,352.5 with it)"),
    "a100-sxm-80gb": _a100("SXM", (6912, 16384, 2048), 267.9),
    "a100-pcie-80gb": _a100("PCIe", (2304, 5120, 1536), 256.4),
    "a100-sxm-40gb": _a100("SXM", (6912, 16384, 2048), 267.9, " (80GB part)"),
    "a100-pcie-40gb": _a100("PCIe", (2304, 5120, 1536), 256.4, " (80GB part)"),
    "l40s": DeviceCurves(
        sms=142, matmul_shape=(8192, 8192, 8192), matmul_tflop_per_s=0.70 * 362.05,
        matmul_source="assumed: no published MAMF for the L40S",
        attention_efficiency=0.45, attention_source="assumed: no published attention rate for the L40S"),
    "rtx-4090": DeviceCurves(
        sms=128, matmul_shape=(8192, 8192, 8192), matmul_tflop_per_s=0.70 * 165.2,
        matmul_source="assumed: no published MAMF for the RTX 4090",
        attention_efficiency=0.45, attention_source="assumed: no published attention rate for the RTX 4090"),
    "b200": DeviceCurves(
        sms=148, matmul_shape=(8192, 8192, 8192), matmul_tflop_per_s=1745.0 * SUSTAINED_OVER_BURST,
        matmul_source=f"{_MAMF}: B200 SXM 1,745 of 2,250 TFLOP/s (shape not given: taken as 8192^3)",
        attention_efficiency=_HOPPER_ATTENTION[0], attention_source="assumed: the H200's cuDNN fraction"),
    "mi300x": DeviceCurves(
        sms=304, matmul_shape=(4096, 10240, 4864), matmul_tflop_per_s=781.9 * SUSTAINED_OVER_BURST,
        matmul_source=f"{_MAMF}: MI300X 781.9 of 1,307 TFLOP/s (ROCm 6.2)",
        attention_efficiency=0.35, attention_source="assumed: below the Hopper fraction, as its GEMMs are"),
}
"""By datasheet key (headroom.core.specs.hardware.HARDWARE_BY_KEY): every datasheet device has a row."""
