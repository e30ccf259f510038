"""What a measurement was made on: device, host and software.

Everything torch and the OS report without extra packages; clocks, power limit
and ECC come from ``nvidia-smi`` when it is on the PATH (a lean container may
not have it, and that is recorded as absent, not guessed). A GPU is named by
its UUID and torch index too, so identical cards in one box are told apart
and nvidia-smi is asked about the card torch measured. The core's
datasheet match ("unknown" when no row claims the name) is stored with it.
"""

from __future__ import annotations

import functools
import platform
import shutil
import socket
import subprocess

import torch

from headroom.agent.clocks import gpu_uuid
from headroom.agent.topology import read_topology
from headroom.core.specs.hardware import HardwareSpec, match_device
from headroom.db.models import Fingerprint

BENCHMARK_VERSION = "3"
"""Changes whenever a measurement method changes, so old and new numbers are never compared blindly.

2: timed blocks of back-to-back calls (CUDA graphs for matmuls), LayerNorm bytes counted for the
functional op, operand rotation uncapped, fp8 with and without fast accumulation, the allocator
emptied between cases.
3: training steps under ``--stack torchtitan`` run torchtitan's fused q/k/v projection (one ``wqkv``
matmul, as torchtitan 0.3's Llama 3 builds it) instead of three separate projections."""

_SMI_FIELDS = (
    "driver_version", "clocks.max.sm", "clocks.max.memory", "power.limit", "ecc.mode.current", "pcie.link.gen.max",
    "pci.bus_id",
)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvidia_smi(gpu: str) -> dict[str, str]:
    """Driver, clock limits, power limit, ECC and PCIe of one GPU (by UUID); {} where nvidia-smi is unavailable."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={gpu}", f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in out.split(",")]
    return {k: v for k, v in zip(_SMI_FIELDS, values) if v and v != "[N/A]"}


@functools.cache
def topology() -> dict:
    """The box's GPU topology (headroom.agent.topology), read once per process."""
    return read_topology()


def form_factor(name: str) -> str | None:
    upper = name.upper()
    for marker, factor in (("SXM", "SXM"), ("PCIE", "PCIe"), ("NVL", "NVL"), ("HBM3", "SXM")):
        if marker in upper:
            return factor
    return None


def device_name(device: torch.device) -> str:
    """The name results are filed under: the CPU's model, or the GPU's name as torch reports it."""
    return cpu_model() if device.type == "cpu" else torch.cuda.get_device_name(device)


def datasheet_spec(device: torch.device) -> HardwareSpec | None:
    """The datasheet row of a GPU (for peak fractions and MFU); None for a CPU or an unknown name."""
    return match_device(device_name(device)).spec if device.type == "cuda" else None


def fingerprint(device: torch.device) -> Fingerprint:
    common = dict(
        hostname=socket.gethostname(),
        python_version=platform.python_version(),
        torch_version=torch.__version__,
        cpu_model=cpu_model(),
    )
    details = {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }
    if device.type == "cpu":
        return Fingerprint(device_type="cpu", device_name=device_name(device), details=details | {"hardware": "unknown"},
                           **common)
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    uuid = gpu_uuid(torch.device("cuda", index))
    smi = nvidia_smi(uuid)
    match = match_device(props.name)
    card = {"gpu_uuid": uuid, "gpu_index": index, "cudnn_version": torch.backends.cudnn.version()}
    return Fingerprint(
        device_type="cuda",
        device_name=props.name,
        device_memory_bytes=props.total_memory,
        sm_count=props.multi_processor_count,
        compute_capability=f"{props.major}.{props.minor}",
        form_factor=form_factor(props.name),
        driver_version=smi.get("driver_version"),
        cuda_version=torch.version.cuda or torch.version.hip,
        details=details | card | {"hardware": match.key, "l2_bytes": props.L2_cache_size, "nvidia_smi": smi,
                                  "gpus_visible": torch.cuda.device_count(), "topology": topology()},
        **common,
    )
