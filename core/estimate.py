"""One configuration in, a breakdown of memory and FLOPs out.

``estimate(spec, config, device).to_dict()`` is the JSON contract of
``headroom estimate --json`` (documented in README.md): top-level keys
``model``, ``config``, ``memory_bytes``, ``flops`` and ``notes``. Bytes and
FLOPs are integers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from core.config import TrainConfig
from core.flops import StepFlops, step_flops
from core.ledger import Ledger, activation_ledger
from core.memory import StaticMemory, static_memory
from core.model import ModelSpec

PEAK_NOTE = (
    "peak = static state + weight copies + activations + logits + backward transient: gradients "
    "are counted as allocated throughout, as they are under gradient accumulation"
)


@dataclass(frozen=True, slots=True)
class Estimate:
    spec: ModelSpec
    config: TrainConfig
    device: str
    static: StaticMemory
    ledger: Ledger
    flops: StepFlops

    @property
    def logits_bytes(self) -> int:
        """The loss's fp32 log-probabilities over the vocabulary, kept for backward."""
        return sum(t.bytes for t in self.ledger.tensors if t.name == "log_softmax")

    @property
    def activation_bytes(self) -> int:
        """Everything else forward keeps on the device for backward."""
        return self.ledger.device_activation_bytes - self.logits_bytes

    @property
    def peak_bytes(self) -> int:
        return (
            self.static.total + self.ledger.parameter_copy_bytes + self.activation_bytes
            + self.logits_bytes + self.ledger.transient_bytes
        )

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
            "device": self.device,
        }
        memory = {
            "parameters": self.static.parameters,
            "gradients": self.static.gradients,
            "master_weights": self.static.master_weights,
            "optimizer_states": self.static.optimizer_states,
            "weight_copies": self.ledger.parameter_copy_bytes,
            "activations": self.activation_bytes,
            "activations_per_layer": self.ledger.per_layer_bytes,
            "activations_host": self.ledger.host_bytes,
            "logits": self.logits_bytes,
            "backward_transient": self.ledger.transient_bytes,
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
        notes = [
            f"activations: per-tensor ledger of the agent's decoder on {self.device} "
            "(checked against autograd's saved tensors on cpu and meta)",
            PEAK_NOTE,
        ]
        return {"model": model, "config": config, "memory_bytes": memory, "flops": flops, "notes": notes}


def estimate(spec: ModelSpec, config: TrainConfig, device: str = "cuda") -> Estimate:
    return Estimate(
        spec=spec,
        config=config,
        device=device,
        static=static_memory(spec, config),
        ledger=activation_ledger(spec, config, device),
        flops=step_flops(spec, config, device),
    )
