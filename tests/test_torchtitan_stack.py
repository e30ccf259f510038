"""The torchtitan stack: torchtitan's fused q/k/v projection and activation checkpointing on the reference
decoder's ops.

torchtitan 0.3 (``torchtitan/distributed/activation_checkpoint.py``): ``SelectiveAC`` caches the outputs of
torch's compute-intensive ops but every second ``aten.mm`` of a block; ``FullAC`` checkpoints each block with
``early_stop=False``; its Llama 3 projects q, k and v with one linear (``wqkv``). The agent runs both policies
(headroom.agent.recompute) on its decoder with that projection; here the ledger is held to what autograd saves under
them, byte for byte, the FLOPs to FlopCounterMode, the per-layer bytes to the policy's rule, and the whole to
torchtitan's own Llama 3 probed under its own checkpointing.
"""

import copy
import dataclasses
import itertools

import pytest

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from headroom.agent.model import Decoder  # noqa: E402
from headroom.agent.recompute import torchtitan_saved  # noqa: E402
from headroom.core.errors import ConfigError  # noqa: E402
from headroom.core.memory.flops import step_flops  # noqa: E402
from headroom.core.memory.ledger import activation_ledger  # noqa: E402
from headroom.core.planning.planner import PlanRequest, plan, policies_worth_trying  # noqa: E402
from headroom.core.specs.config import TrainConfig  # noqa: E402
from headroom.core.specs.hardware import get_hardware  # noqa: E402
from headroom.core.specs.layout import Layout  # noqa: E402
from headroom.core.specs.presets import get_preset  # noqa: E402
from headroom.core.specs.recompute import parse_policy  # noqa: E402
from headroom.core.timing.step import datasheet_profile  # noqa: E402
from tests.probing import assert_same_training, build, probe_config  # noqa: E402

LLAMA = dataclasses.replace(get_preset("bench-llama-tiny"), n_layers=4)
SPECS = {
    "llama": LLAMA,
    "gpt": dataclasses.replace(get_preset("bench-gpt-tiny"), n_layers=4),  # every linear has a bias: addmm, cached
    "qkv-bias": dataclasses.replace(LLAMA, bias="qkv"),  # q, k and v run as addmm: o is the first mm
    "gemma3-like": dataclasses.replace(LLAMA, head_size=24, qk_norm=True, post_norms=True),
}
POLICIES = ("none", "full", "op-selective")
PRECISIONS = ("fp32", "amp-bf16", "bf16-pure")


def test_the_agents_save_list_is_torchtitans():
    pytest.importorskip("torchtitan", reason="torchtitan (the frameworks extra) is not installed")
    from torchtitan.distributed.activation_checkpoint import _get_default_save_ops

    theirs = set(_get_default_save_ops())
    # Beside these, torchtitan saves the custom ops of libraries the agent's decoder never runs, where another
    # import has registered them (varlen attention, DeepEP and HybridEP's dispatch and combine).
    optional = {"torch_attn._varlen_attn.default", "deepep.dispatch.default", "deepep.combine.default",
                "hybridep.dispatch.default", "hybridep.combine.default"}
    assert torchtitan_saved() <= theirs and {str(op) for op in theirs - torchtitan_saved()} <= optional


@pytest.mark.parametrize(("name", "attention", "policy", "precision"),
                         list(itertools.product(SPECS, ("standard", "flash"), POLICIES, PRECISIONS)))
def test_ledger_equals_what_autograd_saves(name, attention, policy, precision):
    spec = SPECS[name]
    dropout = 0.1 if spec.block == "gpt" else 0.0
    config = TrainConfig(seq_len=16, micro_batch=2, attention=attention, dropout=dropout, precision=precision,
                         recompute=parse_policy(policy), stack="torchtitan")
    measured = probe_config(spec, config)
    ledger = activation_ledger(spec, config, "cpu")
    assert (ledger.saved_bytes, ledger.parameter_copy_bytes) == (measured.activation_bytes,
                                                                 measured.parameter_copy_bytes)


def _torchtitans_llama3(spec, seq_len):
    """torchtitan 0.3's own Llama 3 for ``spec``: its fused wqkv, complex RoPE with a per-layer buffer resized to
    the training sequence (as its trainer does), SwiGLU, RMSNorm; torch's SDPA inside in place of its language
    models' FlexAttention, which on a CPU would need torch.compile."""
    from torchtitan.models.common import Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.rope import ComplexRoPE
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers

    layers = _build_llama3_layers(
        n_layers=spec.n_layers, dim=spec.hidden, n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads,
        hidden_dim=spec.ffn_hidden, attn_backend="flex",
        rope=ComplexRoPE.Config(dim=spec.head_dim, max_seq_len=seq_len, theta=500000, scaling="none"))
    layers = [dataclasses.replace(layer, attention=dataclasses.replace(
        layer.attention, inner_attention=ScaledDotProductAttention.Config())) for layer in layers]
    return Llama3Model.Config(
        dim=spec.hidden, vocab_size=spec.vocab_size, layers=layers,
        tok_embeddings=Embedding.Config(num_embeddings=spec.vocab_size, embedding_dim=spec.hidden),
        norm=RMSNorm.Config(normalized_shape=spec.hidden),
        lm_head=Linear.Config(in_features=spec.hidden, out_features=spec.vocab_size)).build()


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
@pytest.mark.parametrize("policy", POLICIES)
def test_torchtitans_own_llama3_keeps_what_the_ledger_says(policy, precision):
    """torchtitan's model under its own FullAC and SelectiveAC, probed on the CPU: the ledger's bytes exactly.
    Without checkpointing its rotation keeps its layer's RoPE buffer (s x head_dim/2 complex64) where the
    ledger counts the reference decoder's cos and sin tables (s x head_dim fp32 each): 4 s head_dim bytes less a
    layer, and that buffer is the model's, there in every step (static memory the planner leaves out)."""
    pytest.importorskip("torchtitan", reason="torchtitan (the frameworks extra) is not installed")
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    from headroom.agent.probe import probe

    b, s = 2, 16
    torch.manual_seed(0)
    model = _torchtitans_llama3(LLAMA, s)
    if policy == "full":
        FullAC(FullAC.Config()).apply(model)
    elif policy == "op-selective":
        SelectiveAC(SelectiveAC.Config()).apply(model)
    tokens, targets = (torch.randint(0, LLAMA.vocab_size, (b, s)) for _ in range(2))

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "amp-bf16"):
            logits = model(tokens)
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    measured = probe(model, forward)
    config = TrainConfig(seq_len=s, micro_batch=b, attention="flash", precision=precision,
                         recompute=parse_policy(policy), stack="torchtitan")
    ledger = activation_ledger(LLAMA, config, "cpu")
    rope_tables = LLAMA.n_layers * 4 * s * LLAMA.head_dim if policy == "none" else 0
    assert (ledger.saved_bytes - rope_tables, ledger.parameter_copy_bytes) == (measured.activation_bytes,
                                                                               measured.parameter_copy_bytes)


@pytest.mark.parametrize("policy", ["full", "op-selective"])
@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize(("attention", "device"), [("standard", "cpu"), ("flash", "meta")])
def test_flops_with_recompute_equal_flop_counter(name, policy, attention, device):
    spec = SPECS[name]
    config = TrainConfig(seq_len=24, micro_batch=2, attention=attention, recompute=parse_policy(policy),
                         stack="torchtitan")
    model, tokens, targets = build(spec, config, device)
    with FlopCounterMode(display=False) as counter:
        model(tokens, targets).backward()
    assert counter.get_total_flops() == step_flops(spec, config, device).hardware


@pytest.mark.parametrize(("name", "recomputed"), [
    ("llama", ("o", "up")),  # mm 1 to 5: the fused qkv, o, gate, up, down; the even ones rerun
    ("qkv-bias", ("gate", "down")),  # the fused qkv is an addmm: o, gate, up, down are mm 1 to 4
    ("gpt", ()),  # every linear an addmm: every output cached
])
def test_per_op_checkpointing_drops_every_second_matmul_output(name, recomputed):
    """Against plain PyTorch's op-selective (every matmul output cached), per layer on CUDA under amp-bf16: the
    bf16 outputs of the even-numbered mm, and nothing else."""
    spec = SPECS[name]
    b, s, h, kv, f = 2, 256, spec.hidden, spec.kv_dim, spec.ffn_hidden
    per_layer = {stack: activation_ledger(spec, TrainConfig(seq_len=s, micro_batch=b, stack=stack,
                                                            recompute=parse_policy("op-selective")),
                                          "cuda").per_layer_bytes for stack in ("reference", "torchtitan")}
    widths = {"k": kv, "o": h, "up": f, "gate": f, "down": h}
    assert per_layer["reference"] - per_layer["torchtitan"] == sum(2 * b * s * widths[m] for m in recomputed)


def test_full_checkpointing_reruns_the_down_projection_too():
    spec = get_preset("llama2-7b")
    flops = {stack: step_flops(spec, TrainConfig(seq_len=4096, stack=stack, recompute=parse_policy("full")))
             for stack in ("reference", "torchtitan")}
    down = flops["reference"].layer_forward["mlp_down"]
    assert flops["torchtitan"].recompute == flops["reference"].recompute + spec.n_layers * down
    assert flops["torchtitan"].recompute == flops["reference"].blocks_forward


def test_the_stack_offers_only_its_own_policies():
    with pytest.raises(ConfigError, match="the torchtitan stack has no every-2 checkpointing; it offers none, full, "
                                          "op-selective"):
        TrainConfig(seq_len=512, stack="torchtitan", recompute=parse_policy("every-2"))
    request = PlanRequest(spec=get_preset("llama3-8b"), train=TrainConfig(seq_len=8192, stack="torchtitan"),
                          global_batch=16)
    assert [str(p) for p in policies_worth_trying(request)] == ["none", "op-selective", "full"]
    moe = dataclasses.replace(LLAMA, n_experts=4, experts_per_token=2)
    with pytest.raises(ConfigError, match="which experts' outputs it keeps depends on the routing"):
        activation_ledger(moe, TrainConfig(seq_len=64, stack="torchtitan", recompute=parse_policy("op-selective")))


def test_a_mixture_of_experts_is_planned_on_torchtitan_without_per_op_checkpointing():
    """The planner leaves out the one policy it cannot account for the model, and says so; pinned, it is refused."""
    moe = get_preset("mixtral-8x7b")
    train = TrainConfig(seq_len=4096, stack="torchtitan", layout=Layout(dp=16, zero=3, ep=4))
    request = PlanRequest(spec=moe, train=train, global_batch=64)
    assert [str(p) for p in policies_worth_trying(request)] == ["none", "full"]
    result = plan(request, datasheet_profile(get_hardware("h100-sxm")))
    assert result.recommendation is not None
    assert {str(c.config.recompute) for c in (*result.candidates, *result.rejected)} == {"none", "full"}
    said = ("op-selective checkpointing is not tried: mixtral-8x7b: torchtitan's per-op checkpointing of a mixture "
            "of experts caches every second matmul, so which experts' outputs it keeps depends on the routing: not "
            "modelled")
    assert request.notes() == (said,)
    with pytest.raises(ConfigError, match=r"depends on the routing: not modelled; pin full or none, or leave "
                                          r"--recompute to the planner$"):
        dataclasses.replace(request, recompute=parse_policy("op-selective"))


def test_megatron_offers_its_own_policies_and_no_op_level_one():
    with pytest.raises(ConfigError, match="^the megatron stack has no op-selective checkpointing; it offers none, "
                                          "full, every-K, block-K, selective, offload$"):
        TrainConfig(seq_len=512, stack="megatron", recompute=parse_policy("op-selective"))
    request = PlanRequest(spec=get_preset("llama3-8b"), train=TrainConfig(seq_len=8192, stack="megatron"),
                          global_batch=16, allow_offload=True)
    assert {p.kind for p in policies_worth_trying(request)} == {"none", "selective", "full", "every", "offload"}


@pytest.mark.parametrize("policy", ["full", "op-selective"])
def test_torchtitans_policies_give_the_loss_and_gradients_of_none(policy):
    base = TrainConfig(seq_len=24, micro_batch=2, stack="torchtitan")
    assert_same_training(SPECS["llama"], base, dataclasses.replace(base, recompute=parse_policy(policy)))


@pytest.mark.parametrize("name", ["llama", "qkv-bias", "gemma3-like"])
def test_the_fused_projection_is_the_reference_decoders_model(name):
    """torchtitan's decoder draws its fused q/k/v weights as the reference decoder draws its three: in float64
    the two give one loss, and the fused gradient is the three gradients laid out kv group by kv group."""
    spec = SPECS[name]
    tokens, targets = (torch.randint(0, spec.vocab_size, (2, 24), generator=torch.Generator().manual_seed(seed))
                       for seed in (1, 2))
    losses, models = {}, {}
    for stack in ("reference", "torchtitan"):
        torch.manual_seed(0)
        models[stack] = Decoder(spec, stack=stack).double()
        losses[stack] = models[stack](tokens, targets)
        losses[stack].backward()
    torch.testing.assert_close(losses["torchtitan"], losses["reference"], rtol=1e-12, atol=0)
    separate, fused = (dict(models[stack].named_parameters()) for stack in ("reference", "torchtitan"))
    for layer in range(spec.n_layers):
        prefix = f"blocks.{layer}.attn."
        regrouped = copy.deepcopy(models["torchtitan"].blocks[layer].attn.qkv_proj)
        parts = ("weight", "bias") if spec.bias in ("qkv", "all") else ("weight",)
        for part in parts:
            regrouped.load(*(separate[f"{prefix}{p}_proj.{part}"].grad for p in "qkv"), part=part)
            torch.testing.assert_close(fused[f"{prefix}qkv_proj.{part}"].grad, getattr(regrouped, part),
                                       rtol=1e-10, atol=1e-14)
    for name_, param in fused.items():
        if "qkv_proj" not in name_:
            torch.testing.assert_close(param.grad, separate[name_].grad, rtol=1e-10, atol=1e-14, msg=name_)


def test_a_measured_step_keeps_its_stack_and_is_predicted_again_with_it(tmp_path):
    """Calibration reads which stack a step ran from its stored prediction and predicts it with that stack: a
    torchtitan per-op step's saved bytes match (the reference stack's op-selective would keep 2bs(h + f) more)."""
    from headroom.agent import bench_train
    from headroom.agent.fingerprint import device_name
    from headroom.agent.runner import run_suite
    from headroom.core.measured.measurements import step_observations
    from headroom.db.profiles import train_step_records
    from headroom.db.store import open_store

    config = TrainConfig(seq_len=32, micro_batch=2, precision="fp32", stack="torchtitan",
                         recompute=parse_policy("op-selective"))
    setup = bench_train.TrainSetup(spec=LLAMA, config=config, steps=2)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with open_store(url, mode="write") as store:
        run_suite(store, torch.device("cpu"), "train", cases=[bench_train.case(setup)], quiet=True)
    with open_store(url) as store, store.session() as session:
        (step,) = train_step_records(session, device_name(torch.device("cpu")))
    assert step.stack == "torchtitan" and step.label.endswith("op-selective (torchtitan)")
    # The saved bytes do not depend on the rates: any profile whose saving rules are the CPU's predicts them.
    cpu_rules = dataclasses.replace(datasheet_profile(get_hardware("h100-sxm")), device="cpu")
    (observed,) = step_observations([step], cpu_rules)
    assert observed.predicted_activation_bytes == observed.measured_activation_bytes == step.activation_bytes
    # Plain PyTorch's op-selective keeps o and up too (fp32), and the CPU's fused attention output and
    # log-sum-exp, which torchtitan's list lacks.
    b, s, a = 2, 32, LLAMA.n_heads
    reference = activation_ledger(LLAMA, dataclasses.replace(config, stack="reference"), "cpu").saved_bytes
    assert reference - step.activation_bytes == LLAMA.n_layers * 4 * b * s * (
        LLAMA.hidden + LLAMA.ffn_hidden + LLAMA.q_dim + a)
