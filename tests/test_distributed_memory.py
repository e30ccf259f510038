"""Memory under real torch.distributed, rank by rank: gloo on the CPU (tests/distributed/).

Two launches of torch's own launcher per session: two ranks measure tensor
parallelism (agent/parallel.py shards the decoder's blocks the way torchtitan
shards Llama's), FSDP2 and DDP (and expert parallelism, which
tests/test_expert_parallel.py checks), once per test run (the ``two_ranks``
fixture, tests/conftest.py); four ranks measure FSDP2 again (slow). The
first section holds each measurement against numbers derived by hand; the
second, the analytic core against the measurements.

Shapes: a tensor-parallel case runs 2 layers at s=32, b=2 (bench-gpt-tiny:
h=64, a=4, f=256; bench-llama-tiny: h=64, a=4, 2 key/value heads, f=176);
FSDP runs tests/distributed/data_parallel.py's 3-layer Llama whose odd
vocabulary (509) does not split evenly.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch was built without torch.distributed or gloo", allow_module_level=True)

import dataclasses  # noqa: E402

from headroom.core.memory.estimate import estimate  # noqa: E402
from headroom.core.memory.ledger import activation_ledger  # noqa: E402
from headroom.core.memory.pipeline import first_rank  # noqa: E402
from headroom.core.memory.static import rank_tensors  # noqa: E402
from headroom.core.specs.config import TrainConfig  # noqa: E402
from headroom.core.specs.interconnect import cluster_for  # noqa: E402
from headroom.core.specs.layout import Layout  # noqa: E402
from headroom.core.specs.precision import get_precision  # noqa: E402
from headroom.core.specs.presets import get_preset  # noqa: E402
from headroom.core.specs.recompute import parse_policy  # noqa: E402
from headroom.core.timing.comm import _vocabulary_calls, step_communication  # noqa: E402
from headroom.core.timing.gradient_buckets import (  # noqa: E402
    DDP_BUCKET_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    greedy_buckets,
)
from tests.distributed.collectives import messages, other_all_reduces  # noqa: E402
from tests.distributed.data_parallel import BUCKETED_SPEC, MICRO_BATCH, SEQ_LEN, SPEC  # noqa: E402
from tests.distributed.tensor_parallel import POLICIES, cases  # noqa: E402

TP = 2
TP_CASES = {case.name: case for case in cases(TP)}
SHARDED = [name for name, case in TP_CASES.items() if case.tp > 1]
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "bool": "bool", "int64": "int64"}
"""torch's dtype names as the ledger writes them."""


def _block_tensors(record: dict, layer: int = 0, kinds=("activation", "input")) -> list[dict]:
    """What block ``layer`` keeps (tensors attributed to the block whose forward saved them)."""
    prefix = f"blocks.{layer}"
    return [t for t in record["tensors"]
            if (t["module"] == prefix or t["module"].startswith(prefix + ".")) and t["kind"] in kinds]


def _saved_by(record: dict, module: str, layer: int = 1) -> list[dict]:
    return [t for t in record["tensors"] if t["module"] == f"blocks.{layer}.{module}" and t["kind"] != "parameter"]


# ---- hand-derived bytes of one block on one rank (CPU, bf16-pure) -------------------------------------------


def gpt_layer_bytes(s: int, b: int, h: int, a: int, f: int, t: int, sp: bool) -> int:
    """A GPT block, explicit attention with dropout, bf16, on one of ``t`` tensor-parallel ranks.

    On the CPU LayerNorm keeps bf16 statistics and dropout keeps a mask in the
    input's dtype. Under sequence parallelism the residual stream, the norms
    and the residual dropouts hold s/t tokens, but the column-parallel
    linears keep their all-gathered input: s tokens, at full width.
    """
    e = 2
    r = s // t if sp else s  # tokens of the residual stream on this rank
    norm = b * r * h * e + 2 * b * r * e  # LayerNorm input, mean and rstd
    norm_out = b * s * h * e  # the column-parallel linears' input
    heads, d = a // t, h // a
    attention = 3 * b * heads * s * d * e  # q, k^T, v as the batched matmuls' operands
    attention += 3 * b * heads * s * s * e + s * s  # softmax, dropout mask and output; the bool causal mask
    o_proj_input = b * s * (h // t) * e  # row-parallel: its shard of the heads
    residual_masks = 2 * b * r * h * e
    mlp = 2 * b * s * (f // t) * e  # GELU input (up_proj output) and output (down_proj's sharded input)
    return 2 * (norm + norm_out) + attention + o_proj_input + residual_masks + mlp


def llama_layer_bytes(s: int, b: int, h: int, a: int, kv: int, f: int, t: int, sp: bool) -> int:
    """A Llama block, SDPA flash (fused on the CPU, grouped heads as given), bf16, on one of ``t`` ranks.

    The CPU's RMSNorm is a composite: it keeps an fp32 copy of its input, the
    fp32 normalised tensor and the rsqrt; its bf16 output is what the
    column-parallel linears keep (all-gathered to s tokens under sequence
    parallelism).
    """
    e = 2
    r = s // t if sp else s
    norm = 2 * b * r * h * 4 + b * r * 4
    norm_out = b * s * h * e
    d = h // a
    rope_tables = 4 * s * d * e  # cos and sin cast to bf16, for q and for k
    q = b * (a // t) * s * d * e
    k = v = b * (kv // t) * s * d * e
    attention = rope_tables + q + k + v + q + b * (a // t) * s * 4  # rotated q, k; v; output; fp32 log-sum-exp
    mlp = 4 * b * s * (f // t) * e  # gate output, SiLU output, up output, their product
    return 2 * (norm + norm_out) + attention + mlp


def expected_layer_bytes(name: str) -> int:
    case = TP_CASES[name]
    spec, s, b = case.spec, case.seq_len, case.micro_batch
    if spec.block == "gpt":
        return gpt_layer_bytes(s, b, spec.hidden, spec.n_heads, spec.ffn_hidden, case.tp, case.sp)
    return llama_layer_bytes(s, b, spec.hidden, spec.n_heads, spec.n_kv_heads, spec.ffn_hidden, case.tp, case.sp)


# ---- tensor parallelism: measured against hand-derived numbers ---------------------------------------------


@pytest.mark.parametrize("name", list(TP_CASES))
def test_tensor_parallel_ranks_are_symmetric(two_ranks, name):
    first, second = (record["tensor_parallel"][name] for record in two_ranks)
    for key in ("activation_bytes", "layer_bytes", "parameter_bytes", "loss"):
        assert first[key] == second[key], key

    def rows(record):
        return Counter((t["module"], tuple(t["shape"]), t["dtype"], t["bytes"], t["kind"]) for t in record["tensors"])

    assert rows(first) == rows(second)


@pytest.mark.parametrize("name", SHARDED)
def test_sharded_model_computes_what_the_unsharded_one_does(two_ranks, name):
    for record in two_ranks:
        measured = record["tensor_parallel"][name]
        assert measured["max_logit_diff_vs_unsharded"] < 2e-2  # bf16 sums in another order
        assert measured["grads_finite"]


@pytest.mark.parametrize("name", [n for n, c in TP_CASES.items() if c.precision == "bf16-pure"])
def test_every_layer_keeps_the_hand_derived_bytes(two_ranks, name):
    for record in two_ranks:
        measured = record["tensor_parallel"][name]["layer_bytes"]
        assert [measured[str(i)] for i in range(2)] == [expected_layer_bytes(name)] * 2


@pytest.mark.parametrize("name", SHARDED)
def test_projection_outputs_carry_this_ranks_heads(two_ranks, name):
    """q, k, v come out of the column-parallel projections with a/tp (kv/tp) heads of head_dim each."""
    case = TP_CASES[name]
    spec, s, b = case.spec, case.seq_len, case.micro_batch
    a, kv, d = spec.n_heads // TP, spec.n_kv_heads // TP, spec.head_dim
    shapes = Counter(tuple(t["shape"]) for t in _saved_by(two_ranks[0]["tensor_parallel"][name], "attn"))
    if spec.block == "gpt":  # q, v and k^T as bmm operands; softmax, dropout mask and output
        assert shapes[(b, a, s, d)] == 2 and shapes[(b, a, d, s)] == 1 and shapes[(b, a, s, s)] == 3
    else:  # rotated q and k, v straight from its projection (b*s, kv/tp * d), SDPA's output
        assert shapes[(b, a, s, d)] == 2 and shapes[(b, kv, s, d)] == 1 and shapes[(b * s, kv * d)] == 1


@pytest.mark.parametrize("name", SHARDED)
def test_column_parallel_linears_keep_their_whole_input(two_ranks, name):
    """Under sequence parallelism DTensor all-gathers the norm's s/tp tokens before q/k/v and the MLP's
    first projection, and those linears keep the gathered (b, s, h): full size, not 1/tp of it."""
    case = TP_CASES[name]
    b, s, h = case.micro_batch, case.seq_len, case.spec.hidden
    first_projection = "mlp.up_proj" if case.spec.block == "gpt" else "mlp.gate_proj"
    for module in ("attn.q_proj", first_projection):
        (kept,) = [t for t in _saved_by(two_ranks[0]["tensor_parallel"][name], module)
                   if t["kind"] == "activation"]
        assert kept["shape"] == [b, s, h]
        if case.sp and case.precision == "bf16-pure":
            assert kept["op"] == "cat"  # the all-gather's output, kept as it came


@pytest.mark.parametrize("name", SHARDED)
def test_row_parallel_linears_keep_their_sharded_input(two_ranks, name):
    case = TP_CASES[name]
    spec, b, s = case.spec, case.micro_batch, case.seq_len
    (down_input,) = [t for t in _saved_by(two_ranks[0]["tensor_parallel"][name], "mlp.down_proj")
                     if t["kind"] == "activation"]
    assert down_input["shape"] == [b, s, spec.ffn_hidden // TP]
    if spec.block == "gpt":  # the merged heads; a Llama's o_proj reads a view of SDPA's output, kept by SDPA
        (o_input,) = _saved_by(two_ranks[0]["tensor_parallel"][name], "attn.o_proj")
        assert math.prod(o_input["shape"]) == b * s * spec.hidden // TP


def test_autocast_weight_copies_are_this_ranks_shards(two_ranks):
    """Under amp-bf16 each rank's autocast copies its own shard of every projection: 2 bytes x 1/tp."""
    spec = get_preset("bench-llama-tiny")
    h, kv, f = spec.hidden, spec.kv_dim, spec.ffn_hidden
    weights = 2 * h * h + 2 * h * kv + 3 * h * f
    for name in (n for n in SHARDED if TP_CASES[n].precision == "amp-bf16"):
        copies = _block_tensors(two_ranks[0]["tensor_parallel"][name], kinds=("parameter_copy",))
        assert sum(t["bytes"] for t in copies) == 2 * weights // TP
        assert {t["dtype"] for t in copies} == {"bfloat16"}


@pytest.mark.parametrize("name", SHARDED)
def test_tensor_parallel_parameters_split_all_but_norms_and_row_biases(two_ranks, name):
    """Megatron's split: projections and column-parallel biases 1/tp; norms and the row-parallel
    layers' biases (added after the reduction) replicated. The embedding and head stay whole here."""
    case = TP_CASES[name]
    spec = case.spec
    element = 4 if case.precision == "amp-bf16" else 2
    replicated = 2 * spec.norm_parameters() + (2 * spec.hidden if spec.bias == "all" else 0)
    per_layer = (spec.layer_parameters() - replicated) // TP + replicated
    rest = spec.parameters - spec.n_layers * spec.layer_parameters()
    expected = (rest + spec.n_layers * per_layer) * element
    assert two_ranks[0]["tensor_parallel"][name]["parameter_bytes"] == expected


# ---- FSDP2 and DDP: measured against hand-derived numbers ---------------------------------------------------


def _rows(d0: int, world: int, rank: int) -> int:
    """Rows of a dim-0 shard: torch.chunk's split, ceil(d0 / world) per rank until the rows run out."""
    chunk = -(-d0 // world)
    return max(0, min(chunk, d0 - rank * chunk))


def _unit_gathered_bytes(record: dict, unit: str, element: int = 2) -> int:
    """A unit gathered in ``element``-byte dtype: every rank's padded shard of each parameter."""
    world, total = record["world_size"], 0
    shapes = {row["name"]: row["shape"] for row in record["parameters"]["tensors"]}
    for name in record["units"][unit]:
        d0, *rest = shapes[name]
        total += world * -(-d0 // world) * math.prod(rest)
    return total * element


def _unit_numel(record: dict, unit: str) -> int:
    shapes = {row["name"]: row["shape"] for row in record["parameters"]["tensors"]}
    return sum(math.prod(shapes[name]) for name in record["units"][unit])


def _check_fsdp_shards(records: list[dict]) -> None:
    """Parameters, gradients and Adam state of every rank, and every wrapping, to the byte."""
    for record in records:
        rank = record["rank"]
        for fsdp in record["fsdp"].values():
            world = fsdp["world_size"]
            padded = 0
            for row in fsdp["parameters"]["tensors"]:
                d0, *rest = row["shape"]
                assert row["local_shape"] == [_rows(d0, world, rank), *rest]
                assert row["bytes"] == _rows(d0, world, rank) * math.prod(rest) * 4
                assert row["storage_bytes"] == -(-d0 // world) * math.prod(rest) * 4  # padded on every rank
                padded += row["storage_bytes"]
            assert fsdp["parameters"]["storage_bytes"] == padded
            params = {row["name"]: row for row in fsdp["parameters"]["tensors"]}
            for row in fsdp["gradients"]["tensors"]:
                assert (row["local_shape"], row["dtype"]) == (params[row["name"]]["local_shape"], "float32")
            # A unit's gradients are views of one flat buffer of its padded shards.
            assert fsdp["gradients"]["storage_bytes"] == padded
            states = {row["name"]: row for row in fsdp["optimizer_states"]["tensors"]}
            for name, param in params.items():
                for moment in ("exp_avg", "exp_avg_sq"):
                    assert states[f"{name}.{moment}"]["local_shape"] == param["local_shape"]  # not padded
                assert states[f"{name}.step"]["bytes"] == 4  # an fp32 scalar per parameter
            assert fsdp["optimizer_states"]["bytes"] == 2 * fsdp["parameters"]["bytes"] + 4 * len(params)


def _check_fsdp_gathers(records: list[dict]) -> None:
    """Which units are gathered together, and their bytes."""
    for record in records:
        blocks, titan = record["fsdp"]["blocks"], record["fsdp"]["torchtitan"]
        block = _unit_gathered_bytes(blocks, "blocks.0")
        root = _unit_gathered_bytes(blocks, "")
        for fsdp in (blocks, titan):
            gathered = fsdp["gathered"]
            for unit in fsdp["units"]:
                # While a unit's flat all-gather buffer is copied out, both exist: twice its bytes.
                assert gathered["unit_bytes"][unit] == 2 * _unit_gathered_bytes(fsdp, unit)
                assert gathered["unsharded_grad_bytes"][unit] == 2 * _unit_numel(fsdp, unit)  # bf16, unpadded
            states = gathered["timeline"]
            in_forward = [sum(u.startswith("blocks.") for u in s["units"]) for s in states if s["phase"] == "forward"]
            in_backward = [sum(u.startswith("blocks.") for u in s["units"]) for s in states if s["phase"] == "backward"]
            assert max(in_forward) == 1  # no forward prefetch on the CPU: one block at a time
            assert max(in_backward) == 2  # backward prefetches the next block while this one runs
        # The root keeps its unit (embedding, final norm, head) gathered from forward to backward.
        assert all("" in s["units"] for s in blocks["gathered"]["timeline"][1:-1])
        assert blocks["gathered"]["peak_bytes"] == root + 2 * block
        assert titan["gathered"]["peak_bytes"] == 2 * block  # a block is the largest unit here


def test_fsdp_shards_on_two_ranks(two_ranks):
    _check_fsdp_shards(two_ranks)


def test_fsdp_gathers_on_two_ranks(two_ranks):
    _check_fsdp_gathers(two_ranks)


@pytest.mark.slow
def test_fsdp_on_four_ranks(four_ranks):
    _check_fsdp_shards(four_ranks)
    _check_fsdp_gathers(four_ranks)
    _check_core_static(four_ranks)


def test_fsdp_keeps_the_activations_of_the_unsharded_bf16_model(two_ranks):
    """FSDP's mixed precision computes in bf16 like a bf16 model: the same saved tensors, on every rank."""
    for record in two_ranks:
        for fsdp in record["fsdp"].values():
            assert fsdp["activations"]["bytes"] == fsdp["activations"]["unsharded_bf16_bytes"]


def test_fsdp_memtracker_agrees_on_sharded_state(two_ranks):
    """torch's own FSDPMemTracker, an independent instrument, over one more step."""
    for record in two_ranks:
        fsdp = record["fsdp"]["blocks"]
        tracker = fsdp["memtracker"]
        if "error" in tracker:
            pytest.skip(f"FSDPMemTracker failed here: {tracker['error']}")
        assert tracker["peak"]["Sharded Param"] == fsdp["parameters"]["storage_bytes"]
        assert tracker["peak"]["OptState"] == fsdp["optimizer_states"]["bytes"]
        # FSDP reduce-scatters a unit's gradients from an fp32 buffer of its padded, gathered size.
        block = tracker["units"]["blocks.1"]["Peak Backward"]
        assert block["Reduce Scatter"] == _unit_gathered_bytes(fsdp, "blocks.1", element=4)


def test_ddp_buckets_hold_every_gradient_once(two_ranks):
    for record in two_ranks:
        ddp = record["ddp"]
        assert not ddp["gradient_as_bucket_view"]
        for step in ddp["buckets"]:
            assert sum(bucket["bytes"] for bucket in step) == ddp["parameter_bytes"]
            # 0.8 MB of fp32 gradients: one bucket under DDP's 1 MiB first-bucket cap.
            assert len(step) == 1


# ---- the analytic core against the measurements ------------------------------------------------------------
# Per-layer only for tensor parallelism: agent/parallel.py leaves the embedding and head whole, where the
# core (like torchtitan) splits the vocabulary.


def _tp_config(name: str) -> TrainConfig:
    case = TP_CASES[name]
    return TrainConfig(seq_len=case.seq_len, micro_batch=case.micro_batch, attention=case.attention,
                       dropout=case.dropout, precision=case.precision, layout=Layout(tp=case.tp, sp=case.sp),
                       fp8=case.fp8)


@pytest.mark.parametrize("name", list(TP_CASES))
def test_core_ledger_predicts_each_layer_of_a_tensor_parallel_rank(two_ranks, name):
    spec = TP_CASES[name].spec
    ledger = activation_ledger(spec, _tp_config(name), "cpu")
    measured = two_ranks[0]["tensor_parallel"][name]
    assert ledger.per_layer_bytes == measured["layer_bytes"]["0"]
    kinds = ("activation", "input", "parameter_copy")
    predicted = Counter((t.dtype, t.bytes, t.kind) for t in ledger.tensors if t.layer == 0)
    probed = Counter((DTYPES[t["dtype"]], t["bytes"], t["kind"]) for t in _block_tensors(measured, kinds=kinds))
    assert predicted == probed


@pytest.mark.parametrize("name", [n for n in SHARDED if TP_CASES[n].whole_decoder])
def test_core_ledger_predicts_each_layer_of_a_torchtitan_tensor_parallel_rank(two_ranks, name):
    """torchtitan's blocks (one fused q/k/v linear, each attention and MLP reading one DTensor) keep what the
    ledger says a torchtitan rank keeps: the gathered input once for all the linears that read it."""
    config = dataclasses.replace(_tp_config(name), stack="torchtitan")
    ledger = activation_ledger(TP_CASES[name].spec, config, "cpu")
    for record in two_ranks:
        assert ledger.per_layer_bytes == record["tensor_parallel"][name]["torchtitan_layer_bytes"]["0"]


@pytest.mark.parametrize("name", [n for n, c in TP_CASES.items() if c.tp == 1])
def test_core_ledger_predicts_the_whole_unsharded_model(two_ranks, name):
    ledger = activation_ledger(TP_CASES[name].spec, _tp_config(name), "cpu")
    assert ledger.saved_bytes == two_ranks[0]["tensor_parallel"][name]["activation_bytes"]


def _step_calls(spec, config: TrainConfig) -> Counter:
    """headroom.core.timing.comm's calls of one micro-batch's step by (op, message bytes)."""
    calls: Counter = Counter()
    for term in step_communication(spec, config, 1, cluster_for("cpu", TP)):
        calls[term.op, term.message_bytes] += term.calls
    return calls


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", SHARDED)
def test_core_counts_each_collective_of_a_tensor_parallel_step(two_ranks, name, policy):
    """One step's collectives, as torch's profiler saw them on each rank, are headroom.core.timing.comm's tensor-parallel
    terms for the reference stack: each column-parallel linear takes its input apart, so backward all-reduces
    each one's input gradient whole (q, k, v and up, and gate in a Llama block); a checkpointed block reruns
    its forward's, but for its closing one where no dropout follows it, and op-selective block by block as full
    does (it keeps matmul outputs, not collectives). The Llama decoder runs with its
    vocabulary sharded as `headroom agent train` runs it: the embedding's reduction, the head's input
    gradient's and the loss's three fp32 all-reduces are the core's too. The GPT decoder (tied, learned
    positions) shards its blocks only: it runs none of the vocabulary's collectives, and under sequence
    parallelism its first block scatters the embedding and its last gathers the output, a gather each way
    that is agent/parallel.py's boundary, not in the core."""
    case = TP_CASES[name]
    config = dataclasses.replace(_tp_config(name), recompute=parse_policy(policy))
    predicted = _step_calls(case.spec, config)
    tokens = case.micro_batch * case.seq_len
    if not case.whole_decoder:
        for op, token_bytes, calls, _ in _vocabulary_calls(case.spec, config):
            predicted[op, tokens * token_bytes] -= calls
        e = get_precision(case.precision).activation_bytes
        predicted += Counter({("all_gather", tokens * case.spec.hidden * e): 2} if case.sp else {})
    for record in two_ranks:
        collectives = record["tensor_parallel"][name]["collectives"][policy]
        assert messages(collectives, TP) == predicted
        assert other_all_reduces(collectives) == 0


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", [n for n in SHARDED if TP_CASES[n].whole_decoder])
def test_core_counts_each_collective_of_a_torchtitan_tensor_parallel_step(two_ranks, name, policy):
    """The Llama decoder as torchtitan shards it: q, k and v from one fused linear, and the attention and the
    MLP each handed one DTensor, so their linears' input gradients are reduced once each (all-reduced, or
    reduce-scattered under sequence parallelism), not once per linear as the reference's are. Under its
    checkpointing (headroom.agent.recompute: no early stop; op-selective keeps torch's compute-intensive ops and the
    reduce-scatters) a recompute reruns every forward collective of a block but, under op-selective, its
    reduce-scatters. Compared call for call, size and dtype, with headroom.core.timing.comm's terms for the torchtitan stack."""
    case = TP_CASES[name]
    config = dataclasses.replace(_tp_config(name), stack="torchtitan", recompute=parse_policy(policy))
    predicted = _step_calls(case.spec, config)
    for record in two_ranks:
        collectives = record["tensor_parallel"][name]["torchtitan_collectives"][policy]
        assert messages(collectives, TP) == predicted
        assert other_all_reduces(collectives) == 0


def _fsdp_estimate(world: int):
    config = TrainConfig(seq_len=SEQ_LEN, micro_batch=MICRO_BATCH, attention="flash", precision="amp-bf16",
                         layout=Layout(dp=world, zero=3))
    return estimate(SPEC, config, "cpu")


def test_core_predicts_fsdp_activations(two_ranks):
    """Under ZeRO-3 the core reads amp-bf16 as FSDP's mixed precision: bf16 compute, no autocast copies."""
    predicted = _fsdp_estimate(2)
    assert predicted.ledger.parameter_copy_bytes == 0
    for record in two_ranks:
        assert predicted.ledger.saved_bytes == record["fsdp"]["torchtitan"]["activations"]["bytes"]


def test_core_predicts_fsdp_gathered_units(two_ranks):
    """torchtitan's units (the core's): forward, the most gathered at once; backward, the most that
    FSDPMemTracker saw of gathered parameters, prefetched buffers, unsharded gradients and reduce-scatter
    buffers together (block 1 just before its post-backward: its parameters and unsharded bf16 gradients,
    block 0 prefetched, block 2's fp32 reduce-scatter buffer)."""
    forward, backward = _fsdp_estimate(2).gathered_parameter_bytes
    for record in two_ranks:
        fsdp = record["fsdp"]["torchtitan"]
        timeline = fsdp["gathered"]["timeline"]
        assert forward == max(s["bytes"] for s in timeline if s["phase"] == "forward")
        tracker = fsdp["memtracker"]
        if "error" in tracker:
            pytest.skip(f"FSDPMemTracker failed here: {tracker['error']}")
        kinds = ("Unsharded Param", "All Gather", "Unsharded Grad", "Reduce Scatter")
        seen = max(sum(snapshot[k] for k in kinds) for unit in tracker["units"].values()
                   for state, snapshot in unit.items() if "Backward" in state)
        assert backward == seen


def test_core_predicts_ddp_buckets(two_ranks):
    config = TrainConfig(seq_len=SEQ_LEN, micro_batch=MICRO_BATCH, attention="flash", precision="fp32",
                         layout=Layout(dp=2))
    buckets = estimate(SPEC, config, "cpu").static.gradient_buckets
    assert all(buckets == sum(b["bytes"] for b in record["ddp"]["buckets"][-1]) for record in two_ranks)


def test_core_cuts_ddps_gradients_into_its_buckets(two_ranks):
    """DDP's rebuilt buckets (its second step on) of a model larger than a bucket, bucket for bucket: their
    bytes in the order the reducer numbers them, and one all-reduce a bucket in the step's communication."""
    layout = Layout(dp=2)
    predicted = greedy_buckets([4 * n for n in reversed(rank_tensors(BUCKETED_SPEC, layout, first_rank(layout, 8)))],
                               (DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES))
    for record in two_ranks:
        first, rebuilt = record["ddp_buckets"]["buckets"]
        assert len(first) == 1  # the first step reduces everything at once
        assert [b["bytes"] for b in sorted(rebuilt, key=lambda b: b["index"])] == predicted
    assert len(predicted) == 5
    config = TrainConfig(seq_len=SEQ_LEN, micro_batch=MICRO_BATCH, attention="flash", precision="fp32", layout=layout)
    (term,) = step_communication(BUCKETED_SPEC, config, 1, cluster_for("cpu"))
    assert (term.op, term.calls) == ("all_reduce", 5)
    assert term.calls * term.message_bytes - sum(predicted) in range(5)  # each call the average, rounded up


def test_core_runs_zero_1_as_ddp_under_the_zero_redundancy_optimizer(two_ranks):
    """The reference stack's ZeRO-1 is the agent's: DDP (its buckets hold a copy of the gradients, all-reduced
    whole) under torch's ZeroRedundancyOptimizer, whose shards are whole tensors (the most loaded rank's AdamW
    moments, to the byte) and whose step broadcasts each updated parameter from its owner, a call a tensor."""
    layout = Layout(dp=2, zero=1)
    config = TrainConfig(seq_len=SEQ_LEN, micro_batch=MICRO_BATCH, attention="flash", precision="fp32", layout=layout)
    static = estimate(SPEC, config, "cpu").static
    assert static.optimizer_states == max(record["zero1"]["state_bytes"] for record in two_ranks)
    assert static.optimizer_states > estimate(SPEC, dataclasses.replace(config, stack="megatron"), "cpu") \
        .static.optimizer_states  # whole tensors: more than an even split
    terms = {t.op: t for t in step_communication(SPEC, config, 1, cluster_for("cpu"))}
    for record in two_ranks:
        _, rebuilt, last = record["zero1"]["steps"]
        assert rebuilt["broadcasts"] == last["broadcasts"] + 2  # DDP's rebuilt bucket indices and sizes
        assert sum(last["bucket_bytes"]) == static.gradient_buckets
        assert (last["all_reduces"], last["broadcasts"]) == (terms["all_reduce"].calls, terms["broadcast"].calls)
        assert terms["broadcast"].calls == record["zero1"]["parameters"] == len(SPEC.parameter_shapes())
    assert not terms["broadcast"].overlappable  # inside the optimizer's step


def _check_core_static(records: list[dict]) -> None:
    """The core's static state against the first rank (the most loaded: a full chunk of every parameter),
    to the byte, and every rank at most that.

    AdamW's ``step``, one fp32 scalar per parameter tensor, is the optimizer state's remainder: torch
    keeps it on the device only when the optimizer is fused or capturable, else on the host
    (torch/optim/adam.py, ``_init_group``). On this CPU run the host is the device, so it is measured
    here; on CUDA with the default foreach AdamW it is host memory. The core does not count it.
    """
    first = next(record for record in records if record["rank"] == 0)["fsdp"]["torchtitan"]
    static = _fsdp_estimate(first["world_size"]).static
    assert static.parameters == first["parameters"]["storage_bytes"]
    assert static.gradients == first["gradients"]["storage_bytes"]
    tensors = len(first["parameters"]["tensors"])
    assert first["optimizer_states"]["bytes"] == 2 * first["parameters"]["bytes"] + 4 * tensors
    assert static.optimizer_states == first["optimizer_states"]["bytes"] - 4 * tensors
    for record in records:
        fsdp = record["fsdp"]["torchtitan"]
        assert fsdp["parameters"]["storage_bytes"] == static.parameters  # padded on every rank
        assert fsdp["optimizer_states"]["bytes"] - 4 * tensors <= static.optimizer_states


def test_core_predicts_the_most_loaded_fsdp_rank_exactly(two_ranks):
    _check_core_static(two_ranks)
