"""Training-stack profiles (headroom.core.specs.stack): what each stack's kernels keep, against the formulas their sources give.

The hf stack's independent check is the trace of transformers' own model (tests/test_hf_trace.py); the
torchtitan stack's is autograd on the agent's decoder under torchtitan's policy (tests/test_torchtitan_stack.py).
"""

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.ledger import activation_ledger
from headroom.core.planning.planner import PlanRequest, plan
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.specs.stack import STACKS, stack_name
from headroom.core.timing.step import datasheet_profile

S, B = 4096, 1


def megatron_layer(spec, t: int = 1, selective: bool = False) -> int:
    """One Llama-style block under Megatron-LM with Transformer Engine, bf16, flash attention, no dropout,
    Korthikanti et al.'s accounting applied to its kernels, per tensor-parallel rank under sequence parallelism:

    - each fused RMSNorm keeps its input and an fp32 rstd per row (TE's LayerNormLinear: inputmat, rsigma);
    - each linear keeps its input: the norm's output for fc1 and qkv (sharded, gathered again in backward),
      the attention output for the projection, SwiGLU's output for fc2;
    - the attention core keeps q and k after the fused RoPE, v, and (flash) an fp32 log-sum-exp per head and
      row, with the philox seed and offset; under selective recompute only q, k and v, its inputs;
    - fused SwiGLU keeps fc1's [gate | up] output (megatron/core/fusions/fused_bias_swiglu.py);
    - fused RoPE's fp32 freqs table is one for the whole forward: layer 0 keeps it, not this one.
    """
    h, q, kv, f, a = spec.hidden, spec.q_dim, spec.kv_dim, spec.ffn_hidden, spec.n_heads
    sb = S * B // t
    norms = 2 * (2 * h * sb + 4 * sb)
    linear_inputs = 2 * h * sb + 2 * q * sb + 2 * h * sb + 2 * f * sb
    attention = 2 * (q + 2 * kv) * sb + (0 if selective else 4 * B * (a // t) * S + 16)
    swiglu = 2 * 2 * f * sb
    return norms + linear_inputs + attention + swiglu


@pytest.mark.parametrize("model", ["llama2-7b", "llama3-8b"])
@pytest.mark.parametrize("policy", ["none", "selective"])
@pytest.mark.parametrize("tp", [1, 8])
def test_megatron_fused_layer_keeps_what_its_kernels_save(model, policy, tp):
    spec = get_preset(model)
    config = TrainConfig(seq_len=S, micro_batch=B, precision="bf16-master", stack="megatron",
                         recompute=parse_policy(policy), layout=Layout(tp=tp, sp=tp > 1))
    ledger = activation_ledger(spec, config, "cuda")
    assert ledger.layer_bytes(1) == megatron_layer(spec, tp, policy == "selective")
    assert ledger.layer_bytes(0) - ledger.layer_bytes(1) == S * spec.rotary_dim * 4  # RoPE's freqs, once


def test_megatron_keeps_a_third_less_of_the_mlp_than_the_reference_decoder():
    """llama2-7b, bf16: the reference's unfused SwiGLU keeps gate, SiLU's output, up and the product (8 f bytes a
    token), Megatron's fused one fc1's output and the product (6 f); the reference also casts RoPE's fp32 tables
    to bf16 for q and k in each layer. Per layer 37.8 sbh against 32.2 sbh (sbh = tokens x hidden)."""
    spec = get_preset("llama2-7b")
    layer = {stack: activation_ledger(spec, TrainConfig(seq_len=S, micro_batch=B, precision="bf16-master",
                                                        stack=stack), "cuda").layer_bytes(1)
             for stack in ("reference", "megatron")}
    assert layer["reference"] - layer["megatron"] == 2 * S * B * spec.ffn_hidden + 4 * S * spec.rotary_dim * 2
    assert round(layer["megatron"] / (S * B * spec.hidden), 1) == 32.2
    assert round(layer["reference"] / (S * B * spec.hidden), 1) == 37.8


def test_megatron_norms_are_fused_on_every_device():
    """TE's RMSNorm is Megatron's kernel wherever the plan is for; the reference follows torch, whose CPU
    RMSNorm is a composite that keeps the fp32 normalised tensor too. Per layer, fp32: that for both norms, one
    f-wide tensor of the unfused SwiGLU, and the reference's cos and sin."""
    spec = get_preset("bench-llama-tiny")
    base = dict(seq_len=256, micro_batch=2, precision="fp32")
    megatron = activation_ledger(spec, TrainConfig(**base, stack="megatron"), "cpu").layer_bytes(1)
    reference = activation_ledger(spec, TrainConfig(**base), "cpu").layer_bytes(1)
    rows = 2 * 256
    assert reference - megatron == 2 * rows * spec.hidden * 4 + rows * spec.ffn_hidden * 4 + 2 * 256 * spec.rotary_dim * 4


def test_hf_stack_offers_the_trainers_checkpointing_only():
    with pytest.raises(ConfigError, match="^the hf stack has no selective checkpointing; it offers none, full$"):
        TrainConfig(seq_len=512, stack="hf", recompute=parse_policy("selective"))
    request = PlanRequest(spec=get_preset("llama3-8b"), train=TrainConfig(seq_len=8192, stack="hf"),
                          global_batch=64, budget_bytes=80 * 10**9)
    result = plan(request, datasheet_profile(get_hardware("h100-sxm")))
    kinds = {c.config.recompute.kind for c in (*result.candidates, *result.rejected)}
    assert kinds == {"none", "full"}


def test_hf_stack_keeps_transformers_norm_copies_and_tables_once():
    """On CUDA, bf16: LlamaRMSNorm keeps an fp32 copy (4 h) and the bf16 normalised tensor (2 h) where the fused
    kernel keeps the bf16 input (2 h); cos and sin are made once (layer 0 keeps them), not cast in each layer."""
    spec = get_preset("llama3-8b")
    base = dict(seq_len=S, micro_batch=B, precision="bf16-pure")
    hf = activation_ledger(spec, TrainConfig(**base, stack="hf"), "cuda")
    reference = activation_ledger(spec, TrainConfig(**base), "cuda")
    rd = spec.rotary_dim
    assert hf.layer_bytes(1) - reference.layer_bytes(1) == 2 * S * B * 4 * spec.hidden - 4 * S * rd * 2
    assert hf.layer_bytes(0) - hf.layer_bytes(1) == 2 * S * rd * 2


def test_a_stacks_former_name_still_reads():
    """Stores and shared links written before the rename hold ``torch``: it is the reference stack."""
    assert TrainConfig(seq_len=64, stack="torch").stack == "reference" == stack_name("torch")
    assert set(STACKS) == {"reference", "torchtitan", "megatron", "hf", "hf-liger"}
    with pytest.raises(ConfigError, match="^unknown training stack 'deepspeed'; valid: reference, torchtitan, "
                                          "megatron, hf, hf-liger$"):
        TrainConfig(seq_len=64, stack="deepspeed")
