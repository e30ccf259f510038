"""Datasheet specs of training accelerators, and matching a device name to one.

Every peak is **dense** (vendors often headline 2:4-sparse figures, twice as
large; a sparse peak would make MFU look half as good as it is). fp32 is the
non-tensor-core rate; tf32, fp16, bf16 and fp8 are tensor-core rates with fp32
accumulation, the way PyTorch runs them. Memory is GB (1e9 bytes) as sold;
bandwidth is bytes/s.

Matching: ``match_device(name)`` takes the string torch reports
(``torch.cuda.get_device_name()``, e.g. "NVIDIA H100 80GB HBM3") and tries
the rows in table order, most specific first. A row matches when one of its
``patterns`` is found in the name and none of its ``excludes`` is. A name no
row claims is reported as unknown, never mapped to a look-alike: an
"H100 NVL" or "GH200" has other peaks than an "H100 SXM".
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from headroom.core.errors import ConfigError

DTYPES: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")
_T = 10**12


@dataclass(frozen=True, kw_only=True, slots=True)
class HardwareSpec:
    key: str
    """Short name used on the command line, e.g. ``h100-sxm``."""
    name: str
    """Marketing name."""
    peak_flop_per_s: dict[str, float]
    """Dense peak FLOP/s by dtype; a dtype the device lacks (fp8 before Hopper/Ada) is absent."""
    hbm_bytes_per_s: float
    """Memory bandwidth, bytes/s."""
    memory_bytes: int
    """Memory size as sold, bytes (GB = 1e9)."""
    source: str
    """Where the figures come from."""
    patterns: tuple[str, ...] = field(default=())
    """Regular expressions (case-insensitive) that identify this device's name."""
    excludes: tuple[str, ...] = field(default=())
    """Regular expressions that disqualify a name, for look-alike variants."""
    mx_formats: bool = False
    """Its tensor cores scale fp8 by blocks of 32 (MXFP8, Blackwell's SM100) at the fp8 rate."""

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for a dtype; ConfigError when the device has no such rate."""
        if dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
        if dtype not in self.peak_flop_per_s:
            raise ConfigError(f"{self.name} has no {dtype} tensor-core rate")
        return self.peak_flop_per_s[dtype]

    def matches(self, device_name: str) -> bool:
        return any(re.search(p, device_name, re.I) for p in self.patterns) and not any(
            re.search(x, device_name, re.I) for x in self.excludes
        )


def _peaks(fp32: float, tf32: float, bf16: float, fp8: float | None = None, fp16: float | None = None) -> dict[str, float]:
    peaks = {"fp32": fp32 * _T, "tf32": tf32 * _T, "fp16": (fp16 or bf16) * _T, "bf16": bf16 * _T}
    if fp8 is not None:
        peaks["fp8"] = fp8 * _T
    return peaks


_H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet (2023), sparse figures halved"
_A100_DATASHEET = "NVIDIA A100 Tensor Core GPU datasheet (2021), sparse figures halved"

# Order matters: most specific first.
HARDWARE: tuple[HardwareSpec, ...] = (
    HardwareSpec(
        key="h100-pcie", name="H100 PCIe 80GB",
        peak_flop_per_s=_peaks(51, 378, 756, fp8=1513), hbm_bytes_per_s=2.0e12, memory_bytes=80 * 10**9,
        source=_H100_DATASHEET, patterns=(r"\bH100\b.*\bPCIe\b",), excludes=(r"\bNVL\b",),
    ),
    HardwareSpec(
        key="h100-sxm", name="H100 SXM5 80GB",
        peak_flop_per_s=_peaks(67, 494.7, 989.4, fp8=1978.9), hbm_bytes_per_s=3.35e12, memory_bytes=80 * 10**9,
        source=_H100_DATASHEET,
        # torch reports the SXM part as "NVIDIA H100 80GB HBM3".
        patterns=(r"\bH100\b.*\bSXM", r"\bH100 80GB HBM3$"), excludes=(r"\bNVL\b", r"\bPCIe\b", r"\bGH"),
    ),
    HardwareSpec(
        # Meta's Grand Teton H100: the SXM5 part with 96 GB of HBM2e, run at a 500 W power limit. torchtitan's
        # performance runs were on it; it puts the part's peak "between SXM and NVL" (835.5 dense bf16) without
        # knowing it, and so does this row: the SXM's peaks, the upper end.
        key="h100-hbm2e", name="H100 SXM5 96GB HBM2e, 500 W (Grand Teton)",
        peak_flop_per_s=_peaks(67, 494.7, 989.4, fp8=1978.9), hbm_bytes_per_s=2.4e12, memory_bytes=96 * 10**9,
        source="torchtitan docs/performance.md (Grand Teton: 96GB HBM2e at 2.4 TB/s, 500 W power limit, peak "
               "between the SXM's and the NVL's); the SXM's peaks, from the " + _H100_DATASHEET,
    ),
    HardwareSpec(
        key="h200", name="H200 SXM 141GB",
        peak_flop_per_s=_peaks(67, 494.7, 989.4, fp8=1978.9), hbm_bytes_per_s=4.8e12, memory_bytes=141 * 10**9,
        source="NVIDIA H200 Tensor Core GPU datasheet (2024), SXM column, sparse figures halved",
        patterns=(r"\bH200\b",), excludes=(r"\bNVL\b",),
    ),
    HardwareSpec(
        key="a100-sxm-80gb", name="A100 SXM4 80GB",
        peak_flop_per_s=_peaks(19.5, 156, 312), hbm_bytes_per_s=2.039e12, memory_bytes=80 * 10**9,
        source=_A100_DATASHEET, patterns=(r"\bA100\b.*\bSXM.*80\s*GB",),
    ),
    HardwareSpec(
        key="a100-pcie-80gb", name="A100 PCIe 80GB",
        peak_flop_per_s=_peaks(19.5, 156, 312), hbm_bytes_per_s=1.935e12, memory_bytes=80 * 10**9,
        source=_A100_DATASHEET, patterns=(r"\bA100\b.*80\s*GB.*\bPCIe\b", r"\bA100\b.*\bPCIe\b.*80\s*GB"),
    ),
    HardwareSpec(
        key="a100-sxm-40gb", name="A100 SXM4 40GB",
        peak_flop_per_s=_peaks(19.5, 156, 312), hbm_bytes_per_s=1.555e12, memory_bytes=40 * 10**9,
        source=_A100_DATASHEET, patterns=(r"\bA100\b.*\bSXM.*40\s*GB",),
    ),
    HardwareSpec(
        key="a100-pcie-40gb", name="A100 PCIe 40GB",
        peak_flop_per_s=_peaks(19.5, 156, 312), hbm_bytes_per_s=1.555e12, memory_bytes=40 * 10**9,
        source=_A100_DATASHEET, patterns=(r"\bA100\b.*40\s*GB.*\bPCIe\b", r"\bA100\b.*\bPCIe\b.*40\s*GB"),
    ),
    HardwareSpec(
        key="l40s", name="L40S 48GB",
        peak_flop_per_s=_peaks(91.6, 183, 362.05, fp8=733), hbm_bytes_per_s=864e9, memory_bytes=48 * 10**9,
        source="NVIDIA L40S datasheet (2023), sparse figures halved; GDDR6 bandwidth",
        patterns=(r"\bL40S\b",),
    ),
    HardwareSpec(
        key="rtx-4090", name="GeForce RTX 4090 24GB",
        # GeForce runs fp16/bf16 with fp32 accumulation at half the fp16-accumulate rate.
        peak_flop_per_s=_peaks(82.6, 82.6, 165.2, fp8=330.3), hbm_bytes_per_s=1008e9, memory_bytes=24 * 10**9,
        source="NVIDIA Ada Lovelace architecture whitepaper v2.1, Table 2 (fp32-accumulate, dense)",
        patterns=(r"\bRTX 4090\b",), excludes=(r"\b4090 ?D\b", r"Laptop"),
    ),
    HardwareSpec(
        key="b200", name="B200 180GB",
        peak_flop_per_s=_peaks(75, 1125, 2250, fp8=4500), hbm_bytes_per_s=7.7e12, memory_bytes=180 * 10**9,
        source="NVIDIA HGX B200 datasheet (2024): 8-GPU figures divided by 8, sparse figures halved",
        patterns=(r"\bB200\b",), mx_formats=True,
    ),
    HardwareSpec(
        key="mi300x", name="AMD Instinct MI300X 192GB",
        peak_flop_per_s=_peaks(163.4, 653.7, 1307.4, fp8=2614.9), hbm_bytes_per_s=5.3e12, memory_bytes=192 * 10**9,
        source="AMD Instinct MI300X data sheet (2023), dense matrix figures",
        patterns=(r"\bMI300X\b",),
    ),
)

HARDWARE_BY_KEY: dict[str, HardwareSpec] = {hw.key: hw for hw in HARDWARE}


@dataclass(frozen=True, slots=True)
class DeviceMatch:
    device_name: str
    spec: HardwareSpec | None
    """The datasheet row, or None when the name is unknown."""

    @property
    def key(self) -> str:
        return self.spec.key if self.spec else "unknown"


def match_device(device_name: str) -> DeviceMatch:
    """Match a device name as torch reports it to a datasheet row, or to unknown."""
    name = " ".join(device_name.replace("-", " ").replace("_", " ").split())
    for spec in HARDWARE:
        if spec.matches(name):
            return DeviceMatch(device_name, spec)
    return DeviceMatch(device_name, None)


def keys_containing(part: str) -> list[str]:
    """The datasheet keys holding ``part`` (any case, spaces as hyphens): ``h100`` is h100-sxm and h100-pcie."""
    wanted = "-".join(part.lower().split())
    return [k for k in HARDWARE_BY_KEY if wanted and wanted in k]


def get_hardware(key: str) -> HardwareSpec:
    """A datasheet row by key (``h100-sxm``, any case), by a device name torch would report, or by a part
    of one key only (``4090``, ``mi300``)."""
    wanted = key.strip().lower()
    if wanted in HARDWARE_BY_KEY:
        return HARDWARE_BY_KEY[wanted]
    matched = match_device(key).spec
    if matched is not None:
        return matched
    containing = keys_containing(key)
    if len(containing) == 1:
        return HARDWARE_BY_KEY[containing[0]]
    if containing:
        raise ConfigError(f"hardware {key!r} could be any of {', '.join(containing)}; give one of them")
    close = difflib.get_close_matches(wanted, HARDWARE_BY_KEY, n=3, cutoff=0.4)
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(HARDWARE_BY_KEY)}"
    raise ConfigError(f"unknown hardware {key!r}; {hint}")
