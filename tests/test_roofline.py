import pytest

from headroom.core.specs.hardware import get_hardware
from headroom.core.timing.roofline import (
    arithmetic_intensity,
    attainable_flop_per_s,
    bound,
    matmul_intensity,
    ridge_intensity,
)


@pytest.mark.parametrize(("key", "expected"), [("h100-sxm", 295), ("h200", 206)])
def test_accelerator_intensity_bf16(key, expected):
    hw = get_hardware(key)
    assert ridge_intensity(hw.peak("bf16"), hw.hbm_bytes_per_s) == pytest.approx(expected, abs=1)


def test_1024_cubed_matmul_intensity():
    assert matmul_intensity(1024, 1024, 1024, element_bytes=2) == pytest.approx(341.3, abs=0.1)


def test_bound_and_attainable():
    hw = get_hardware("h100-sxm")
    peak, bw = hw.peak("bf16"), hw.hbm_bytes_per_s
    relu = arithmetic_intensity(1, 4)  # bf16 ReLU: 1 op per element, 2 B read + 2 B written
    assert bound(relu, peak, bw) == "memory"
    assert attainable_flop_per_s(relu, peak, bw) == pytest.approx(0.25 * 3.35e12)
    big = matmul_intensity(8192, 8192, 8192)
    assert bound(big, peak, bw) == "compute"
    assert attainable_flop_per_s(big, peak, bw) == peak
    # A 1024^3 matmul (341) sits just above the H100's ridge (295); a matrix-vector product (~1) far below.
    assert bound(matmul_intensity(1024, 1024, 1024), peak, bw) == "compute"
    assert bound(matmul_intensity(8192, 1, 8192), peak, bw) == "memory"
