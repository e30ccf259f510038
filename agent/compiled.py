"""torch.compile of the decoder's blocks, as torchtitan compiles them.

torchtitan 0.3 (``--compile.enable``; ``apply_compile`` in ``torchtitan/models/llama3/infra/parallelize.py``)
wraps each transformer block in its activation checkpoint first and then compiles the wrapped block, so the
checkpoint runs inside the compiled region (dynamo traces it as ``tag_activation_checkpoint``) and inductor's
partitioner decides what the block keeps for backward. The agent does the same: each block, under full
checkpointing wrapped in its ``torch.utils.checkpoint`` first (`CheckpointedBlock`), is compiled; the decoder's
own checkpointing is then off. What a compiled block keeps is measured by autograd's
saved-tensor hooks alone (headroom.agent.probe: a dispatch mode would make dynamo run the block eagerly).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from headroom.core.specs.config import COMPILED_POLICIES
from headroom.core.specs.recompute import RecomputePolicy


class CheckpointedBlock(nn.Module):
    """One block under full checkpointing, the checkpoint part of the module torch.compile compiles (torchtitan's
    ``ptd_checkpoint_wrapper``)."""

    def __init__(self, block: nn.Module, stack: str) -> None:
        super().__init__()
        self.block = block
        self.early_stop = stack != "torchtitan"  # torchtitan's full AC reruns the whole block (Stack.early_stop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False, early_stop=self.early_stop)


def compile_blocks(model: nn.Module, policy: RecomputePolicy, stack: str) -> None:
    """Compile each of ``model.blocks`` in place (under full, its checkpoint inside), and turn the model's own
    checkpointing off. Modules, not bound methods, are compiled, as torchtitan does: dynamo inlines a module and
    reuses one graph for every block of a kind, where a method of each block would recompile for each until its
    limit (8) and then run eagerly. A policy other than none or full is not measured compiled
    (headroom.core.specs.config.COMPILED_POLICIES)."""
    if policy.kind not in COMPILED_POLICIES:
        raise ValueError(f"a compiled block is measured without checkpointing and under full, not {policy}")
    # Compiled afresh: a process that compiles many models (the agent's sweep, a test run) would pile its
    # recompiles up on the block's code until dynamo's limit, and then run the blocks eagerly.
    torch._dynamo.reset()
    for i, block in enumerate(model.blocks):
        model.blocks[i] = torch.compile(CheckpointedBlock(block, stack) if policy.recomputes_blocks else block)
    model.recompute = RecomputePolicy("none")
