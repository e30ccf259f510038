"""The activation ledger against what autograd really saves (agent/probe.py)."""

import dataclasses
import itertools

import pytest

torch = pytest.importorskip("torch")

from headroom.core.memory.ledger import activation_ledger  # noqa: E402
from headroom.core.memory.static import korthikanti_layer_activations  # noqa: E402
from headroom.core.specs.config import TrainConfig  # noqa: E402
from headroom.core.specs.presets import get_preset  # noqa: E402
from headroom.core.specs.recompute import parse_policy  # noqa: E402
from tests.probing import probe_config  # noqa: E402

POLICIES = ("none", "full", "every-2", "block-2", "selective", "op-selective", "offload")
PRECISIONS = ("fp32", "amp-bf16", "bf16-pure")
MATRIX = [
    (block, attention, dropout, policy, precision)
    for block, attention, dropout, policy, precision in itertools.product(
        ("gpt", "llama"), ("standard", "flash"), (0.0, 0.1), POLICIES, PRECISIONS
    )
    if not (block == "llama" and dropout)
]
TOLERANCE = 0.02


def _config(seq_len, micro_batch, attention, dropout, policy, precision):
    return TrainConfig(seq_len=seq_len, micro_batch=micro_batch, attention=attention, dropout=dropout,
                       recompute=parse_policy(policy), precision=precision)


@pytest.mark.parametrize(
    ("block", "attention", "dropout", "policy", "precision"), MATRIX, ids=["-".join(map(str, m)) for m in MATRIX]
)
def test_ledger_matches_probe_on_cpu(block, attention, dropout, policy, precision):
    # Four layers so that every-2 makes two segments and block-2 keeps two blocks whole; GQA on the llama preset.
    spec = dataclasses.replace(get_preset(f"bench-{block}-tiny"), n_layers=4)
    config = _config(32, 2, attention, dropout, policy, precision)
    measured = probe_config(spec, config, "cpu")
    ledger = activation_ledger(spec, config, "cpu")
    assert ledger.saved_bytes == pytest.approx(measured.activation_bytes, rel=TOLERANCE)
    assert ledger.parameter_copy_bytes == measured.parameter_copy_bytes


@pytest.mark.parametrize("attention", ["standard", "flash"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_ledger_matches_probe_for_wide_heads_qk_norms_and_post_norms(attention, policy, precision):
    """Gemma 3's block on the CPU: heads wider than hidden / n_heads, q and k normalised per head, and norms
    after attention and the MLP."""
    spec = dataclasses.replace(get_preset("bench-llama-tiny"), n_layers=4, head_size=24, qk_norm=True,
                               post_norms=True)
    assert spec.q_dim == 96 > spec.hidden
    config = _config(32, 2, attention, 0.0, policy, precision)
    measured = probe_config(spec, config, "cpu")
    ledger = activation_ledger(spec, config, "cpu")
    assert ledger.saved_bytes == pytest.approx(measured.activation_bytes, rel=TOLERANCE)
    assert ledger.parameter_copy_bytes == measured.parameter_copy_bytes


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_ledger_matches_probe_for_partial_rotary_and_a_parallel_residual(dropout, policy, precision):
    """GPT-NeoX's block on the CPU: rotary on a quarter of each head, and attention and MLP side by side on
    the block's input."""
    spec = dataclasses.replace(get_preset("bench-gpt-tiny"), n_layers=4, positions="rotary", rotary_fraction=0.25,
                               parallel_residual=True)
    config = _config(32, 2, "standard", dropout, policy, precision)
    measured = probe_config(spec, config, "cpu")
    ledger = activation_ledger(spec, config, "cpu")
    assert ledger.saved_bytes == pytest.approx(measured.activation_bytes, rel=TOLERANCE)
    assert ledger.parameter_copy_bytes == measured.parameter_copy_bytes


@pytest.mark.parametrize(("name", "seq_len"), [("llama2-7b", 4096), ("gpt3-175b", 2048)])
@pytest.mark.parametrize("precision", ["fp32", "bf16-pure"])
@pytest.mark.parametrize("policy", ["none", "full", "selective", "op-selective"])
def test_ledger_matches_probe_for_one_large_layer_on_meta(name, seq_len, precision, policy):
    """Autocast has no meta backend, so amp-bf16 is checked on the CPU only."""
    spec = dataclasses.replace(get_preset(name), n_layers=1)
    dropout = 0.1 if spec.block == "gpt" else 0.0
    config = _config(seq_len, 1, "standard", dropout, policy, precision)
    measured = probe_config(spec, config, "meta")
    assert activation_ledger(spec, config, "meta").saved_bytes == pytest.approx(measured.activation_bytes, rel=TOLERANCE)


def test_gpt_layer_equals_published_formula_plus_norm_statistics():
    """One GPT layer, standard attention, bf16-pure, dropout, 1-byte masks (CUDA's native_dropout).

    The ledger keeps exactly the 34sbh + 5as^2b of Korthikanti et al. and two
    things the formula leaves out: each LayerNorm's fp32 mean and rstd
    (4 x sb x 4 bytes) and the causal mask of the explicit attention
    (s^2 bools, shared by the batch and heads). For GPT-3 175B at s=2048 that
    is 4.2 MB on a 2.87 GB layer: 0.15%.
    """
    spec = get_preset("gpt3-175b")
    s, b, h, a = 2048, 1, spec.hidden, spec.n_heads
    config = _config(s, b, "standard", 0.1, "none", "bf16-pure")
    ledger_layer = activation_ledger(spec, config, "cuda").per_layer_bytes
    formula = korthikanti_layer_activations(s, b, h, a, element_bytes=2, dropout=True).total
    assert formula == s * b * h * (34 + 5 * a * s // h)
    extra = ledger_layer - formula
    assert extra == 4 * s * b * 4 + s * s
    assert extra / formula == pytest.approx(0.00147, abs=0.00001)


def test_cpu_dropout_masks_cost_the_input_dtype():
    """On CPU the two residual dropout masks and the attention mask are bf16, not 1 byte."""
    spec = get_preset("gpt3-175b")
    s, b, h, a = 2048, 1, spec.hidden, spec.n_heads
    config = _config(s, b, "standard", 0.1, "none", "bf16-pure")
    cpu, cuda = (activation_ledger(spec, config, d).per_layer_bytes for d in ("cpu", "cuda"))
    stats_bf16 = 4 * s * b * 2  # CPU also keeps LayerNorm statistics in bf16
    assert cpu - cuda == 2 * s * b * h + a * s * s * b - stats_bf16


def test_checkpointing_orders_memory_and_keeps_segment_inputs():
    spec = get_preset("llama2-7b")
    kept = {
        policy: activation_ledger(spec, _config(4096, 1, "flash", 0.0, policy, "bf16-pure"), "cuda")
        for policy in ("none", "op-selective", "every-4", "full")
    }
    assert kept["none"].device_activation_bytes > kept["op-selective"].device_activation_bytes
    assert kept["op-selective"].device_activation_bytes > kept["full"].device_activation_bytes
    block_input = 4096 * 4096 * 2
    assert [kept["full"].layer_bytes(i) for i in range(3)] == [block_input] * 3
    assert [kept["every-4"].layer_bytes(i) for i in (0, 1, 4)] == [block_input, 0, block_input]
    # every-4 recomputes four blocks at once: a larger transient than full's one block.
    assert kept["every-4"].transient_bytes > kept["full"].transient_bytes


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize(("policy", "repeated"), [("none", 9), ("every-2", 3), ("every-3", 1), ("full", 9)])
def test_a_run_of_repeated_segments_is_one_repeat_and_written_out_is_what_autograd_saves(policy, repeated,
                                                                                          precision):
    """Eleven blocks: the first two segments are traced, the later whole ones replayed from the second as one
    run (none and full: blocks 2-10; every-2: segments at 4, 6 and 8; every-3: the one at 6), a short last one
    traced. A checkpointed segment keeps its input only, without tracing its blocks. Written out layer by
    layer, the ledger is what autograd saves on a CPU, byte for byte."""
    spec = dataclasses.replace(get_preset("bench-llama-small"), n_layers=11)
    config = _config(32, 2, "flash", 0.0, policy, precision)
    ledger = activation_ledger(spec, config, "cpu")
    assert [(r.template, r.count) for r in ledger.repeats] == [(config.recompute.segment_layers(11) or 1, repeated)]
    tensors = ledger.tensors
    assert sum(t.bytes for t in tensors if t.kind != "parameter_copy") == ledger.saved_bytes
    assert [ledger.layer_bytes(layer) for layer in range(11)] == [
        sum(t.bytes for t in tensors if t.layer == layer and t.kind != "parameter_copy") for layer in range(11)]
    measured = probe_config(spec, config)
    assert (ledger.saved_bytes, ledger.parameter_copy_bytes) == (measured.activation_bytes,
                                                                 measured.parameter_copy_bytes)


def test_offload_moves_block_tensors_to_the_host_on_cuda_only():
    """Every block tensor leaves the device; on the host each save is its own copy.

    Under amp-bf16 one storage per block is saved twice: the fused attention
    output, by SDPA and by the output projection (its input is a view of it).
    save_on_cpu copies it twice, so the host holds one (b, s, h) bf16 tensor
    per block more than the device did (measured on an H200 by
    benchmarks/gpu_check.py).
    """
    spec = get_preset("bench-llama-small")
    b, s = 2, 128
    config = _config(s, b, "flash", 0.0, "offload", "amp-bf16")
    cuda, cpu = activation_ledger(spec, config, "cuda"), activation_ledger(spec, config, "cpu")
    plain = activation_ledger(spec, dataclasses.replace(config, recompute=parse_policy("none")), "cuda")
    assert cpu.host_bytes == 0
    moved = plain.device_activation_bytes - cuda.device_activation_bytes
    assert cuda.total("activation", "host") == moved + spec.n_layers * b * s * spec.hidden * 2


@pytest.mark.parametrize(("precision", "per_norm"), [("bf16-pure", 6), ("amp-bf16", 4)])
def test_cuda_rms_norm_keeps_input_and_rstd_not_the_normalised_tensor(precision, per_norm):
    """torch's derivatives.yaml: ``_fused_rms_norm`` (what RMSNorm runs on CUDA) saves input, rstd, weight.

    The CPU's composite keeps the fp32 input copy, the rsqrt and the fp32
    normalised tensor instead. Per norm that is 4sbh (fp32 copy) + 4sbh
    (normalised) - 2sbh (the bf16 input the fused op keeps) = 6sbh bytes
    under bf16-pure; under amp-bf16 the residual stream is already fp32, so
    the copy is the input itself and the difference is the 4sbh normalised
    tensor. Two norms per block; the only other difference for a llama block
    with flash attention and no dropout is the 16 bytes of seed and offset the
    fused CUDA kernel keeps.
    """
    spec = get_preset("llama3.2-1b")
    s, b, h = 2048, 1, spec.hidden
    config = _config(s, b, "flash", 0.0, "none", precision)
    cpu, cuda = (activation_ledger(spec, config, d).per_layer_bytes for d in ("cpu", "cuda"))
    assert cpu - cuda == 2 * per_norm * s * b * h - 16
