"""One configuration in, a breakdown of memory and FLOPs out.

``estimate(spec, config, device).to_dict()`` is the JSON contract of
``headroom estimate --json`` (documented in README.md): top-level keys
``model``, ``config``, ``memory_bytes``, ``peak`` (when the peak happens and
its components, which add up to it), ``flops`` and ``notes``. Bytes and FLOPs
are integers.
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
        (the ones backward needs are kept beyond it: ``ledger.parameter_copy_bytes``); measured on an
        H200. Under ZeRO-3 the weights are gathered a unit at a time, so the cache is counted sharded
        like the parameters themselves (not measured: the agent has no sharded trainer yet)."""
        if self.config.precision != "amp-bf16":
            return 0
        return 2 * self.spec.matmul_weight_parameters() // (self.config.dp if self.config.zero == 3 else 1)

    @property
    def _static_at_loss(self) -> int:
        """Static state at the loss: without accumulation the gradients do not exist yet."""
        return self.static.total - (self.static.gradients if self.accumulation_steps == 1 else 0)

    def _moment(self, gradients: int, copies: int, transient: tuple[str, int]) -> dict[str, int]:
        static = self.static
        return {
            "parameters": static.parameters, "gradients": gradients, "master_weights": static.master_weights,
            "optimizer_states": static.optimizer_states, "weight_copies": copies,
            "activations": self.activation_bytes, "logits": self.logits_bytes, transient[0]: transient[1],
        }

    @property
    def _moments(self) -> dict[str, dict[str, int]]:
        """What is allocated at each candidate for the peak, by component.

        ``forward``: the loss reads fp32 logits while autocast still caches every weight copy.
        ``loss backward``: the log-probs' and the logits' fp32 gradients. ``recompute`` (when a
        checkpointed segment or offloaded block is brought back): the log-probs gone, every
        gradient and every kept activation counted, an upper bound. Without gradient accumulation
        no gradient exists at the first two moments. Both measured moments agree with an H200 to
        0.3% (tests/test_reference_data.py); the recompute bound never formed a measured peak.
        """
        gradients = self.static.gradients if self.accumulation_steps > 1 else 0
        kept = self.ledger.parameter_copy_bytes
        ledger = self.ledger
        moments = {
            "forward": self._moment(gradients, max(self.autocast_cache_bytes, kept),
                                    ("forward_transient", ledger.forward_transient_bytes)),
            "loss backward": self._moment(gradients, kept, ("backward_transient", ledger.loss_gradient_bytes)),
        }
        if ledger.recompute_bytes:
            moments["recompute"] = self._moment(self.static.gradients, kept,
                                                ("backward_transient", ledger.recompute_bytes))
        return moments

    @property
    def forward_peak_bytes(self) -> int:
        return sum(self._moments["forward"].values())

    @property
    def backward_peak_bytes(self) -> int:
        return max(sum(parts.values()) for moment, parts in self._moments.items() if moment != "forward")

    @property
    def peak_moment(self) -> str:
        """When the peak happens: ``forward``, ``loss backward`` or ``recompute``."""
        moments = self._moments
        return max(moments, key=lambda name: sum(moments[name].values()))

    @property
    def peak_components(self) -> dict[str, int]:
        """The peak by component: they add up to ``peak_bytes``."""
        return self._moments[self.peak_moment]

    @property
    def peak_bytes(self) -> int:
        """Peak allocated bytes of the step (torch.cuda.max_memory_allocated: checked on an H200)."""
        return sum(self.peak_components.values())

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
        peak = {"moment": self.peak_moment, "components": self.peak_components}
        return {"model": model, "config": config, "memory_bytes": memory, "peak": peak, "flops": flops, "notes": notes}


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
