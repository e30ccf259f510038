"""Build the agent's decoder for a configuration and probe what it saves (shared by tests)."""

from __future__ import annotations

import torch

from agent.bench_train import TrainSetup, build_model, forward_loss
from agent.model import Decoder
from agent.probe import ProbeResult, probe
from core.config import TrainConfig
from core.model import ModelSpec

run_forward = forward_loss


def build(spec: ModelSpec, config: TrainConfig, device: str = "cpu", seed: int = 0) -> tuple[Decoder, torch.Tensor, torch.Tensor]:
    """The agent's decoder as it trains this configuration, with token ids and (different) targets."""
    torch.manual_seed(seed)
    model = build_model(TrainSetup(spec=spec, config=config), torch.device(device))
    shape = (config.micro_batch, config.seq_len)
    with torch.device(device):
        tokens = torch.randint(0, spec.vocab_size, shape)
        targets = torch.randint(0, spec.vocab_size, shape)
    return model, tokens, targets


def probe_config(spec: ModelSpec, config: TrainConfig, device: str = "cpu") -> ProbeResult:
    model, tokens, targets = build(spec, config, device)
    return probe(model, lambda: forward_loss(model, tokens, targets, config.precision))
