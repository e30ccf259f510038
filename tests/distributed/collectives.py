"""The collectives one forward and one backward run on this rank, as torch's profiler sees them.

The profiler sits below DTensor's dispatch, so it sees every collective, those DTensor runs inside an op
(a partial sum made whole before a multiply) included, where a dispatch mode above DTensor would not.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile


def step_collectives(forward: Callable[[], torch.Tensor]) -> tuple[float, dict]:
    """The loss ``forward()`` returns, and the collectives of that forward and of the loss's backward: each
    DTensor (functional) collective as [op, input shape, input dtype], and how many all-reduces c10d ran in
    all, those among them."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as forward_pass:
        loss = forward()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as backward_pass:
        loss.backward()
    return loss.item(), {"forward": _collectives(forward_pass), "backward": _collectives(backward_pass)}


def _collectives(profiled: profile) -> dict:
    # Under a dispatch mode (selective checkpointing's) the profiler records a collective where it is called and
    # again inside, where it runs; one whose output the mode kept from forward is recorded but never runs. Count
    # what runs: the innermost, with c10d's own op under it.
    events = profiled.events()
    functional = []
    for event in events:
        if not event.name.startswith("_c10d_functional::") or "wait" in event.name or "wrap" in event.name:
            continue
        below = _descendants(event)
        if event.name not in below and any(name.startswith("c10d::") for name in below):
            functional.append([event.name.split("::")[1], event.input_shapes[0], event.input_dtypes[0]])
    return {"functional": functional, "c10d_all_reduces": sum(event.name == "c10d::allreduce_" for event in events)}


def _descendants(event) -> set[str]:
    names, below = set(), list(event.cpu_children)
    while below:
        child = below.pop()
        names.add(child.name)
        below += child.cpu_children
    return names


OPS = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
       "all_to_all_single": "all_to_all"}
"""torch's functional collectives (DTensor's, and the all-to-alls of expert parallelism) by the names headroom.core.timing.comm
gives them."""


ELEMENT_BYTES = {"double": 8, "float": 4, "c10::BFloat16": 2, "c10::Half": 2}
"""Bytes of one value, by the dtype name torch's profiler records."""


def messages(collectives: dict, world: int) -> Counter:
    """The calls of a step's collectives (``step_collectives``) by (headroom.core.timing.comm's op, message bytes), a message
    as nccl-tests sizes it: an all-gather's whole output (its input from each of ``world`` ranks), a
    reduce-scatter's, an all-reduce's and an all-to-all's whole input."""
    calls: Counter = Counter()
    for phase in collectives.values():
        for op, shape, dtype in phase["functional"]:
            values = math.prod(shape) * (world if op == "all_gather_into_tensor" else 1)
            calls[OPS[op], values * ELEMENT_BYTES[dtype]] += 1
    return calls


def other_all_reduces(collectives: dict) -> int:
    """All-reduces c10d ran beside DTensor's own (``torch.distributed.all_reduce`` on a gradient)."""
    return sum(phase["c10d_all_reduces"] - sum(call[0] == "all_reduce" for call in phase["functional"])
               for phase in collectives.values())
