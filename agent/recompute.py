"""Activation-checkpoint policies applied to the decoder's blocks.

Every policy uses ``torch.utils.checkpoint`` with ``use_reentrant=False``,
which keeps each checkpointed region's inputs (saved through a no-op autograd
function, so ``saved_tensors_hooks`` sees them) and replays the region in
backward with the RNG state it had in forward, so dropout masks come out the
same.

- ``none``: plain forward.
- ``full``: each block is a checkpointed region.
- ``every-K``: consecutive segments of K blocks are regions (the last one may
  be shorter); every segment is checkpointed, the last one included.
- ``selective``: only the attention core (scores, softmax, dropout, PV) of each
  block is a region (applied inside ``Attention``).
- ``op-selective``: each block is a region whose matmul and attention outputs
  are saved (``create_selective_checkpoint_contexts``); elementwise ops are
  recomputed.
- ``offload``: the blocks' saved tensors move to host memory
  (``torch.autograd.graph.save_on_cpu``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from core.recompute import RecomputePolicy

aten = torch.ops.aten

# Ops whose outputs op-selective keeps: the matmuls and the fused attention kernels.
SAVED_BY_OP_SELECTIVE = frozenset(
    {
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
    }
)


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_BY_OP_SELECTIVE else CheckpointPolicy.PREFER_RECOMPUTE


def op_selective_context():
    return create_selective_checkpoint_contexts(_save_matmuls)


def _run(blocks: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x


def apply_blocks(blocks: Sequence[nn.Module], x: torch.Tensor, policy: RecomputePolicy) -> torch.Tensor:
    """Run the blocks under a checkpoint policy (``selective`` lives in Attention)."""
    if not torch.is_grad_enabled() or not (policy.recomputes_blocks or policy.caches_matmuls or policy.offloads):
        return _run(blocks, x)
    if policy.offloads:
        with torch.autograd.graph.save_on_cpu(pin_memory=x.is_cuda):
            return _run(blocks, x)
    if policy.caches_matmuls:
        for block in blocks:
            x = checkpoint(block, x, use_reentrant=False, context_fn=op_selective_context)
        return x
    size = policy.segment_layers(len(blocks))
    for start in range(0, len(blocks), size):
        segment = blocks[start : start + size]
        x = checkpoint(functools.partial(_run, segment), x, use_reentrant=False)
    return x


def checkpointed(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
    """One checkpointed region (used for the attention core under ``selective``)."""
    return checkpoint(fn, *args, use_reentrant=False)
