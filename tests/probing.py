"""Build the agent's decoder for a configuration and probe what it saves (shared by tests)."""

from __future__ import annotations

import torch

from agent.model import Decoder
from agent.probe import ProbeResult, probe
from core.config import TrainConfig
from core.model import ModelSpec


def build(spec: ModelSpec, config: TrainConfig, device: str = "cpu", seed: int = 0) -> tuple[Decoder, torch.Tensor, torch.Tensor]:
    """The decoder in the recipe's parameter dtype, with token ids and (different) targets."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = Decoder(spec, attention=config.attention, dropout=config.dropout, recompute=config.recompute)
        if config.precision in ("bf16-pure", "bf16-master"):
            model = model.to(torch.bfloat16)
        shape = (config.micro_batch, config.seq_len)
        tokens = torch.randint(0, spec.vocab_size, shape)
        targets = torch.randint(0, spec.vocab_size, shape)
    return model.train(), tokens, targets


def run_forward(model: Decoder, tokens: torch.Tensor, targets: torch.Tensor, precision: str) -> torch.Tensor:
    if precision == "amp-bf16":
        with torch.autocast(tokens.device.type, dtype=torch.bfloat16):
            return model(tokens, targets)
    return model(tokens, targets)


def probe_config(spec: ModelSpec, config: TrainConfig, device: str = "cpu") -> ProbeResult:
    model, tokens, targets = build(spec, config, device)
    return probe(model, lambda: run_forward(model, tokens, targets, config.precision))
