"""What one tensor-parallel rank keeps for backward, block by block (agent/parallel.py's plan).

Each variant builds the agent's decoder from a small preset, shards it over a
1-D mesh (``tp`` ranks, optionally sequence parallel) and probes one forward
with agent/probe.py, which counts a DTensor by its local shard. Tensors are
attributed to the block whose forward saved them (``blocks.{i}``), as the
ledger attributes them to a layer. ``tp == 1`` is the unsharded reference the
current core ledger already predicts.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh

from headroom.agent.bench_train import forward_loss
from headroom.agent.ledger_check import build
from headroom.agent.parallel import (
    local_tensor,
    parallelize_decoder,
    parallelize_tensor,
    vocabulary_loss,
)
from headroom.agent.probe import ProbedTensor, probe
from headroom.agent.rank import settled
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from tests.distributed.collectives import step_collectives


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorParallelCase:
    model: str
    """A ``bench-*`` preset; ``n_layers`` replaces its depth."""
    attention: str
    dropout: float
    precision: str
    """``bf16-pure`` (model.to(bfloat16)), ``amp-bf16`` (fp32 model under autocast) or ``fp32``."""
    tp: int
    sp: bool = False
    n_layers: int = 2
    seq_len: int = 32
    micro_batch: int = 2
    fp8: str = "off"
    """The block linears' FP8 recipe (headroom.core.specs.float8): converted before sharding, as torchtitan's
    model is built with its float8 linears and then sharded."""

    @property
    def name(self) -> str:
        layout = "single" if self.tp == 1 else f"tp{self.tp}" + ("-sp" if self.sp else "")
        fp8 = f"-{self.fp8}" if self.fp8 != "off" else ""
        return f"{self.model}-{self.attention}-p{self.dropout:g}-{self.precision}{fp8}-{layout}"

    @property
    def whole_decoder(self) -> bool:
        """Its step's collectives are measured with the vocabulary sharded too (headroom.agent.parallel.parallelize_decoder,
        as ``headroom agent train`` runs it): an untied decoder with rotary positions. Otherwise the blocks only."""
        spec = self.spec
        return spec.rotary and not spec.tied_embeddings and self.fp8 != "torchao-tensorwise"  # not torchtitan's

    @property
    def spec(self) -> ModelSpec:
        return dataclasses.replace(get_preset(self.model), n_layers=self.n_layers)

    @property
    def config(self) -> TrainConfig:
        """The single-device configuration (the layout is applied by ``measure``)."""
        return TrainConfig(seq_len=self.seq_len, micro_batch=self.micro_batch, attention=self.attention,
                           dropout=self.dropout, precision=self.precision, fp8=self.fp8)


POLICIES = ("none", "full", "op-selective")
"""The checkpoint policies each sharded case's step collectives are measured under."""


def cases(tp: int) -> list[TensorParallelCase]:
    """A GPT block (LayerNorm, GELU, biases, explicit attention with dropout) and a Llama block
    (RMSNorm, SwiGLU, SDPA flash, grouped key/value heads) in bf16 and under autocast, each unsharded,
    TP and TP+SP; and the bf16 Llama block's linears in float8 (each torchao recipe)."""
    blocks = [
        {"model": "bench-gpt-tiny", "attention": "standard", "dropout": 0.1, "precision": "bf16-pure"},
        {"model": "bench-llama-tiny", "attention": "flash", "dropout": 0.0, "precision": "bf16-pure"},
        {"model": "bench-llama-tiny", "attention": "flash", "dropout": 0.0, "precision": "amp-bf16"},
    ]
    # float8 on a CPU is slow (eager casts, DTensor's amax all-reduces): one layout each, rowwise (torchtitan's)
    # under sequence parallelism, tensorwise without
    float8 = [TensorParallelCase(model="bench-llama-tiny", attention="flash", dropout=0.0, precision="bf16-pure",
                                 fp8=fp8, tp=tp, sp=sp)
              for fp8, sp in (("torchao-rowwise", True), ("torchao-tensorwise", False))]
    return [TensorParallelCase(**block, tp=t, sp=sp)
            for block in blocks for t, sp in ((1, False), (tp, False), (tp, True))] + float8


def _tensor_row(t: ProbedTensor) -> dict:
    return {"module": t.module, "op": t.op, "shape": list(t.shape), "dtype": t.dtype, "bytes": t.nbytes,
            "kind": t.kind, "saved_by_autograd": t.saved_by_autograd}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return int(parts[1]) if len(parts) > 1 and parts[0] == "blocks" else None


def measure(case: TensorParallelCase, mesh: DeviceMesh) -> dict:
    """One case on this rank: saved tensors by layer, loss, the logits against the unsharded model, and a step's
    collectives under each of ``POLICIES`` (for the whole Llama decoder under torchtitan's as well)."""
    spec, config = case.spec, case.config
    model, tokens, targets = build(spec, config, "cpu", seed=0)
    reference = None
    if case.tp > 1:
        if mesh.size() != case.tp:
            raise ValueError(f"case {case.name} needs a mesh of {case.tp} ranks, got {mesh.size()}")
        reference, _, _ = build(spec, config, "cpu", seed=0)  # same seed: the same weights
        parallelize_tensor(model, mesh, case.sp)

    measured = probe(model, lambda: settled(forward_loss(model, tokens, targets, config.precision)))

    loss = forward_loss(model, tokens, targets, config.precision)
    loss.backward()
    grads_finite = all(torch.isfinite(local_tensor(p.grad)).all().item() for p in model.parameters())

    logit_diff, collectives, torchtitan, torchtitan_layers = None, None, None, None
    if reference is not None:
        model.eval(), reference.eval()
        with torch.no_grad():
            logit_diff = (model(tokens).float() - reference(tokens).float()).abs().max().item()
        collectives = {policy: _step_collectives(case, mesh, policy, tokens, targets) for policy in POLICIES}
        if case.whole_decoder:
            torchtitan = {policy: _step_collectives(case, mesh, policy, tokens, targets, "torchtitan")
                          for policy in POLICIES}
            torchtitan_layers = _layer_bytes(_torchtitan_forward(case, mesh, tokens, targets))
    return {
        "case": dataclasses.asdict(case) | {"name": case.name},
        "activation_bytes": measured.activation_bytes,
        "layer_bytes": _layer_bytes(measured),
        "torchtitan_layer_bytes": torchtitan_layers,
        "parameter_bytes": sum(local_tensor(p).untyped_storage().nbytes() for p in model.parameters()),
        "loss": loss.item(),
        "grads_finite": grads_finite,
        "max_logit_diff_vs_unsharded": logit_diff,
        "tensors": [_tensor_row(t) for t in measured.tensors],
        "collectives": collectives,
        "torchtitan_collectives": torchtitan,
    }


def _layer_bytes(measured) -> dict[str, int]:
    """What the probed forward kept for backward (activations and inputs), by block (``"0"``, ``"1"``, ...)
    and ``"other"``."""
    layer_bytes: dict[str, int] = {}
    for t in measured.tensors:
        if t.kind in ("activation", "input"):
            layer = _layer(t.module)
            key = "other" if layer is None else str(layer)
            layer_bytes[key] = layer_bytes.get(key, 0) + t.nbytes
    return layer_bytes


def _torchtitan_forward(case: TensorParallelCase, mesh: DeviceMesh, tokens: torch.Tensor, targets: torch.Tensor):
    """The probed forward of the case's decoder sharded as torchtitan shards it (fused q/k/v, each attention
    and MLP reading one DTensor), its vocabulary too."""
    config = dataclasses.replace(case.config, stack="torchtitan")
    model, _, _ = build(case.spec, config, "cpu", seed=0)
    parallelize_decoder(model, mesh, case.sp)
    with vocabulary_loss():
        return probe(model, lambda: settled(forward_loss(model, tokens, targets, config.precision)))


def _step_collectives(case: TensorParallelCase, mesh: DeviceMesh, policy: str, tokens: torch.Tensor,
                      targets: torch.Tensor, stack: str = "reference") -> dict:
    """The collectives of one training step of the case's sharded decoder (its vocabulary too where
    ``case.whole_decoder``, the loss then over the vocabulary's slices), its blocks checkpointed under
    ``policy`` as ``stack`` checkpoints them (tests/distributed/collectives.py)."""
    config = dataclasses.replace(case.config, recompute=parse_policy(policy), stack=stack)
    model, _, _ = build(case.spec, config, "cpu", seed=0)
    (parallelize_decoder if case.whole_decoder else parallelize_tensor)(model, mesh, case.sp)
    with vocabulary_loss() if case.whole_decoder else contextlib.nullcontext():
        return step_collectives(lambda: forward_loss(model, tokens, targets, config.precision))[1]
