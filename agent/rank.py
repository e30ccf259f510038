"""What every rank of a launched benchmark does first: join the process group, pick its device.

NCCL on GPUs (rank i on ``cuda:LOCAL_RANK``), gloo on the CPU. Every
collective runs under the group's timeout, so a peer that died turns into an
error on the survivors instead of a wait forever.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class RankInfo:
    rank: int
    world: int
    device: torch.device
    backend: str


def add_rank_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device-type", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--timeout-s", type=float, default=120.0,
                        help="seconds any collective may wait before the process group gives up")


def join(device_type: str, timeout_s: float) -> RankInfo:
    """Initialise the default process group from torch's launcher's environment."""
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        torch.set_num_threads(1)  # N ranks share the box's cores
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kwargs)
    return RankInfo(dist.get_rank(), dist.get_world_size(), device, backend)


SETTLE_S = 0.05
"""How long `settled` lets gloo's worker threads run after the barrier: they drop a finished collective's
buffers within microseconds when they get a core, and a busy 2-core box deschedules them for milliseconds."""


def settled(loss: torch.Tensor) -> torch.Tensor:
    """``loss``, once every rank got here and the collectives before it let go of their buffers.

    What a probe reads right after a forward must not include a buffer only the backend still holds:
    gloo's worker thread signals a collective done, then drops its reference to the work and its tensors,
    and a barrier waits for the first, not the second. Seen without the pause: one rank of two kept the
    last all-reduce's or all-gather's output (8-12 KiB in the tests' toy blocks), once in tens of probes
    on a loaded machine. NCCL's buffers are the caching allocator's and need no pause.
    """
    if dist.is_initialized():
        dist.barrier()
        if dist.get_backend() == "gloo":
            time.sleep(SETTLE_S)
    return loss


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
