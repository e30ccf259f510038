"""Mixtures of experts: the agent's dropless MoE block (headroom.agent.model.Experts) against the core's accounting.

Three small variants cover the published designs: Mixtral's (renormalised top-2, no shared expert),
Qwen2-MoE's (a shared expert behind a sigmoid gate, top-k weights as the softmax gives them) and
DeepSeek-V3's layout (a leading dense block, an ungated shared expert). Each is checked against
FlopCounterMode, against the bytes autograd saves (headroom.agent.probe), exactly, and against the published
active parameter counts through the planner's FLOPs.
"""

import dataclasses
import itertools

import pytest

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from headroom.core.memory.estimate import estimate  # noqa: E402
from headroom.core.memory.flops import step_flops  # noqa: E402
from headroom.core.memory.ledger import activation_ledger  # noqa: E402
from headroom.core.planning.planner import PlanRequest, plan  # noqa: E402
from headroom.core.specs.config import TrainConfig  # noqa: E402
from headroom.core.specs.hardware import get_hardware  # noqa: E402
from headroom.core.specs.layout import Layout  # noqa: E402
from headroom.core.specs.presets import get_preset  # noqa: E402
from headroom.core.specs.recompute import parse_policy  # noqa: E402
from headroom.core.timing.step import datasheet_profile  # noqa: E402
from tests.probing import (  # noqa: E402
    assert_decoder_is_the_spec,
    assert_same_training,
    build,
    probe_config,
)

TINY = dataclasses.replace(get_preset("bench-llama-tiny"), n_layers=4, n_experts=4, experts_per_token=2,
                           expert_ffn_hidden=48)
VARIANTS = {
    "mixtral-like": dataclasses.replace(TINY, normalize_expert_weights=True),
    "qwen2-moe-like": dataclasses.replace(TINY, shared_expert_ffn_hidden=64, shared_expert_gate=True),
    "deepseek-like": dataclasses.replace(TINY, shared_expert_ffn_hidden=64, dense_layers=1,
                                         normalize_expert_weights=True),
    # Megatron-style capacity: 2 x 16 tokens x 2 / 4 experts x 0.75 = 12 rows an expert, of 16 routed on average,
    # so some tokens are dropped and some experts padded.
    "capacity-0.75": dataclasses.replace(TINY, capacity_factor=0.75),
}
POLICIES = ("none", "full", "every-2", "selective", "op-selective", "offload")
PRECISIONS = ("fp32", "amp-bf16", "bf16-pure")


@pytest.mark.parametrize("name", VARIANTS)
def test_the_decoders_parameters_are_the_specs(name):
    spec = VARIANTS[name]
    model = assert_decoder_is_the_spec(spec)
    assert sum(isinstance(m, torch.nn.Linear) and "experts" in n for n, m in model.named_modules()) == (
        3 * spec.n_experts * spec.moe_layers)


@pytest.mark.parametrize("policy", POLICIES[:-1])
@pytest.mark.parametrize("name", VARIANTS)
def test_flops_equal_flop_counter(name, policy):
    """Forward, and forward + backward + recompute, as FlopCounterMode counts them (standard attention on
    the CPU: data-dependent routing cannot run on the meta device)."""
    spec = VARIANTS[name]
    config = TrainConfig(seq_len=24, micro_batch=2, attention="standard", recompute=parse_policy(policy))
    model, tokens, targets = build(spec, config)
    with FlopCounterMode(display=False) as counter:
        loss = model(tokens, targets)
        forward = counter.get_total_flops()
        by_module = counter.get_flop_counts()
        loss.backward()
    predicted = step_flops(spec, config, "cpu")
    assert (forward, counter.get_total_flops()) == (predicted.forward, predicted.hardware)
    last = f"Decoder.blocks.{spec.n_layers - 1}.mlp"
    moe = predicted.moe_layer_forward
    assert sum(by_module[f"{last}.router"].values()) == moe["router"]
    routed = sum(sum(by_module[f"{last}.experts.{e}"].values()) for e in range(spec.n_experts))
    assert routed == moe["experts_gate"] + moe["experts_up"] + moe["experts_down"]
    assert predicted.moe_layers == spec.n_layers - spec.dense_layers
    # Every block's forward by matmul (estimate --json's forward_by_component): the MLPs' matmuls (dense
    # blocks' and routed ones') and the attentions' add up to what the counter saw in those modules.
    by_matmul = predicted.blocks_forward_by_matmul
    mlp = sum(f for name, f in by_matmul.items() if name.startswith(("mlp_", "router", "experts_", "shared_")))
    attention = sum(f for name, f in by_matmul.items() if name.endswith("_proj") or name.startswith("attn_"))
    assert (mlp, attention) == (
        sum(sum(by_module[f"Decoder.blocks.{i}.mlp"].values()) for i in range(spec.n_layers)),
        sum(sum(by_module[f"Decoder.blocks.{i}.attn"].values()) for i in range(spec.n_layers)))
    components = estimate(spec, config, "cpu").to_dict()["flops"]["forward_by_component"]
    assert sum(components.values()) == forward


@pytest.mark.parametrize(("name", "policy", "precision"), list(itertools.product(VARIANTS, POLICIES, PRECISIONS)))
def test_ledger_equals_what_autograd_saves(name, policy, precision):
    """Byte for byte: the router's tensors, the routed rows' and each expert's, the shared expert's, and
    every expert's autocast weight copy, under every policy."""
    spec = VARIANTS[name]
    attention = "flash" if name == "mixtral-like" else "standard"
    config = TrainConfig(seq_len=16, micro_batch=2, attention=attention, precision=precision,
                         recompute=parse_policy(policy))
    measured = probe_config(spec, config)
    ledger = activation_ledger(spec, config, "cpu")
    assert (ledger.saved_bytes, ledger.parameter_copy_bytes) == (measured.activation_bytes,
                                                                 measured.parameter_copy_bytes)


@pytest.mark.parametrize("name", ["mixtral-like", "qwen2-moe-like"])
def test_a_routed_mlp_keeps_the_documented_bytes(name):
    """docs/accounting.md's formula for the MoE MLP under amp-bf16, term by term."""
    spec = VARIANTS[name]
    b, s = 2, 16
    ledger = activation_ledger(spec, TrainConfig(seq_len=s, micro_batch=b), "cuda")
    t, h, k, e, fe, fs = b * s, spec.hidden, spec.experts_per_token, spec.n_experts, spec.expert_ffn, \
        spec.shared_expert_ffn_hidden
    r = t * k
    router = 2 * t * h + 4 * t * e + 8 * t * k + (4 * t * k + 4 * t if spec.normalize_expert_weights else 0)
    routed = 16 * r + 4 * r * h + 8 * r * fe + 2 * r * h + 4 * r + 4 * r * h
    shared = (4 * t * h + 8 * t * fs + (2 * t * h + 2 * t + 2 * t * h if spec.shared_expert_gate else 0)) if fs else 0
    kept = sum(x.bytes for x in ledger.tensors if x.layer == 0 and x.name.startswith("block.moe.")
               and x.kind == "activation")
    assert kept == router + routed + shared
    copies = sum(x.bytes for x in ledger.tensors if x.layer == 0 and x.name.startswith("block.moe.")
                 and x.kind == "parameter_copy")
    assert copies == 2 * (h * e + 3 * h * fe * e + 3 * h * fs + (h if spec.shared_expert_gate else 0))


@pytest.mark.parametrize("policy", ["none", "every-2"])
def test_later_blocks_repeat_a_routed_block_not_a_dense_one(policy):
    """Six blocks, two dense: the ledger traces the dense blocks and the first routed segment, and repeats
    that one for the rest."""
    spec = dataclasses.replace(VARIANTS["deepseek-like"], n_layers=6, dense_layers=2)
    config = TrainConfig(seq_len=16, micro_batch=2, attention="standard", recompute=parse_policy(policy))
    ledger = activation_ledger(spec, config, "cpu")
    assert ledger.repeats and all(r.template >= spec.dense_layers for r in ledger.repeats)
    assert ledger.saved_bytes == probe_config(spec, config).activation_bytes
    if policy == "none":
        assert ledger.layer_bytes(0) == ledger.layer_bytes(1) != ledger.layer_bytes(2) == ledger.layer_bytes(5)


def test_recomputed_routing_gives_the_loss_and_gradients_of_none():
    """A checkpointed block routes its tokens again in backward; the same experts must be chosen."""
    base = TrainConfig(seq_len=24, micro_batch=2)
    assert_same_training(VARIANTS["deepseek-like"], base, dataclasses.replace(base, recompute=parse_policy("full")))


def test_mixtral_flops_per_token_are_twice_its_published_active_matmul_weights_plus_attention():
    """Mixtral 8x7B uses 12,879,925,248 parameters per token (Mistral AI); less its embedding and norms,
    each one a matmul weight: forward is 2 FLOPs per weight per token, plus the attention core."""
    spec = get_preset("mixtral-8x7b")
    config = TrainConfig(seq_len=4096, micro_batch=1)
    flops = step_flops(spec, config)
    h, s = spec.hidden, config.seq_len
    norms = (2 * spec.n_layers + 1) * h
    matmul_weights = 12_879_925_248 - spec.vocab_size * h - norms
    attention = spec.n_layers * 4 * s * s * spec.n_heads * spec.head_dim
    assert flops.forward == 2 * s * matmul_weights + attention
    assert flops.model == 3 * flops.forward


def test_static_memory_counts_every_expert_and_fsdp_shards_them():
    spec = get_preset("mixtral-8x7b")
    single = estimate(spec, TrainConfig(seq_len=4096, precision="bf16-pure"))
    assert single.static.parameters == 2 * 46_702_792_704
    sharded = estimate(spec, TrainConfig(seq_len=4096, layout=Layout(dp=8, zero=3)))
    # FSDP2 splits each expert's (14,336, 4,096) matrices by rows: 8 ranks divide everything evenly.
    assert sharded.static.parameters == 4 * 46_702_792_704 // 8


def test_a_plan_searches_layouts_without_tensor_or_pipeline_parallelism():
    """Their refusal by name, and expert parallelism: tests/test_expert_parallel.py."""
    spec = get_preset("qwen3-30b-a3b")
    request = PlanRequest(spec=spec, global_batch=64, train=TrainConfig(seq_len=4096), gpus=16,
                          pinned=frozenset({"ep"}))  # at ep 1: the search over ep is tests/test_expert_parallel.py's
    result = plan(request, datasheet_profile(get_hardware("h100-sxm")))
    searched = {(c.layout.tp, c.layout.pp) for c in result.layouts}
    assert searched == {(1, 1)} and result.recommendation is not None


def test_capacity_is_megatrons_and_a_capacity_that_drops_nothing_computes_what_dropless_does():
    """Megatron-LM's get_capacity(t k, E, C) = ceil(t k / E x C): Mixtral's 4,096 tokens at C 1.25 give each of its
    8 experts 1,280 rows. At C = E / k no expert can be sent more than it takes: the padded experts then compute
    exactly the dropless output; at 0.75 tokens are dropped and the output changes."""
    from headroom.agent.model import Experts

    assert dataclasses.replace(get_preset("mixtral-8x7b"), capacity_factor=1.25).expert_capacity(4096) == 1280
    spec = VARIANTS["mixtral-like"]
    torch.manual_seed(0)
    dropless = Experts(spec)
    x = torch.randn(2, 16, spec.hidden)
    for factor, same in ((2.0, True), (0.75, False)):
        padded = Experts(dataclasses.replace(spec, capacity_factor=factor))
        padded.load_state_dict(dropless.state_dict())
        assert torch.allclose(padded(x), dropless(x), rtol=1e-6, atol=1e-7) == same


def test_a_capacity_factor_is_refused_for_a_dense_model_and_out_of_range():
    from headroom.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"bench-llama-tiny: expert sizes are given but n_experts is 0"):
        dataclasses.replace(get_preset("bench-llama-tiny"), capacity_factor=1.0)
    with pytest.raises(ConfigError, match=r"capacity factor must be 0 \(dropless\) or a number up to 64 "
                                          r"\(1.0 to 1.5 is usual\), got -1"):
        dataclasses.replace(TINY, capacity_factor=-1)


def test_the_command_line_estimates_at_a_capacity_factor(capsys):
    """Mixtral at 4,096 tokens: C 1.0 gives each of 8 experts 1,024 rows, the dropless t k = 8,192 in all; C 1.25
    gives 1,280 each, 2,048 rows more, each through gate, up and down (3 x 2 x 4,096 x 14,336 FLOPs a row) in
    each of 32 blocks."""
    import json

    from headroom.cli.main import main

    forward = {}
    for factor in (None, "1.0", "1.25"):
        assert main(["estimate", "--model", "mixtral-8x7b", "--seq-len", "4096", "--json",
                     *(["--capacity-factor", factor] if factor else [])]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["model"]["capacity_factor"] == float(factor or 0)
        forward[factor] = report["flops"]["forward"]
    assert forward["1.0"] == forward[None]
    assert forward["1.25"] - forward[None] == 32 * 2_048 * 3 * 2 * 4_096 * 14_336
