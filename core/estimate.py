"""One configuration in, a breakdown of memory and FLOPs out.

``estimate(spec, config).to_dict()`` is the JSON contract of
``headroom estimate --json`` (documented in README.md): top-level keys
``model``, ``config``, ``memory_bytes``, ``flops`` and ``notes``. Bytes and
FLOPs are integers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from core.config import TrainConfig
from core.flops import StepFlops, step_flops
from core.memory import ActivationMemory, StaticMemory, activation_memory, logits_memory, static_memory
from core.model import ModelSpec

ACTIVATION_NOTE = (
    "activations: Korthikanti et al. (2022) per-layer formula sbh(34 + 5as/h), generalised to the "
    "element size, dropout and flash attention; exact for a GPT block, approximate for llama blocks"
)
PEAK_NOTE = (
    "peak = static state + activations + logits: an upper bound that assumes gradients stay "
    "allocated across the step, as they do under gradient accumulation"
)


@dataclass(frozen=True, slots=True)
class Estimate:
    spec: ModelSpec
    config: TrainConfig
    static: StaticMemory
    activations: ActivationMemory
    logits_bytes: int
    flops: StepFlops

    @property
    def peak_bytes(self) -> int:
        return self.static.total + self.activations.device + self.logits_bytes

    def to_dict(self) -> dict[str, Any]:
        model = asdict(self.spec) | {"parameters": self.spec.parameters}
        config = {
            "seq_len": self.config.seq_len,
            "micro_batch": self.config.micro_batch,
            "tokens": self.config.tokens,
            "recompute": str(self.config.recompute),
            "attention": self.config.attention,
            "dropout": self.config.dropout,
            "precision": self.config.precision,
            "optimizer": self.config.optimizer,
            "dp": self.config.dp,
            "zero": self.config.zero,
        }
        memory = {
            "parameters": self.static.parameters,
            "gradients": self.static.gradients,
            "master_weights": self.static.master_weights,
            "optimizer_states": self.static.optimizer_states,
            "weight_copies": self.static.weight_copies,
            "activations": self.activations.device,
            "activations_per_layer": self.activations.per_layer.total,
            "activations_host": self.activations.host,
            "logits": self.logits_bytes,
            "peak": self.peak_bytes,
        }
        flops = {
            "forward": self.flops.forward,
            "backward": self.flops.backward,
            "recompute": self.flops.recompute,
            "step": self.flops.hardware,
            "model": self.flops.model,
            "per_token": self.flops.model // self.flops.tokens,
            "forward_by_component": {
                **{name: self.spec.n_layers * f for name, f in self.flops.layer_forward.items()},
                "logits": self.flops.logits_forward,
            },
        }
        return {
            "model": model,
            "config": config,
            "memory_bytes": memory,
            "flops": flops,
            "notes": [ACTIVATION_NOTE, PEAK_NOTE],
        }


def estimate(spec: ModelSpec, config: TrainConfig) -> Estimate:
    config.check_model(spec)
    return Estimate(
        spec=spec,
        config=config,
        static=static_memory(spec, config),
        activations=activation_memory(spec, config),
        logits_bytes=logits_memory(spec, config),
        flops=step_flops(spec, config.micro_batch, config.seq_len, config.recompute),
    )
