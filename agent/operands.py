"""Benchmark inputs: random normal tensors, cheap to make where the drawing would cost more than the timing.

The benchmarks size their inputs to stream from memory, several times the
last-level cache: on a CPU with a 260 MiB L3 that is a gigabyte per tensor,
and ``torch.randn`` draws about 150 M elements/s on two cores (128 Mi fp32
elements in 0.87 s; filled from one drawn tile, 0.13 s). What the benchmarks need is distinct memory holding ordinary values, not
independent draws: on a CPU one tile is drawn and copied over the rest
(at memory speed); a GPU draws everything,
as fast as it copies.
"""

from __future__ import annotations

import torch

TILE_ELEMENTS = 2**20
"""Elements drawn once on a CPU and repeated (4 MiB in fp32: noise against the tensors it fills)."""


def random_normal(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A contiguous tensor of ``shape`` holding standard normal values (on a CPU, one drawn tile repeated)."""
    if device.type != "cpu":
        return torch.randn(*shape, dtype=dtype, device=device)
    out = torch.empty(*shape, dtype=dtype, device=device)
    flat = out.view(-1)
    tile = torch.randn(min(flat.numel(), TILE_ELEMENTS), dtype=dtype)
    whole = flat.numel() // tile.numel() * tile.numel()
    flat[:whole].view(-1, tile.numel()).copy_(tile.expand(whole // tile.numel(), -1))
    flat[whole:].copy_(tile[: flat.numel() - whole])
    return out
