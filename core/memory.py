"""Static memory of a training step on one rank, and the published activation formula.

All figures are bytes (ints) on one data-parallel rank. Activations of the
model the agent trains come from the per-tensor ledger (core/ledger.py); the
formula of Korthikanti et al. is kept here as the published reference the
ledger is compared with.
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

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.master_weights + self.optimizer_states


def static_bytes_per_parameter(precision: str, optimizer: str) -> int:
    """Unsharded param + grad + master + optimizer bytes per parameter (no weight copies)."""
    recipe = get_precision(precision)
    return recipe.param_bytes + recipe.grad_bytes + recipe.master_bytes + optimizer_state_bytes(optimizer)


def static_memory(spec: ModelSpec, config: TrainConfig) -> StaticMemory:
    """Parameters, gradients, master copy and optimizer state of a model, per rank."""
    return static_memory_of(spec.parameters, config)


def static_memory_of(parameters: int, config: TrainConfig) -> StaticMemory:
    """Static bytes per rank for a parameter count, sharded by ZeRO stage.

    Stage 1 shards optimizer state and the master copy over the data-parallel
    ranks, stage 2 also gradients, stage 3 (FSDP) also parameters (Rajbhandari
    et al., "ZeRO", 2020, Fig. 1).
    """
    recipe = get_precision(config.precision)
    n, ranks, stage = parameters, config.dp, config.zero
    return StaticMemory(
        parameters=_shard(n * recipe.param_bytes, ranks, stage >= 3),
        gradients=_shard(n * recipe.grad_bytes, ranks, stage >= 2),
        master_weights=_shard(n * recipe.master_bytes, ranks, stage >= 1),
        optimizer_states=_shard(n * optimizer_state_bytes(config.optimizer), ranks, stage >= 1),
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


def korthikanti_layer_activations(
    seq_len: int, micro_batch: int, hidden: int, heads: int, *,
    element_bytes: int = 2, dropout: bool = True, flash: bool = False,
) -> LayerActivations:
    """Published per-layer activations: Korthikanti et al., "Reducing Activation
    Recomputation in Large Transformer Models" (2022), Sec. 4.1, tensor by tensor.

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
