"""Static and activation memory against DESIGN.md's worked examples and the ZeRO paper."""

import pytest

from core.config import TrainConfig
from core.memory import activation_memory, layer_activations, logits_memory, static_bytes_per_parameter, static_memory, static_memory_of
from core.presets import get_preset
from core.recompute import parse_policy
from core.units import GB


@pytest.mark.parametrize(("seq_len", "published_gb"), [(512, 3.6), (2048, 30.6), (4096, 104.2), (8192, 380.1)])
def test_llama7b_shape_with_gpt_formula_matches_worked_example(seq_len, published_gb):
    """DESIGN.md: L=32, h=4096, a=32, b=1, 16-bit, dropout, standard attention.

    The figures are published to one decimal: each must round to it exactly, and be
    within 0.5% of it (3.6 is the exception: 3.624 GB rounds to 3.6, 0.7% away).
    """
    per_layer = layer_activations(seq_len, 1, 4096, 32, element_bytes=2, dropout=True, flash=False)
    total_gb = 32 * per_layer.total / GB
    assert round(total_gb, 1) == published_gb
    assert total_gb == pytest.approx(published_gb, rel=max(0.005, 0.05 / published_gb))


def test_formula_terms_are_34sbh_and_5as2b():
    s, b, h, a = 1024, 2, 512, 8
    layer = layer_activations(s, b, h, a)
    assert layer.linear == 34 * s * b * h
    assert layer.quadratic == 5 * a * s * s * b
    assert layer_activations(s, b, h, a, flash=True).total == 34 * s * b * h


@pytest.mark.parametrize(
    ("precision", "optimizer", "expected"),
    [("fp32", "adam", 16), ("bf16-pure", "adam", 12), ("bf16-master", "adamw", 16), ("amp-bf16", "adamw", 16),
     ("bf16-pure", "sgd", 4), ("fp32", "sgd-momentum", 12), ("fp32", "adagrad", 12)],
)
def test_bytes_per_parameter(precision, optimizer, expected):
    assert static_bytes_per_parameter(precision, optimizer) == expected


def test_7b_with_master_copy_is_112_gb_static():
    config = TrainConfig(seq_len=1, precision="bf16-master", optimizer="adam")
    assert static_memory_of(7 * 10**9, 0, config).total == 112 * GB


@pytest.mark.parametrize(("stage", "published_gb"), [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_stages_match_the_zero_paper(stage, published_gb):
    """Rajbhandari et al. 2020, Fig. 1: 7.5B params, 64 ranks, 2 + 2 + 12 bytes/param."""
    config = TrainConfig(seq_len=1, precision="bf16-master", optimizer="adam", dp=64, zero=stage)
    assert static_memory_of(7_500_000_000, 0, config).total / GB == pytest.approx(published_gb, abs=0.05)


def test_amp_keeps_bf16_copies_of_matmul_weights():
    spec = get_preset("llama2-7b")
    amp = static_memory(spec, TrainConfig(seq_len=1, precision="amp-bf16"))
    # Every weight but the norms and the token embedding enters a matmul (untied head included).
    norms = spec.n_layers * 2 * spec.hidden + spec.hidden
    assert amp.weight_copies == 2 * (spec.parameters - norms - spec.vocab_size * spec.hidden)
    assert static_memory(spec, TrainConfig(seq_len=1, precision="bf16-pure")).weight_copies == 0


def test_recompute_policies_order_activation_memory():
    spec = get_preset("llama2-7b")
    device = {
        name: activation_memory(spec, TrainConfig(seq_len=4096, attention="standard", recompute=parse_policy(name))).device
        for name in ("none", "selective", "every-4", "full", "offload")
    }
    assert device["none"] > device["selective"] > device["every-4"] > device["full"] > device["offload"]
    layer = layer_activations(4096, 1, 4096, 32, element_bytes=2, dropout=False)
    block_input = 4096 * 4096 * 2
    assert device["full"] == 32 * block_input + layer.total
    assert device["every-4"] == 8 * block_input + 4 * layer.total


def test_logits_memory_counts_fp32_logprobs_and_gradient():
    spec = get_preset("llama3-8b")
    elements = 2 * 4096 * spec.vocab_size
    assert logits_memory(spec, TrainConfig(seq_len=4096, micro_batch=2, precision="fp32")) == 8 * elements
    assert logits_memory(spec, TrainConfig(seq_len=4096, micro_batch=2)) == 10 * elements
