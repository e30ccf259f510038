"""Multi-head latent attention (DeepSeek-V2 and V3): the agent's LatentAttention against the core.

Three small variants: queries from a latent and straight from the residual stream, and DeepSeek-V3's block
(a leading dense block, sigmoid-scored experts and an ungated shared one). Value heads narrower than query
and key heads send the CPU's SDPA to its math path, which the ledger follows (headroom.core.specs.devices).
"""

import dataclasses
import itertools

import pytest

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from headroom.core.memory.flops import step_flops  # noqa: E402
from headroom.core.memory.ledger import activation_ledger  # noqa: E402
from headroom.core.specs.config import TrainConfig  # noqa: E402
from headroom.core.specs.presets import get_preset, resolve_model  # noqa: E402
from headroom.core.specs.recompute import parse_policy  # noqa: E402
from tests.conftest import FIXTURES  # noqa: E402
from tests.probing import assert_decoder_is_the_spec, build, probe_config  # noqa: E402

MLA = dataclasses.replace(get_preset("bench-llama-tiny"), n_layers=4, n_kv_heads=4, head_size=24, kv_lora_rank=20,
                          rope_head_size=8, v_head_size=12)
VARIANTS = {
    "q-latent": dataclasses.replace(MLA, q_lora_rank=16),
    "direct-q": MLA,
    "deepseek-v3-like": dataclasses.replace(MLA, q_lora_rank=16, n_experts=4, experts_per_token=2,
                                            expert_ffn_hidden=48, shared_expert_ffn_hidden=48, dense_layers=1,
                                            normalize_expert_weights=True, expert_scoring="sigmoid"),
}
POLICIES = ("none", "full", "every-2", "selective", "op-selective", "offload")


@pytest.mark.parametrize("name", VARIANTS)
def test_the_decoders_parameters_are_the_specs(name):
    assert_decoder_is_the_spec(VARIANTS[name])


@pytest.mark.parametrize(("name", "policy", "precision"),
                         list(itertools.product(VARIANTS, POLICIES, ("fp32", "amp-bf16", "bf16-pure"))))
def test_ledger_equals_what_autograd_saves(name, policy, precision):
    """Byte for byte: the latents and their norms (the key/value latent normalised from a view of kv_a's
    output, which it keeps whole), the rotary tables, the concatenated q and k, v as a view of kv_b's output."""
    spec = VARIANTS[name]
    for attention in ("standard", "flash"):
        config = TrainConfig(seq_len=16, micro_batch=2, attention=attention, precision=precision,
                             recompute=parse_policy(policy))
        measured = probe_config(spec, config)
        ledger = activation_ledger(spec, config, "cpu")
        assert (ledger.saved_bytes, ledger.parameter_copy_bytes) == (measured.activation_bytes,
                                                                     measured.parameter_copy_bytes), attention


@pytest.mark.parametrize("policy", ["none", "full", "selective", "op-selective"])
@pytest.mark.parametrize("name", VARIANTS)
def test_flops_equal_flop_counter(name, policy):
    spec = VARIANTS[name]
    config = TrainConfig(seq_len=24, micro_batch=2, attention="standard", recompute=parse_policy(policy))
    model, tokens, targets = build(spec, config)
    with FlopCounterMode(display=False) as counter:
        model(tokens, targets).backward()
    assert counter.get_total_flops() == step_flops(spec, config, "cpu").hardware


def test_latent_attention_flops_on_meta_run_sdpas_math_path():
    spec = VARIANTS["q-latent"]
    config = TrainConfig(seq_len=24, micro_batch=2, attention="flash", recompute=parse_policy("selective"))
    model, tokens, targets = build(spec, config, "meta")
    with FlopCounterMode(display=False) as counter:
        model(tokens, targets).backward()
    assert counter.get_total_flops() == step_flops(spec, config, "meta").hardware


def test_deepseek_v3_flops_per_token_are_twice_its_active_matmul_weights_plus_attention():
    """37,552,282,624 parameters a token uses (the technical report's 37B), less the embedding and every norm
    (two a block, the q and kv latents' norms, the final one), each a matmul weight: 2 FLOPs each per token,
    plus QK^T over 192-wide heads and PV over 128-wide ones."""
    spec = resolve_model(str(FIXTURES / "hf" / "deepseek-v3.json"))
    config = TrainConfig(seq_len=4096, micro_batch=1)
    flops = step_flops(spec, config)
    s, h, layers = config.seq_len, spec.hidden, spec.n_layers
    norms = layers * (2 * h + 1536 + 512) + h
    matmul_weights = 37_552_282_624 - spec.vocab_size * h - norms
    attention = layers * 2 * s * s * 128 * (192 + 128)
    assert flops.forward == 2 * s * matmul_weights + attention
