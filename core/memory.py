"""Memory of a training step on one rank: static state, activations, logits, peak.

All figures are bytes (ints) on one data-parallel rank.

Activations here use the published per-layer formula of Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models" (2022), Sec. 4:
a GPT block in 16 bits with dropout and standard attention keeps
sbh(34 + 5as/h) bytes. It is generalised below to the element size and to
"no dropout" / "flash attention" by keeping its tensor-by-tensor derivation.
It describes a GPT block; for ``llama`` blocks it is an approximation until the
per-tensor ledger (checked against autograd) replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config import TrainConfig
from core.model import ModelSpec
from core.precision import get_precision, optimizer_state_bytes


def _shard(total: int, ranks: int, sharded: bool) -> int:
    return -(-total // ranks) if sharded else total


@dataclass(frozen=True, slots=True)
class StaticMemory:
    """Bytes that live for the whole step, per rank."""

    parameters: int
    gradients: int
    master_weights: int
    optimizer_states: int
    weight_copies: int
    """16-bit copies of matmul weights that autocast makes in forward and backward keeps."""

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.master_weights + self.optimizer_states + self.weight_copies


def static_bytes_per_parameter(precision: str, optimizer: str) -> int:
    """Unsharded param + grad + master + optimizer bytes per parameter (no weight copies)."""
    recipe = get_precision(precision)
    return recipe.param_bytes + recipe.grad_bytes + recipe.master_bytes + optimizer_state_bytes(optimizer)


def static_memory(spec: ModelSpec, config: TrainConfig) -> StaticMemory:
    """Parameters, gradients, master copy and optimizer state of a model, per rank."""
    return static_memory_of(spec.parameters, spec.matmul_weight_parameters(), config)


def static_memory_of(parameters: int, matmul_weight_parameters: int, config: TrainConfig) -> StaticMemory:
    """Static bytes per rank for a parameter count, sharded by ZeRO stage.

    Stage 1 shards optimizer state and the master copy over the data-parallel
    ranks, stage 2 also gradients, stage 3 (FSDP) also parameters (Rajbhandari
    et al., "ZeRO", 2020, Fig. 1). Under stage 3 the autocast weight copies are
    counted sharded too, an approximation: FSDP gathers one block at a time.
    """
    recipe = get_precision(config.precision)
    n, ranks, stage = parameters, config.dp, config.zero
    return StaticMemory(
        parameters=_shard(n * recipe.param_bytes, ranks, stage >= 3),
        gradients=_shard(n * recipe.grad_bytes, ranks, stage >= 2),
        master_weights=_shard(n * recipe.master_bytes, ranks, stage >= 1),
        optimizer_states=_shard(n * optimizer_state_bytes(config.optimizer), ranks, stage >= 1),
        weight_copies=_shard(matmul_weight_parameters * recipe.weight_copy_bytes, ranks, stage >= 3),
    )


@dataclass(frozen=True, slots=True)
class LayerActivations:
    """Bytes one block keeps for backward, split by how they scale."""

    linear: int
    """Terms linear in s (the 34 sbh of the formula)."""
    quadratic: int
    """Terms in s^2 (the 5 a s^2 b of the formula): scores, softmax, dropout."""

    @property
    def total(self) -> int:
        return self.linear + self.quadratic


def layer_activations(
    seq_len: int, micro_batch: int, hidden: int, heads: int, *,
    element_bytes: int = 2, dropout: bool = True, flash: bool = False,
) -> LayerActivations:
    """Korthikanti et al. per-layer activations, tensor by tensor.

    16-bit elements (e) and 1-byte dropout masks (m); sbh = s*b*h, as2b = a*s^2*b:
      attention: QKV input e, Q and K 2e, V e, output-projection input e,
                 output dropout mask m                       -> 5e sbh + m sbh
                 softmax output e, attention-dropout mask m and output e  -> (2e + m) as2b
      MLP:       up input e, GELU input 4e, down input 4e, dropout mask m -> 9e sbh + m sbh
      norms:     two LayerNorm inputs                        -> 2e sbh
    With e = 2, m = 1: sbh(34 + 5as/h). Without dropout the masks and the
    dropout output go: 32 sbh + 2 as2b. Flash attention keeps no s x s tensor.
    """
    sbh = seq_len * micro_batch * hidden
    as2b = heads * seq_len * seq_len * micro_batch
    mask = 1 if dropout else 0
    linear = sbh * (16 * element_bytes + 2 * mask)
    quadratic = 0 if flash else as2b * ((2 * element_bytes + mask) if dropout else element_bytes)
    return LayerActivations(linear=linear, quadratic=quadratic)


@dataclass(frozen=True, slots=True)
class ActivationMemory:
    per_layer: LayerActivations
    """One block's saved tensors without recompute."""
    device: int
    """Peak activation bytes on the device under the policy."""
    host: int
    """Bytes moved to host memory (offload)."""


def activation_memory(spec: ModelSpec, config: TrainConfig) -> ActivationMemory:
    """Activation bytes under the checkpoint policy.

    With A one block's activations and c one block's input (s b h elements):
      none          L A
      full          L c + A             (the block being recomputed)
      every-K       ceil(L/K) c + K A   (a whole segment being recomputed)
      selective     L (A - A_s2) + A_s2 (only one layer's s x s tensors at a time)
      op-selective  L A                 (the formula cannot split matmul outputs
                                         from elementwise ones; the ledger will)
      offload       A on the device, L A on the host
    """
    recipe = get_precision(config.precision)
    layer = layer_activations(
        config.seq_len, config.micro_batch, spec.hidden, spec.n_heads,
        element_bytes=recipe.activation_bytes, dropout=config.dropout > 0, flash=config.attention == "flash",
    )
    n_layers, policy, kept = spec.n_layers, config.recompute, layer.total
    block_input = config.tokens * spec.hidden * recipe.activation_bytes
    host = 0
    if policy.recomputes_blocks:
        device = policy.segments(n_layers) * block_input + policy.segment_layers(n_layers) * kept
    elif policy.kind == "selective":
        device = n_layers * layer.linear + layer.quadratic
    elif policy.kind == "offload":
        device, host = kept, n_layers * kept
    else:
        device = n_layers * kept
    return ActivationMemory(per_layer=layer, device=device, host=host)


def logits_memory(spec: ModelSpec, config: TrainConfig) -> int:
    """Logits and the loss around them: the peak at the end of forward.

    b s V elements: the logits in the compute dtype (16-bit recipes; under fp32
    they are the next tensor), the fp32 log-softmax the loss keeps, and its fp32
    gradient that backward creates before the logits' own graph is freed.
    """
    recipe = get_precision(config.precision)
    elements = config.tokens * spec.vocab_size
    logits = elements * recipe.activation_bytes if recipe.activation_bytes != 4 else 0
    return logits + 2 * elements * 4
