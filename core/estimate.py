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
from core.errors import ConfigError
from core.flops import StepFlops, step_flops
from core.ledger import Ledger, activation_ledger
from core.memory import StaticMemory, static_memory
from core.model import ModelSpec

PEAK_NOTE = (
    "peak = the larger of forward's last moment (static state + every autocast weight copy + activations "
    "+ log-probs + the logits the loss reads) and backward's first (static state + weight copies kept + "
    "activations + log-probs + their two fp32 gradients) or a recomputed segment; without gradient "
    "accumulation the gradients do not exist yet at those moments"
)


@dataclass(frozen=True, slots=True)
class Estimate:
    spec: ModelSpec
    config: TrainConfig
    device: str
    static: StaticMemory
    ledger: Ledger
    flops: StepFlops
    accumulation_steps: int = 1
    """Micro-batches per optimizer step: with more than one, the gradients exist (from the previous
    micro-batch) while the next forward and the start of its backward run; with one, gradients are
    freed after each step (``zero_grad(set_to_none=True)``) and appear only as backward produces them."""

    @property
    def logits_bytes(self) -> int:
        """The loss's fp32 log-probabilities over the vocabulary, kept for backward."""
        return sum(t.bytes for t in self.ledger.tensors if t.name == "log_softmax")

    @property
    def activation_bytes(self) -> int:
        """Everything else forward keeps on the device for backward."""
        return self.ledger.device_activation_bytes - self.logits_bytes

    @property
    def autocast_cache_bytes(self) -> int:
        """Under amp-bf16, autocast's 16-bit copy of every matmul weight, alive until the forward ends
        (the ones backward needs are kept beyond it: ``ledger.parameter_copy_bytes``)."""
        return 2 * self.spec.matmul_weight_parameters() if self.config.precision == "amp-bf16" else 0

    @property
    def _static_at_loss(self) -> int:
        """Static state at the loss: without accumulation the gradients do not exist yet."""
        return self.static.total - (self.static.gradients if self.accumulation_steps == 1 else 0)

    @property
    def forward_peak_bytes(self) -> int:
        """The forward's last moment: the loss reads fp32 logits while every weight copy is cached."""
        copies = max(self.autocast_cache_bytes, self.ledger.parameter_copy_bytes)
        return (self._static_at_loss + copies + self.activation_bytes + self.logits_bytes
                + self.ledger.forward_transient_bytes)

    @property
    def backward_peak_bytes(self) -> int:
        """The loss's backward (its two vocabulary-sized gradients), or a recomputed segment later on."""
        kept = self.ledger.parameter_copy_bytes + self.activation_bytes + self.logits_bytes
        return max(self._static_at_loss + kept + self.ledger.loss_gradient_bytes,
                   self.static.total + kept + self.ledger.recompute_bytes)

    @property
    def peak_bytes(self) -> int:
        """Peak allocated bytes of the step (checked against torch.cuda.max_memory_allocated on an H200)."""
        return max(self.forward_peak_bytes, self.backward_peak_bytes)

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
            "accumulation_steps": self.accumulation_steps,
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
            "autocast_cache": self.autocast_cache_bytes,
            "forward_transient": self.ledger.forward_transient_bytes,
            "forward_peak": self.forward_peak_bytes,
            "backward_peak": self.backward_peak_bytes,
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


def estimate(spec: ModelSpec, config: TrainConfig, device: str = "cuda", accumulation_steps: int = 1) -> Estimate:
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps <= 0:
        raise ConfigError(f"accumulation steps must be a positive integer, got {accumulation_steps!r}")
    return Estimate(
        spec=spec,
        config=config,
        device=device,
        static=static_memory(spec, config),
        ledger=activation_ledger(spec, config, device),
        flops=step_flops(spec, config, device),
        accumulation_steps=accumulation_steps,
    )
