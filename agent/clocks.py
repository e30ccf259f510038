"""Which GPU torch measured, and what its clocks were doing when a timing ended.

A timing taken while the card was power-capped or thermally throttled is a
different measurement from one at full clocks: every GPU result records the
SM and memory clocks, temperature, power draw and the active throttle
reasons read right after its samples (``details["clocks"]``).

Sources, fastest first: NVML through the ``nvidia-ml-py`` package (imported
as ``pynvml``, microseconds a read), else ``nvidia-smi`` (tens of
milliseconds), else nothing: a box with neither records no clocks rather
than a guess. The GPU is addressed by its UUID, on which torch, NVML and
nvidia-smi agree whatever ``CUDA_VISIBLE_DEVICES`` says; an index would not
be (torch's cuda:1 may be nvidia-smi's GPU 3).
"""

from __future__ import annotations

import functools
import shutil
import subprocess

import torch

# NVML's clocks-event (throttle) reason bits, nvml.h "nvmlClocksEventReason*".
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
_SMI_FIELDS = ("clocks.sm", "clocks.mem", "clocks_throttle_reasons.active", "temperature.gpu", "power.draw")


def gpu_uuid(device: torch.device) -> str | None:
    """The GPU's UUID as NVML and nvidia-smi write it ("GPU-..."), or None for a CPU."""
    if device.type != "cuda":
        return None
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def throttle_names(mask: int) -> list[str]:
    """The active reasons in an NVML bitmask; ``gpu_idle`` alone means nothing was slowing the card."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


@functools.cache
def _nvml():
    """The initialised pynvml module, or None where it is missing or finds no driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - any NVML failure means "no NVML here", never a failed benchmark
        return None
    return pynvml


def _read_nvml(nvml, uuid: str) -> dict:
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
    except TypeError:  # older nvidia-ml-py takes bytes
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid.encode())
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    mask = int(reasons(handle))
    return {
        "sm_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
        "memory_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
        "temperature_c": nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
        "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000,
        "throttle": throttle_names(mask),
        "source": "nvml",
    }


def _read_smi(uuid: str) -> dict:
    out = subprocess.run(
        ["nvidia-smi", f"--id={uuid}", f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=10, check=True,
    ).stdout.strip()
    sm, mem, mask, temperature, power = (v.strip() for v in out.split(","))
    clocks: dict = {"source": "nvidia-smi"}
    for key, value, kind in (("sm_mhz", sm, int), ("memory_mhz", mem, int), ("temperature_c", temperature, int),
                             ("power_w", power, float)):
        try:
            clocks[key] = kind(float(value))
        except ValueError:  # "[N/A]"
            pass
    try:
        clocks["throttle"] = throttle_names(int(mask, 16))
    except ValueError:
        pass
    return clocks


def read_clocks(device: torch.device) -> dict | None:
    """The GPU's clocks, temperature, power and throttle reasons now; None on a CPU or where nothing answers."""
    uuid = gpu_uuid(device)
    if uuid is None:
        return None
    nvml = _nvml()
    try:
        if nvml is not None:
            return _read_nvml(nvml, uuid)
        if shutil.which("nvidia-smi"):
            return _read_smi(uuid)
    except Exception:  # noqa: BLE001 - a clock we cannot read is absent, not an error in the benchmark
        return None
    return None
