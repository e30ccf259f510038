"""Memory bandwidth through elementwise ops: copy, add, ReLU, GELU and LayerNorm.

Tensors are several times the L2 so every call streams from memory (on a CPU,
each at least four times the last-level cache as the kernel reports it: the
STREAM benchmark's rule, McCalpin, "STREAM: Sustainable Memory Bandwidth in
High Performance Computers", run rules). Bytes are
counted honestly, read plus write: a copy moves 2N elements, an add 3N (two
reads, one write), ReLU, GELU and LayerNorm 2N (the LayerNorm weights are
negligible). GELU costs about what ReLU costs: both are memory-bound, the
extra arithmetic hides under the memory traffic.
"""

from __future__ import annotations

import functools

import torch

from headroom.agent.cases import Case
from headroom.agent.operands import random_normal
from headroom.agent.timer import cpu_cache_bytes, time_fn
from headroom.db.models import ElementwiseResult

# op -> (elements of N read plus written, the call). Copy, add, ReLU and GELU write into a
# preallocated output (out= variants with kernels of their own), so no allocation is timed.
# LayerNorm has no such kernel (its .out variant runs the functional op and copies, which would
# move 4N, not 2N): it allocates its output through the caching allocator, which costs
# microseconds against the milliseconds of a pass over a tensor several times the L2.
OPS = {
    "copy": (2, lambda x, y, out: out.copy_(x)),
    "add": (3, lambda x, y, out: torch.add(x, y, out=out)),
    "relu": (2, lambda x, y, out: torch.clamp_min(x, 0, out=out)),
    "gelu": (2, lambda x, y, out: torch.ops.aten.gelu.out(x, out=out)),
    "layernorm": (2, lambda x, y, out: torch.nn.functional.layer_norm(x, x.shape[-1:], eps=1e-5)),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def measure(device: torch.device, op: str, dtype: str, elements: int, budget_s: float) -> ElementwiseResult:
    factor, call = OPS[op]
    torch_dtype = DTYPES[dtype]
    x = random_normal(elements // 1024, 1024, dtype=torch_dtype, device=device)
    y = random_normal(*x.shape, dtype=torch_dtype, device=device) if op == "add" else None  # the only binary op
    out = torch.empty_like(x)
    timing = time_fn(lambda i: call(x, y, out), device, budget_s=budget_s)
    moved = factor * x.numel() * x.element_size()
    return ElementwiseResult(
        op=op, dtype=dtype, elements=x.numel(), bytes_moved=moved, samples_s=list(timing.samples_s),
        median_s=timing.median_s, min_s=timing.min_s, max_s=timing.max_s, gb_per_s=moved / timing.median_s / 1e9,
        details=timing.details(),
    )


STREAM_CACHE_MULTIPLE = 4
"""On a CPU each tensor is at least this many times the last-level cache (STREAM's rule)."""


def streaming_elements(device: torch.device, dtype: str, elements: int) -> int:
    """``elements``, or on a CPU more: enough that one tensor is STREAM_CACHE_MULTIPLE x the last-level
    cache (rounded up to whole rows of 1024)."""
    if device.type != "cpu":
        return elements
    needed = STREAM_CACHE_MULTIPLE * cpu_cache_bytes() // DTYPES[dtype].itemsize
    return max(elements, -(-needed // 1024) * 1024)


def cases(device: torch.device, elements: int, budget_s: float) -> list[Case]:
    dtype = "bf16" if device.type == "cuda" else "fp32"
    elements = streaming_elements(device, dtype, elements)
    return [
        Case(
            kind="elementwise",
            name=f"{op} {dtype} {elements * DTYPES[dtype].itemsize / 2**20:,.0f} MiB",
            expected_s=budget_s + 0.3,
            measure=functools.partial(measure, op=op, dtype=dtype, elements=elements, budget_s=budget_s),
            failed=lambda status, message, op=op: ElementwiseResult(  # the bytes it would have moved
                op=op, dtype=dtype, elements=elements, bytes_moved=OPS[op][0] * elements * DTYPES[dtype].itemsize,
                status=status, message=message
            ),
        )
        for op in OPS
    ]
