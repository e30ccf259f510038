"""Static and activation memory against worked examples of Korthikanti et al. (2022) and the ZeRO paper."""

import pytest

from headroom.core.memory.static import (
    korthikanti_layer_activations,
    static_bytes_per_parameter,
    static_memory_of,
)
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.layout import Layout
from headroom.core.units import GB


@pytest.mark.parametrize(("seq_len", "published_gb"), [(512, 3.6), (2048, 30.6), (4096, 104.2), (8192, 380.1)])
def test_llama7b_shape_with_gpt_formula_matches_worked_example(seq_len, published_gb):
    """Korthikanti et al. (2022)'s per-layer 34 sbh + 5 a s^2 b worked for L=32, h=4096, a=32, b=1,
    16-bit, dropout, standard attention.

    The figures are published to one decimal: each must round to it exactly, and be
    within 0.5% of it (3.6 is the exception: 3.624 GB rounds to 3.6, 0.7% away).
    """
    per_layer = korthikanti_layer_activations(seq_len, 1, 4096, 32, element_bytes=2, dropout=True, flash=False)
    total_gb = 32 * per_layer.total / GB
    assert round(total_gb, 1) == published_gb
    assert total_gb == pytest.approx(published_gb, rel=max(0.005, 0.05 / published_gb))


def test_formula_terms_are_34sbh_and_5as2b():
    s, b, h, a = 1024, 2, 512, 8
    layer = korthikanti_layer_activations(s, b, h, a)
    assert layer.linear == 34 * s * b * h
    assert layer.quadratic == 5 * a * s * s * b
    assert korthikanti_layer_activations(s, b, h, a, flash=True).total == 34 * s * b * h


@pytest.mark.parametrize(
    ("precision", "optimizer", "expected"),
    [("fp32", "adam", 16), ("bf16-pure", "adam", 12), ("bf16-master", "adamw", 16), ("amp-bf16", "adamw", 16),
     ("bf16-pure", "sgd", 4), ("fp32", "sgd-momentum", 12), ("fp32", "adagrad", 12)],
)
def test_bytes_per_parameter(precision, optimizer, expected):
    assert static_bytes_per_parameter(precision, optimizer) == expected


def test_7b_with_master_copy_is_112_gb_static():
    config = TrainConfig(seq_len=1, precision="bf16-master", optimizer="adam")
    assert static_memory_of(7 * 10**9, config).total == 112 * GB


@pytest.mark.parametrize(("stage", "published_gb"), [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_stages_match_the_zero_paper(stage, published_gb):
    """Rajbhandari et al. 2020, Fig. 1: 7.5B params, 64 ranks, 2 + 2 + 12 bytes/param."""
    config = TrainConfig(seq_len=1, precision="bf16-master", optimizer="adam", layout=Layout(dp=64, zero=stage))
    assert static_memory_of(7_500_000_000, config).total / GB == pytest.approx(published_gb, abs=0.05)
