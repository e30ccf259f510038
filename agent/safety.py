"""Before a training step runs: can it fit? A step the core says cannot fit is not run.

On a GPU a step that does not fit ends in a clean out-of-memory error, but on
a CPU it ends in the kernel's OOM killer, which may take the agent, or
another process, with it. So the agent predicts each step's peak with the core
first and records a step that cannot fit as ``skipped``, naming the predicted
bytes and what the box has: the device's memory on a GPU (per rank); on a CPU
the memory the kernel reports available (``MemAvailable``), shared by the ranks.
"""

from __future__ import annotations

import torch

from headroom.core.memory.estimate import Estimate

CPU_HEADROOM = 0.9
"""Share of the available host memory a CPU step may plan to use."""


def available_host_bytes() -> int | None:
    """``MemAvailable`` from /proc/meminfo, bytes; None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def refusal(prediction: Estimate, device: torch.device, ranks: int = 1) -> str | None:
    """Why the step must not run on ``device`` (``ranks`` processes of it), or None when it may."""
    peak = prediction.peak_bytes
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        total = torch.cuda.get_device_properties(index).total_memory
        if peak > total:
            return (f"not run: the core predicts a peak of {peak / 1e9:,.1f} GB per rank, more than the "
                    f"{total / 1e9:,.1f} GB of {torch.cuda.get_device_name(index)}")
        return None
    available = available_host_bytes()
    if available is None:
        return None
    usable = int(available * CPU_HEADROOM)
    if peak * ranks > usable:
        each = f" per rank x {ranks} ranks" if ranks > 1 else ""
        return (f"not run: the core predicts a peak of {peak / 1e9:,.1f} GB{each}, more than the "
                f"{usable / 1e9:,.1f} GB this host can spare ({CPU_HEADROOM:.0%} of {available / 1e9:,.1f} GB "
                "available); a CPU would meet the kernel's OOM killer, not an out-of-memory error")
    return None
