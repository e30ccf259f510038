"""Build the agent's decoder for a configuration, probe what it saves, compare two trainings (shared by tests)."""

import torch

from headroom.agent.bench_train import forward_loss
from headroom.agent.ledger_check import build, probe_config

run_forward = forward_loss
__all__ = ["assert_decoder_is_the_spec", "assert_same_training", "build", "probe_config", "run_forward"]


def assert_decoder_is_the_spec(spec):
    """The agent's decoder holds exactly the spec's parameters: its shapes in order, and its count. Returns it."""
    from headroom.agent.model import Decoder

    model = Decoder(spec)
    assert tuple(tuple(p.shape) for p in model.parameters()) == spec.parameter_shapes()
    assert sum(p.numel() for p in model.parameters()) == spec.parameters
    return model


def _loss_and_grads(spec, config):
    model, tokens, targets = build(spec, config)
    torch.manual_seed(1234)  # the same dropout masks for every configuration
    loss = run_forward(model, tokens, targets, config.precision)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_same_training(spec, base, other) -> None:
    """A step of ``other`` gives the loss and gradients of ``base`` (fp32 on the CPU: a checkpoint replays the
    same kernels with the same RNG state). Tolerance: 1e-6 relative on the loss, 1e-5 absolute and relative on
    each gradient element, room for another reduction order and nothing more."""
    loss_base, grads_base = _loss_and_grads(spec, base)
    loss, grads = _loss_and_grads(spec, other)
    torch.testing.assert_close(loss, loss_base, rtol=1e-6, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, grads_base[name], rtol=1e-5, atol=1e-5, msg=name)
