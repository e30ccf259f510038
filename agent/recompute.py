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

Under the ``torchtitan`` stack (headroom.core.specs.stack) ``full`` and ``op-selective`` are
torchtitan's own (torchtitan 0.3, ``torchtitan/distributed/activation_checkpoint.py``):
``FullAC`` checkpoints each block with ``early_stop=False``; ``SelectiveAC``
saves the outputs of ``torchtitan_saved()`` ops except every second ``aten.mm``
(or ``aten.linear``) of a block, counted afresh for each block's forward and
again for its recompute.
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

from headroom.core.specs.recompute import RecomputePolicy

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



@functools.cache
def torchtitan_saved() -> frozenset:
    """torchtitan's ``_get_default_save_ops``: torch's compute-intensive ops (mm, addmm, bmm, the CUDA attention
    kernels, ...), SDPA's math, cuDNN and overrideable kernels, max, linear, topk, flex attention, and the
    reduce-scatter and all-to-all collectives, and inductor's compiled code where torch has it (its other
    optional ops belong to libraries the agent does not use). Built on first use: torch's partitioner module
    imports dynamo and inductor, two seconds of every agent process's start-up otherwise."""
    from torch._functorch.partitioners import get_default_op_list

    ops = {op.default for op in get_default_op_list().compute_intensive_ops}
    ops |= {aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_attention_math.default,
            aten._scaled_dot_product_fused_attention_overrideable.default, aten.max.default,
            torch._higher_order_ops.flex_attention, aten.linear.default, aten.topk.default,
            torch.ops._c10d_functional.reduce_scatter_tensor.default,
            torch.ops._c10d_functional.all_to_all_single.default}
    compiled = getattr(torch._higher_order_ops, "inductor_compiled_code", None)
    return frozenset(ops | ({compiled} if compiled is not None else set()))


TORCHTITAN_MM = (aten.mm.default, aten.linear.default)


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_BY_OP_SELECTIVE else CheckpointPolicy.PREFER_RECOMPUTE


def op_selective_context():
    return create_selective_checkpoint_contexts(_save_matmuls)


def torchtitan_context():
    """torchtitan's SelectiveAC policy for one block: a fresh count of its matmuls, kept apart for the forward
    and the recompute."""
    count = {"forward": 0, "recompute": 0}
    saved = torchtitan_saved()

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if op in TORCHTITAN_MM:
            count[mode] += 1
        if op in saved and not (op in TORCHTITAN_MM and count[mode] % 2 == 0):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _run(blocks: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x


def apply_blocks(blocks: Sequence[nn.Module], x: torch.Tensor, policy: RecomputePolicy,
                 stack: str = "reference") -> torch.Tensor:
    """Run the blocks under a checkpoint policy (``selective`` lives in Attention), as ``stack`` applies it."""
    if not torch.is_grad_enabled() or not (policy.recomputes_blocks or policy.caches_matmuls or policy.offloads):
        return _run(blocks, x)
    if policy.offloads:
        with torch.autograd.graph.save_on_cpu(pin_memory=x.is_cuda):
            return _run(blocks, x)
    titan = stack == "torchtitan"
    if policy.caches_matmuls:
        context = torchtitan_context if titan else op_selective_context
        for block in blocks:
            x = checkpoint(block, x, use_reentrant=False, context_fn=context, early_stop=not titan)
        return x
    size, checkpointed = policy.segment_layers(len(blocks)), policy.recomputed_layers(len(blocks))
    for start in range(0, checkpointed, size):
        segment = blocks[start : min(start + size, checkpointed)]
        x = checkpoint(functools.partial(_run, segment), x, use_reentrant=False, early_stop=not titan)
    return _run(blocks[checkpointed:], x)  # block-K's blocks past the first K keep everything


def checkpointed(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
    """One checkpointed region (used for the attention core under ``selective``)."""
    return checkpoint(fn, *args, use_reentrant=False)
