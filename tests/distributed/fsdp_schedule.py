"""FSDP2's collectives and gathered memory over a step of two micro-batches, under each resharding and
gradient-sync setting (headroom.core.specs.data_parallel), measured on one rank.

torchtitan's units (agent/parallel.py ``shard_fully``: the embedding, each block, the final norm with the head
never resharded after forward, the root), bf16 gathers and fp32 reductions. Per case, at every op of the
second step's forward and backward passes a dispatch mode records:

- each all-gather and reduce-scatter c10d runs, by pass (``forward 0``, ``backward 1``, ...): its op and the
  bytes of its whole (gathered) buffer;
- the parameters gathered at once (bytes of the units' all-gather buffers and unsharded storages), the most
  in each pass;
- the unsharded gradients kept between micro-batches (FSDP2's ``unsharded_accumulated_grad``), the most.

A vocabulary of 2,048 splits evenly over 2 and 4 ranks, so no unit is padded and each buffer is the unit's
bytes exactly; and it makes the embedding's and the head's units the largest (131,072 parameters against a
block's 46,208), as they are in Llama 3 8B, so that a rule that holds only for equal units shows.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.utils._python_dispatch import TorchDispatchMode

from headroom.agent.model import Decoder
from headroom.agent.parallel import local_tensor, shard_fully
from tests.distributed.data_parallel import (
    MICRO_BATCH,
    SEQ_LEN,
    SPEC,
    _gathered_bytes,
    _units,
)

SCHEDULE_SPEC = replace(SPEC, name="fsdp-schedule-tiny", vocab_size=2048)
MICRO_BATCHES, STEPS = 2, 2
COLLECTIVES = {"_allgather_base_": "all_gather", "_reduce_scatter_base_": "reduce_scatter",
               "allgather_into_tensor_coalesced_": "all_gather", "reduce_scatter_tensor_coalesced_": "reduce_scatter"}
"""c10d's ops by the names headroom.core.timing.comm gives them."""


def cases(world: int) -> dict[str, dict]:
    """The settings measured on ``world`` ranks: (reshard_after_forward, defer_gradient_sync)."""
    measured = {"resharded": {"reshard_after_forward": True, "defer_gradient_sync": False},
                "kept": {"reshard_after_forward": False, "defer_gradient_sync": False},
                "deferred": {"reshard_after_forward": True, "defer_gradient_sync": True}}
    if world >= 4:
        measured["shard over 2"] = {"reshard_after_forward": 2, "defer_gradient_sync": False}
    return measured


class _Recorder(TorchDispatchMode):
    def __init__(self, units: dict[str, object]) -> None:
        super().__init__()
        self.units = units
        self.phase = ""
        self.calls: list[list] = []
        self.gathered: dict[str, int] = {}
        self.accumulated = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.namespace == "c10d" and name in COLLECTIVES:
            whole = args[0] if "allgather" in name else args[1]  # the gathered output; the reduce-scatter's input
            tensors = whole if isinstance(whole, (list, tuple)) else [whole]
            self.calls.append([self.phase, COLLECTIVES[name],
                               sum(t.numel() * t.element_size() for t in tensors)])
        held = sum(_gathered_bytes(group) for group in self.units.values())
        self.gathered[self.phase] = max(self.gathered.get(self.phase, 0), held)
        self.accumulated = max(self.accumulated, sum(
            local_tensor(param.unsharded_accumulated_grad).untyped_storage().nbytes()
            for group in self.units.values() for param in group.fsdp_params
            if getattr(param, "unsharded_accumulated_grad", None) is not None))
        return out


def _batch(rank: int, micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * rank + micro_batch)
    return (torch.randint(0, SCHEDULE_SPEC.vocab_size, (MICRO_BATCH, SEQ_LEN), generator=generator),
            torch.randint(0, SCHEDULE_SPEC.vocab_size, (MICRO_BATCH, SEQ_LEN), generator=generator))


def measure_case(mesh: DeviceMesh, reshard_after_forward: bool | int, defer_gradient_sync: bool) -> dict:
    torch.manual_seed(0)
    model = shard_fully(Decoder(SCHEDULE_SPEC, attention="flash").train(), mesh, units="torchtitan",
                        reshard_after_forward=reshard_after_forward)
    units = _units(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    recorder = _Recorder(units)
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        for micro in range(MICRO_BATCHES):
            last = micro == MICRO_BATCHES - 1
            if defer_gradient_sync:
                model.set_requires_gradient_sync(last)
            tokens, targets = _batch(dist.get_rank(), micro)
            if step == STEPS - 1:  # the steady state: every buffer exists already
                with recorder:
                    recorder.phase = f"forward {micro}"
                    loss = model(tokens, targets)
                    recorder.phase = f"backward {micro}"
                    loss.backward()
            else:
                model(tokens, targets).backward()
        optimizer.step()
    return {"calls": recorder.calls, "gathered": recorder.gathered, "accumulated_grad_bytes": recorder.accumulated,
            "unit_parameters": {name: sum(p.sharded_param.numel() for p in group.fsdp_params)  # DTensor: global
                                for name, group in units.items()}}


def measure(mesh: DeviceMesh) -> dict:
    """Every case of `cases` on this rank."""
    return {"world_size": mesh.size(), "spec": SCHEDULE_SPEC.to_dict(), "seq_len": SEQ_LEN,
            "micro_batch": MICRO_BATCH, "micro_batches": MICRO_BATCHES,
            "cases": {name: measure_case(mesh, **settings) | {"settings": settings}
                      for name, settings in cases(mesh.size()).items()}}
