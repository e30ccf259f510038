"""The ops one micro-batch's forward runs on a rank: the time model's enumeration.

It is the ledger's own replay (core/memory/forward_trace.py) with its op log on (headroom.core.memory.trace.Trace.ops): every tensor
an op makes is one op, priced by what it writes, except that a linear's output is a GEMM of the linear's shape
(per expert under a mixture of experts), a fused attention kernel's outputs are one attention op, and the
explicit attention's two batched products are GEMMs. The shapes are the rank's (headroom.core.memory.trace.Dims: tensor,
sequence and context parallelism split them), and the kernels the stack's and the device's, as the ledger
counts them: what the ledger checks byte for byte against autograd is what the time model prices.

One block of each kind is traced without checkpointing (what a block runs does not depend on what it keeps),
and the model's tail (final norm, head, loss) once; a layer's ops are its kind's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace

from headroom.core.memory.forward_trace import (
    new_trace,
    trace_block,
    trace_embedding,
    trace_head,
)
from headroom.core.memory.trace import Dims, Trace, TracedOp
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.devices import device_rules
from headroom.core.specs.layout import Layout
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.recompute import RecomputePolicy


@dataclass(frozen=True, slots=True)
class ForwardOps:
    """One micro-batch's forward on one rank, as ops."""

    dense_block: tuple[TracedOp, ...]
    """One dense block's ops (empty when every block is a mixture of experts)."""
    moe_block: tuple[TracedOp, ...]
    """One mixture-of-experts block's ops (empty for a dense model)."""
    dense_layers: int
    moe_layers: int
    head: tuple[TracedOp, ...]
    """The final norm, head and loss (on the last stage), and the embedding (on the first)."""
    backward_only: int = 0
    """Its ops that launch no forward kernel (Transformer Engine's output-gradient casts), all blocks counted."""
    bf16_block: tuple[TracedOp, ...] = ()
    """One dense block's ops outside the FP8 recipe (TrainConfig.first_last_bf16), which ``bf16_layers`` of the
    ``dense_layers`` run."""
    bf16_layers: int = 0

    @property
    def launches(self) -> int:
        """Kernels the forward launches."""
        return sum(len(ops) * n for ops, n in self.blocks) + len(self.head) - self.backward_only

    @property
    def blocks(self) -> tuple[tuple[tuple[TracedOp, ...], int], ...]:
        """(a block's ops, how many such blocks) for each kind the rank runs."""
        kinds = ((self.dense_block, self.dense_layers - self.bf16_layers), (self.moe_block, self.moe_layers),
                 (self.bf16_block, self.bf16_layers))
        return tuple((ops, n) for ops, n in kinds if n)


def forward_ops(spec: ModelSpec, config: TrainConfig, device: str, layers: int, first: bool = True,
                last: bool = True) -> ForwardOps:
    """The ops of one micro-batch's forward on a rank of ``layers`` blocks (its pipeline stage's: the embedding
    on the ``first``, the head and loss on the ``last``)."""
    plain = ops_config(config)
    moe_layers = min(layers, spec.moe_layers)
    dense = _block_ops(spec, plain, device, moe=False) if layers > moe_layers else ()
    moe = _block_ops(spec, plain, device, moe=True) if moe_layers else ()
    head = (_embedding_ops(spec, plain, device) if first else ()) + (_head_ops(spec, plain, device) if last else ())
    dense_layers = layers - moe_layers
    bf16_layers = plain.bf16_blocks(dense_layers, first, last)
    bf16 = _block_ops(spec, _without_fp8(plain), device, moe=False) if bf16_layers else ()
    skipped = 0
    if plain.te_fp8:  # the only recipes with backward-only ops, all in the blocks under the recipe
        skipped = sum(n * sum(op.backward_only for op in ops)
                      for ops, n in ((dense, dense_layers - bf16_layers), (moe, moe_layers)))
    return ForwardOps(dense, moe, dense_layers, moe_layers, head, skipped, bf16, bf16_layers)


@functools.lru_cache(maxsize=1024)
def _without_fp8(config: TrainConfig) -> TrainConfig:
    """The configuration of a block `TrainConfig.first_last_bf16` keeps out of the FP8 recipe."""
    return replace(config, fp8="off", fp8_param_gather=False, first_last_bf16=False)


def ops_config(config: TrainConfig) -> TrainConfig:
    """The configuration without checkpointing, and without what no op's shape depends on: configurations with the
    same one run the same ops. Kept by those fields alone (a layout search asks for it of every candidate, most of
    them alike but for their policy and data-parallel ranks)."""
    layout = _ops_layout(config.layout, config.fsdp_mixed_precision)
    key = (layout, *(getattr(config, name) for name in _OPS_FIELDS))
    found = _OPS_CONFIGS.get(key)
    if found is None:
        if len(_OPS_CONFIGS) >= OPS_CONFIGS_KEPT:
            _OPS_CONFIGS.clear()
        found = _OPS_CONFIGS[key] = replace(config, recompute=RecomputePolicy("none"), layout=layout)
    return found


_OPS_FIELDS = tuple(f.name for f in fields(TrainConfig) if f.name not in ("recompute", "layout"))
_OPS_CONFIGS: dict[tuple, TrainConfig] = {}
OPS_CONFIGS_KEPT = 4096
"""`ops_config`'s results kept at once (a search's candidates share a few hundred)."""


@functools.lru_cache(maxsize=4096)
def _ops_layout(layout: Layout, fsdp_mixed_precision: bool) -> Layout:
    """A layout's part that decides a rank's shapes (`ops_config`): one pipeline stage of one chunk, the fewest
    data-parallel ranks, and the sharding stage only where FSDP gathers 16-bit units."""
    return replace(layout.fewest_data_parallel(), zero=3 if fsdp_mixed_precision else 0, schedule="1f1b",
                   virtual_stages=1, pp=1, stage_layers=None)


@functools.lru_cache(maxsize=1024)
def _block_ops(spec: ModelSpec, config: TrainConfig, device: str, moe: bool) -> tuple[TracedOp, ...]:
    layer = next((n for n in range(spec.n_layers) if spec.is_moe_layer(n) == moe), 0)
    rules = device_rules(device)
    d = Dims.of(spec, config)
    param_dtype = config.block_param_dtype
    tr = new_trace(spec, config, rules, layer)
    x = tr.new("input", (d.b, d.rows, d.h), param_dtype)
    tr.ops = []
    trace_block(tr, spec, d, config, x, param_dtype)
    cp = config.layout.cp
    # Ring attention: the rank's s / cp queries meet every key, s / cp at a time over cp steps (one kernel each).
    return tuple(replace(op, flops=op.flops * cp) if op.kind == "attention" and cp > 1 else op for op in _recorded(tr))


@functools.lru_cache(maxsize=1024)
def _head_ops(spec: ModelSpec, config: TrainConfig, device: str) -> tuple[TracedOp, ...]:
    d = Dims.of(spec, config)
    param_dtype = config.block_param_dtype
    tr = new_trace(spec, config, device_rules(device))
    x = tr.new("blocks_output", (d.b, d.rows, d.h), param_dtype)
    tr.ops = []
    trace_head(tr, spec, config, d, x, param_dtype)
    return _recorded(tr)


@functools.lru_cache(maxsize=1024)
def _embedding_ops(spec: ModelSpec, config: TrainConfig, device: str) -> tuple[TracedOp, ...]:
    d = Dims.of(spec, config)
    tr = new_trace(spec, config, device_rules(device))
    tr.ops = []
    trace_embedding(tr, spec, config, d, config.block_param_dtype)
    return _recorded(tr)


def _recorded(tr: Trace) -> tuple[TracedOp, ...]:
    """The ops a trace recorded, less the places of fused kernels' other outputs (headroom.core.memory.trace.Trace.unrecord)."""
    return tuple(op for op in tr.ops if op is not None)
