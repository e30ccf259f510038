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

import logging

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


def inductor_kernels(block: nn.Module, x: torch.Tensor) -> list[dict[str, int]]:
    """What inductor makes of one block compiled alone, graph by graph (its forward, then its backward): the
    kernels it generates (each a fusion of memory-bound ops), the extern kernels it calls (GEMMs, attention) and
    the no-op views, each with the bytes it reads and writes as inductor counts them
    (``GraphLowering.count_bytes``, logged by its ``inductor_metrics`` artifact). Compiled afresh with inductor's
    graph caches off, so that every graph is lowered and counted; [] where this torch logs no graph metrics."""
    from torch._inductor import compile_fx

    logger = getattr(compile_fx, "inductor_metrics_log", None)
    if logger is None:
        return []
    graphs: list[dict[str, int]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found = record.args if isinstance(record.args, dict) else None
            if found is not None and "nodes_num_elem" in found:
                graphs.append(_graph_kernels(found["nodes_num_elem"]))

    handler, level = Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    torch._dynamo.reset()
    try:
        with torch._inductor.config.patch(fx_graph_cache=False, fx_graph_remote_cache=False):
            out = torch.compile(block)(x)
            out.float().sum().backward()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        torch._dynamo.reset()
    return graphs


def _graph_kernels(nodes: list[tuple[object, int]]) -> dict[str, int]:
    """One graph's scheduler nodes by kind, with their bytes (count_bytes logs each node's as bytes // 4)."""
    counts = {"kernels": 0, "kernel_bytes": 0, "externs": 0, "extern_bytes": 0}
    for node, words in nodes:
        kind = type(node).__name__
        if kind == "NopKernelSchedulerNode":
            continue
        key = "externs" if kind == "ExternKernelSchedulerNode" else "kernels"
        counts[key] += 1
        counts[f"{key[:-1]}_bytes"] += 4 * words
    return counts
