"""Checkpoint policies on the real decoder: same numbers, the FLOPs the core predicts."""

import dataclasses

import pytest

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from headroom.core.memory.flops import step_flops  # noqa: E402
from headroom.core.specs.config import TrainConfig  # noqa: E402
from headroom.core.specs.presets import get_preset  # noqa: E402
from headroom.core.specs.recompute import parse_policy  # noqa: E402
from tests.probing import assert_same_training, build  # noqa: E402

POLICIES = ("full", "every-2", "block-2", "selective", "op-selective", "offload")
SPECS = {
    "gpt": dataclasses.replace(get_preset("bench-gpt-tiny"), n_layers=3),
    "llama": dataclasses.replace(get_preset("bench-llama-tiny"), n_layers=3),
    # Gemma 2 and 3: the post-MLP norm keeps the down projection's output, so recompute runs it again.
    "post-norms": dataclasses.replace(get_preset("bench-llama-tiny"), n_layers=3, post_norms=True),
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("block", "attention", "dropout"), [
    ("gpt", "standard", 0.1), ("gpt", "flash", 0.1), ("gpt", "flash", 0.0), ("llama", "standard", 0.0), ("llama", "flash", 0.0),
])
def test_every_policy_gives_the_loss_and_gradients_of_none(policy, block, attention, dropout):
    """fp32 on CPU; recompute replays the same kernels with the same RNG state (tests.probing)."""
    spec = SPECS[block]
    base = TrainConfig(seq_len=24, micro_batch=2, attention=attention, dropout=dropout)
    assert_same_training(spec, base, dataclasses.replace(base, recompute=parse_policy(policy)))


@pytest.mark.parametrize("policy", ["none", "full", "every-2", "block-2", "selective", "op-selective"])
@pytest.mark.parametrize(("block", "attention", "dropout", "device"), [
    ("gpt", "standard", 0.0, "cpu"), ("gpt", "standard", 0.1, "cpu"), ("llama", "standard", 0.0, "cpu"),
    ("post-norms", "standard", 0.0, "cpu"),
    # FlopCounterMode does not count CPU's fused SDPA kernel; meta runs SDPA's math path.
    ("gpt", "flash", 0.1, "meta"), ("llama", "flash", 0.0, "meta"),
])
def test_flops_with_recompute_equal_flop_counter(policy, block, attention, dropout, device):
    """Forward + backward + what the policy recomputes, as FlopCounterMode counts it."""
    spec = SPECS[block]
    config = TrainConfig(seq_len=24, micro_batch=2, attention=attention, dropout=dropout, recompute=parse_policy(policy))
    model, tokens, targets = build(spec, config, device)
    with FlopCounterMode(display=False) as counter:
        model(tokens, targets).backward()
    predicted = step_flops(spec, config, device)
    assert counter.get_total_flops() == predicted.hardware


def test_gradient_accumulation_of_four_micro_batches_equals_one_batch_of_eight():
    spec = SPECS["llama"]
    config = TrainConfig(seq_len=16, micro_batch=8)
    model, tokens, targets = build(spec, config)
    model(tokens, targets).backward()
    full = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    steps = 4
    for chunk_tokens, chunk_targets in zip(tokens.chunk(steps), targets.chunk(steps)):
        (model(chunk_tokens, chunk_targets) / steps).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, full[name], rtol=1e-5, atol=1e-6, msg=name)
