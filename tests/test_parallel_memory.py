"""Memory per rank under tensor, sequence, pipeline, context and data parallelism, against the papers."""

import math
from dataclasses import replace
from fractions import Fraction

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import estimate
from headroom.core.memory.ledger import activation_ledger
from headroom.core.memory.pipeline import in_flight, pipeline_seconds, rank_kinds
from headroom.core.memory.static import (
    fsdp_first_shard_parameters,
    fsdp_units,
    gathered_in_forward,
    korthikanti_layer_activations,
    rank_parameters,
    static_memory,
    static_memory_of,
    zero_optimizer_share,
)
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import PRESETS, get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.specs.stages import chunk_layers
from headroom.core.units import GB

GPT3 = get_preset("gpt3-175b")
LLAMA = get_preset("llama2-7b")


# ---- Korthikanti et al. 2022, Table 2: one layer on one tensor-parallel rank ----------------------


@pytest.mark.parametrize(("sp", "selective"), [(False, False), (True, False), (False, True), (True, True)])
def test_table2_formulas(sp, selective):
    s, b, h, a, t = 2048, 1, GPT3.hidden, GPT3.n_heads, 8
    sbh = s * b * h
    published = {  # Table 2, bytes per layer
        (False, False): sbh * 10 + sbh * 24 // t + 5 * a * s * s * b // t,
        (True, False): (sbh * 34 + 5 * a * s * s * b) // t,
        (False, True): sbh * 10 + sbh * 24 // t,
        (True, True): sbh * 34 // t,
    }[(sp, selective)]
    assert korthikanti_layer_activations(s, b, h, a, tp=t, sp=sp, selective=selective).total == published


@pytest.mark.parametrize(("sp", "selective"), [(False, False), (True, False), (False, True), (True, True)])
def test_ledger_per_tp_rank_is_table2_plus_norm_statistics(sp, selective):
    """GPT-3 175B on 8-way TP, bf16-pure, standard attention, dropout, Megatron's saving rules.

    The ledger keeps exactly Table 2 and what the formula leaves out, as without parallelism
    (tests/test_ledger.py): each LayerNorm's fp32 mean and rstd over the rows this rank holds,
    and the explicit attention's s x s causal mask (recomputed under selective).
    """
    s, b, t = 2048, 1, 8
    config = TrainConfig(seq_len=s, micro_batch=b, precision="bf16-pure", attention="standard", dropout=0.1,
                         recompute=parse_policy("selective" if selective else "none"), stack="megatron",
                         layout=Layout(tp=t, sp=sp))
    layer = activation_ledger(GPT3, config, "cuda").per_layer_bytes
    formula = korthikanti_layer_activations(s, b, GPT3.hidden, GPT3.n_heads, tp=t, sp=sp, selective=selective).total
    rows = s // t if sp else s
    assert layer - formula == 4 * rows * b * 4 + (0 if selective else s * s)


def test_torch_sequence_parallel_keeps_the_gathered_inputs():
    """DTensor all-gathers a column-parallel linear's input and autograd keeps it: the attention's and
    the MLP's gathered input, full sequence, where Megatron keeps the 1/t shards."""
    s, b, h, t = 2048, 1, GPT3.hidden, 8
    base = dict(seq_len=s, micro_batch=b, precision="bf16-pure", attention="standard", dropout=0.1,
                layout=Layout(tp=t, sp=True))
    torch_layer = activation_ledger(GPT3, TrainConfig(**base, stack="reference"), "cuda").per_layer_bytes
    megatron_layer = activation_ledger(GPT3, TrainConfig(**base, stack="megatron"), "cuda").per_layer_bytes
    assert torch_layer - megatron_layer == 2 * (s * b * h * 2 - s * b * h * 2 // t)


def test_context_parallel_divides_the_sequence():
    """Every activation of a llama layer is linear in s under flash attention: cp 4 keeps a quarter,
    but for the fused kernel's philox seed and offset (two int64 scalars a layer)."""
    base = dict(seq_len=8192, precision="bf16-pure")
    whole = activation_ledger(LLAMA, TrainConfig(**base), "cuda").per_layer_bytes
    quarter = activation_ledger(LLAMA, TrainConfig(**base, layout=Layout(cp=4)), "cuda").per_layer_bytes
    assert quarter * 4 - whole == 3 * 16


@pytest.mark.parametrize(("stack", "cp_comm", "chunks"), [
    ("megatron", None, 4),  # TE's ring: K, V in use and arriving, with their gradients
    ("megatron", "all-gather", 2 * 4),  # the whole sequence's K and V, and their gradients
    ("reference", "ring", 2 + 4 + 4),  # torch's: K, V in use and arriving; fp32 dK, dV summed and arriving; fp32 dQ
    ("reference", None, 4 + 4 + 4),  # torch's default, gathered: every rank's K and V
])
def test_ring_attention_holds_its_exchange_in_backward(stack, cp_comm, chunks):
    """cp 4 on llama3-8b, bf16, b 2: a chunk is this rank's K and V of a layer, b x s/cp x kv_dim x 2 bf16 (the
    fp32 gradients of K and V twice that; Q's fp32 gradient, 4096 wide, four times)."""
    spec = get_preset("llama3-8b")
    config = TrainConfig(seq_len=8192, micro_batch=2, precision="bf16-pure", stack=stack,
                         layout=Layout(cp=4, cp_comm=cp_comm))
    chunk = 2 * 2 * (8192 // 4) * spec.kv_dim * 2  # K and V, b x s/cp x kv_dim, bf16
    assert activation_ledger(spec, config, "cuda").ring_buffer_bytes == chunks * chunk
    assert activation_ledger(spec, TrainConfig(seq_len=8192, micro_batch=2), "cuda").ring_buffer_bytes == 0


# ---- pipelines: Narayanan et al. 2021, Korthikanti et al. 2022 -----------------------------------


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_1f1b_first_stage_holds_pp_micro_batches(pp):
    """Stage i holds pp - i micro-batches: the first stage keeps a whole model's layers of activations."""
    layout = Layout(pp=pp)
    assert [in_flight(layout, i, 64) for i in range(pp)] == [pp - i for i in range(pp)]
    assert in_flight(layout, 0, 2) == min(pp, 2)  # fewer micro-batches than stages


@pytest.mark.parametrize(("pp", "v"), [(4, 2), (8, 3), (2, 4)])
def test_interleaved_first_stage_is_korthikanti_formula(pp, v):
    """Korthikanti Sec. 4.2.3: the first stage holds L (1 + (p - 1) / (p v)) layers of activations."""
    layers = 96
    layout = Layout(pp=pp, schedule="interleaved", virtual_stages=v)
    held = in_flight(layout, 0, 64) * (layers // pp)
    assert held == layers * (1 + Fraction(pp - 1, pp * v))


@pytest.mark.parametrize(("layout", "m", "expected"), [
    (Layout(pp=8), 32, Fraction(7, 32)),
    (Layout(pp=8, schedule="interleaved", virtual_stages=4), 32, Fraction(7, 128)),
    (Layout(pp=4, schedule="gpipe"), 8, Fraction(3, 8)),
    (Layout(), 8, Fraction(0)),
])
def test_bubble_is_pp_minus_one_over_v_m(layout, m, expected):
    """Narayanan et al. 2021, Sec. 2.2: bubble time fraction (p - 1) / m, and (p - 1) / (v m) interleaved, of
    alike stages' micro-batches (pipeline_seconds: m t_max + (sum t - t_max) / v)."""
    step = pipeline_seconds((1.0,) * layout.pp, m, layout.virtual_stages)
    assert (step - m) / m == pytest.approx(float(expected), rel=1e-12)


def test_gpipe_holds_every_micro_batch_on_every_stage():
    assert [in_flight(Layout(pp=4, schedule="gpipe"), i, 8) for i in range(4)] == [8] * 4


def test_the_first_stage_is_the_most_loaded_and_every_kind_is_listed():
    config = TrainConfig(seq_len=4096, precision="bf16-pure", layout=Layout(pp=4, tp=2))
    result = estimate(LLAMA, config, "cuda", accumulation_steps=8)
    report = result.to_dict()
    assert report["rank"] == "first stage"
    assert [r["rank"] for r in report["ranks"]] == ["first stage", "middle stage", "last stage"]
    assert report["ranks"][0]["peak"] == result.peak_bytes == max(r["peak"] for r in report["ranks"])
    first, middle, last = result.ranks
    # In flight: 4, 3 and 1 micro-batches of 8 layers each.
    per_layer = first.ledger.per_layer_bytes
    assert first.activation_bytes >= 4 * 8 * per_layer
    assert middle.activation_bytes == 3 * 8 * per_layer + 3 * (middle.ledger.device_activation_bytes - 8 * per_layer)
    assert last.logits_bytes > 0 and first.logits_bytes == 0


def test_interleaved_needs_micro_batches_in_groups_of_pp():
    config = TrainConfig(seq_len=1024, layout=Layout(pp=4, schedule="interleaved", virtual_stages=2))
    with pytest.raises(ConfigError, match="multiple of pp 4"):
        estimate(LLAMA, config, "cuda", accumulation_steps=6)


# ---- static state per rank ------------------------------------------------------------------------


@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_megatron_distributed_optimizer_is_6_plus_12_over_d(d):
    """Megatron-LM docs, "Distributed Optimizer": bf16 params (2) and fp32 main grads (4) on every
    rank, fp32 master and Adam state (12) sharded over d data-parallel ranks: 18 bytes at d = 1."""
    n = 10**9
    config = TrainConfig(seq_len=1, precision="bf16-fp32grad", optimizer="adam", layout=Layout(dp=d, zero=1))
    assert static_memory_of(n, config).total == n * 6 + n * 12 // d
    if d == 1:
        assert static_memory_of(n, config).total == 18 * n


def test_ddp_keeps_gradient_buckets_and_zero_does_not():
    """DDP's buckets copy the gradients, also under torch's ZeroRedundancyOptimizer (the reference stack's ZeRO-1),
    whose shards are whole tensors; Megatron-LM's distributed optimizer keeps none and splits evenly."""
    ddp = estimate(LLAMA, TrainConfig(seq_len=1024, layout=Layout(dp=8)), "cuda")
    assert ddp.static.gradient_buckets == ddp.static.gradients == LLAMA.parameters * 4
    zero1 = estimate(LLAMA, TrainConfig(seq_len=1024, layout=Layout(dp=8, zero=1), stack="megatron"), "cuda")
    assert zero1.static.gradient_buckets == 0
    assert zero1.static.optimizer_states == -(-LLAMA.parameters * 8 // 8)
    torch_zero1 = estimate(LLAMA, TrainConfig(seq_len=1024, layout=Layout(dp=8, zero=1)), "cuda")
    assert torch_zero1.static.gradient_buckets == torch_zero1.static.gradients
    share = zero_optimizer_share(tuple(math.prod(shape) for shape in LLAMA.parameter_shapes()), 8)
    assert torch_zero1.static.optimizer_states == share * 8 > zero1.static.optimizer_states


def test_zero_redundancy_optimizer_keeps_tensors_whole():
    """torch's greedy partition, largest first, each to the emptiest rank (the lowest-numbered of those alike): a
    tensor larger than an even share is one rank's alone."""
    assert zero_optimizer_share((3, 10, 2, 3, 2), 2) == 10  # 10 | 3 + 3 + 2 + 2
    assert zero_optimizer_share((4, 3, 4, 3, 2), 2) == 9  # 4 + 3 + 2 | 4 + 3: the tie's 2 to the first rank
    assert zero_optimizer_share((5, 1), 4) == 5  # more ranks than tensors: some hold none



def test_stages_add_up_to_the_model():
    assert rank_parameters(LLAMA, Layout()) == LLAMA.parameters
    pp2 = Layout(pp=2)
    first, last = rank_kinds(pp2, chunk_layers(pp2, LLAMA.n_layers), 1)
    assert rank_parameters(LLAMA, pp2, first) + rank_parameters(LLAMA, pp2, last) == LLAMA.parameters
    tied = get_preset("gpt2-xl")  # the last stage keeps its own copy of the embedding for the head
    first, last = rank_kinds(pp2, chunk_layers(pp2, tied.n_layers), 1)
    assert (rank_parameters(tied, pp2, first) + rank_parameters(tied, pp2, last)
            == tied.parameters + tied.vocab_size * tied.hidden)


def test_tensor_parallel_replicates_norms_only():
    """llama has no biases: everything but the 2L + 1 RMSNorm weights splits over tp."""
    norms = (2 * LLAMA.n_layers + 1) * LLAMA.hidden
    assert rank_parameters(LLAMA, Layout(tp=4)) == (LLAMA.parameters - norms) // 4 + norms


def test_fsdp_gathers_two_neighbouring_units_not_the_whole_model():
    """amp-bf16 under FSDP: no autocast copy of the whole model, two bf16 units gathered instead."""
    config = TrainConfig(seq_len=4096, layout=Layout(dp=8, zero=3))
    result = estimate(LLAMA, config, "cuda")
    runs = fsdp_units(LLAMA, config.layout, result.rank)
    block = (LLAMA.parameters - 2 * 32000 * 4096 - 4096) // 32  # its norms: 2 x 4,096 in a block, 4,096 at the end
    assert runs == ((LLAMA.embedding_parameters(), 1), (block, 32), (4096 + 32000 * 4096, 1))
    forward, backward = result.gathered_parameter_bytes
    assert forward == 2 * (2 * block)  # a 202M-parameter block's buffer and its copy, bf16 (not the 131M embedding)
    assert backward == forward + block * (2 + 4)
    # Resharded: twice the largest unit. Kept: every unit before, and the last twice. A shard over 2: half of
    # each unit before.
    assert gathered_in_forward(((5, 1), (3, 1)), True) == 10 and gathered_in_forward(((7, 1),), True) == 14
    assert gathered_in_forward(((1, 1), (3, 4), (2, 1)), False) == 1 + 12 + 2 * 2
    assert gathered_in_forward(((1, 1), (3, 4), (2, 1)), 2) == max(1 + 3 * 2 + 2 * 3, 1 + 4 * 2 + 2 * 2)
    assert result.autocast_cache_bytes == 0 and result.weight_copy_bytes == 0
    # Every dim 0 of llama2-7b (32000, 4096, 11008) splits evenly over 8: no padding, N / 8 exactly.
    first_shard = sum(math.prod(shape) // 8 for shape in LLAMA.parameter_shapes())
    assert result.static.parameters == result.static.gradients == first_shard * 4 == LLAMA.parameters * 4 // 8
    # A 7B model no longer carries 13.5 GB of bf16 weight copies per rank: 2.4 GB of gathered units.
    assert result.peak_components["weight_copies"] == 0
    assert result.peak_components["gathered_parameters"] == backward < 2.5 * GB


# ---- FSDP2's per-parameter shards -----------------------------------------------------------------


@pytest.mark.parametrize("name", list(PRESETS))
def test_parameter_shapes_add_up_to_the_parameter_count(name):
    spec = get_preset(name)
    assert sum(math.prod(shape) for shape in spec.parameter_shapes()) == spec.parameters


TINY_VARIANTS = {
    "bench-gpt-tiny": get_preset("bench-gpt-tiny"),
    "bench-llama-tiny": get_preset("bench-llama-tiny"),
    "gpt untied": replace(get_preset("bench-gpt-tiny"), tied_embeddings=False),
    "llama tied, qkv biases": replace(get_preset("bench-llama-tiny"), tied_embeddings=True, bias="qkv"),
}


@pytest.mark.parametrize("name", list(TINY_VARIANTS))
def test_parameter_shapes_are_the_decoders(name):
    """The agent's decoder, built on the meta device, has exactly these tensors in this order."""
    torch = pytest.importorskip("torch")
    from headroom.agent.model import Decoder

    spec = TINY_VARIANTS[name]
    with torch.device("meta"):
        decoder = Decoder(spec)
    assert [tuple(p.shape) for p in decoder.parameters()] == list(spec.parameter_shapes())


def test_fsdp_first_rank_holds_a_padded_chunk_of_every_parameter():
    """torch.chunk over 3 ranks: the first rank gets ceil(d0 / 3) rows of each parameter.

    bench-llama-tiny: embedding and head (512, 64) -> 171 rows each; per layer two norms (64,) -> 22
    each, q and o (64, 64) -> 22 rows, k and v (32, 64) -> 11 rows, gate and up (176, 64) -> 59 rows,
    down (64, 176) -> 22 rows; the final norm (64,) -> 22.
    """
    spec = get_preset("bench-llama-tiny")
    per_layer = 2 * 22 + 2 * 22 * 64 + 2 * 11 * 64 + 2 * 59 * 64 + 22 * 176
    first = 2 * 171 * 64 + spec.n_layers * per_layer + 22
    assert fsdp_first_shard_parameters(spec, 3) == first
    assert first > -(-spec.parameters // 3)
    config = TrainConfig(seq_len=256, precision="bf16-master", optimizer="adamw", layout=Layout(dp=3, zero=3))
    static = static_memory(spec, config)
    assert (static.parameters, static.gradients, static.master_weights, static.optimizer_states) == (
        2 * first, 2 * first, 4 * first, 8 * first)
    # cp ranks shard with the dp ranks: the same padded chunk over dp x cp = 3.
    assert static_memory(spec, replace(config, layout=Layout(cp=3, zero=3))) == static


def test_fsdp_with_tensor_or_pipeline_parallelism_keeps_the_plain_division():
    spec = get_preset("bench-llama-tiny")
    for layout in (Layout(tp=2, dp=3, zero=3), Layout(pp=2, dp=3, zero=3)):
        config = TrainConfig(seq_len=256, layout=layout)
        for rank in rank_kinds(layout, chunk_layers(layout, spec.n_layers), 1):
            expected = static_memory_of(rank_parameters(spec, layout, rank), config)
            assert static_memory(spec, config, rank) == expected


@pytest.mark.parametrize(("layout", "match"), [
    (dict(tp=3), "32 attention heads do not split over tp 3; use --tp among"),
    ({"pp": 5, "schedule": "interleaved", "virtual_stages": 2},
     "its 32 layers do not split over pp 5 x 2 virtual stages, evenly or with the embedding and the loss counted as a "
     r"layer each \(34\); use --pp x --virtual-stages among"),
    ({"pp": 2, "stage_layers": (10, 10)}, "stage layers 10,10 hold 20 blocks, not the model's 32; give 2 counts"),
    (dict(sp=True), "needs tp > 1"),
    (dict(cp=3), "seq-len 4096 does not split into 2 x cp = 6"),
    (dict(schedule="interleaved"), "virtual-stages >= 2"),
    # refused before any work that grows with the count (the divisors an error would suggest)
    (dict(pp=10**39, ep=3), r"spans 1,000,000,000,000,000,000,000,000,000,000,000,000,000 GPUs \(tp x pp x cp x "
                            r"dp\), beyond any cluster \(at most 1,048,576\)"),
])
def test_layouts_that_do_not_divide_name_the_value(layout, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(seq_len=4096, layout=Layout(**layout)).check_model(LLAMA)


def test_a_layout_spans_at_most_a_million_gpus():
    assert Layout(tp=8, pp=4, dp=2**15).world == 2**20
    with pytest.raises(ConfigError, match=r"^layout tp 8, pp 4 \(1f1b\), cp 1, dp 32769, zero 0 spans 1,048,608 GPUs"):
        Layout(tp=8, pp=4, dp=2**15 + 1)
