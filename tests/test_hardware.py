import pytest

from headroom.core.errors import ConfigError
from headroom.core.specs.hardware import HARDWARE, get_hardware, match_device

# Names as torch.cuda.get_device_name() reports them.
KNOWN = {
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H200": "h200",
    "NVIDIA A100-SXM4-80GB": "a100-sxm-80gb",
    "NVIDIA A100-SXM4-40GB": "a100-sxm-40gb",
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb",
    "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "NVIDIA L40S": "l40s",
    "NVIDIA GeForce RTX 4090": "rtx-4090",
    "NVIDIA B200": "b200",
    "AMD Instinct MI300X": "mi300x",
}

# Look-alikes with other peaks: must never borrow a neighbour's row.
UNKNOWN = [
    "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GH200 480GB", "NVIDIA GB200", "NVIDIA L40",
    "NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 4080", "AMD Instinct MI300A", "NVIDIA A100",
    "NVIDIA A10", "cpu", "",
]


@pytest.mark.parametrize(("name", "key"), KNOWN.items())
def test_device_names_match_their_row(name, key):
    assert match_device(name).key == key


@pytest.mark.parametrize("name", UNKNOWN)
def test_unmatched_names_are_unknown(name):
    match = match_device(name)
    assert match.spec is None and match.key == "unknown"


def test_every_row_has_a_source_and_dense_peaks_in_range():
    for hw in HARDWARE:
        assert hw.source
        # Tensor-core bf16 is dense: between 100 and 3000 TFLOP/s for these parts.
        assert 100e12 < hw.peak("bf16") < 3000e12, hw.key
        assert hw.peak("fp32") < hw.peak("bf16")


def test_get_hardware_by_key_or_name_and_suggestions():
    assert get_hardware("h200").name == "H200 SXM 141GB"
    assert get_hardware("NVIDIA H100 80GB HBM3").key == "h100-sxm"
    assert get_hardware("h100-sx").key == "h100-sxm"  # a part of one key only
    with pytest.raises(ConfigError, match="did you mean h100-sxm"):
        get_hardware("h100-smx")
    with pytest.raises(ConfigError, match="A100 SXM4 80GB has no fp8"):
        get_hardware("a100-sxm-80gb").peak("fp8")


def test_grand_tetons_h100_is_the_part_torchtitan_describes():
    """torchtitan docs/performance.md: 96GB HBM2e at 2.4 TB/s, a 500 W limit, a peak between the NVL's and the
    SXM's (the row takes the SXM's, the upper end); only its key names it, no device name claims it."""
    part, sxm = get_hardware("h100-hbm2e"), get_hardware("h100-sxm")
    assert (part.hbm_bytes_per_s, part.memory_bytes) == (2.4e12, 96 * 10**9)
    assert part.peak_flop_per_s == sxm.peak_flop_per_s and part.patterns == ()
    assert match_device("NVIDIA H100 80GB HBM3").key == "h100-sxm"
