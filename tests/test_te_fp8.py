"""Transformer Engine's FP8 recipes on the megatron stack (headroom.core.specs.float8): what backward keeps (each
converted linear's input as its fp8 copy), the cached fp8 weights, the casts and fp8 GEMMs the time model prices,
the amax all-reduces, the exports, the refusals, and the published H100 run they are validated on.

Transformer Engine does not run on a CPU, so the byte counts here are worked by hand from its source
(transformer_engine/pytorch/module/linear.py and layernorm_linear.py), independently of the ledger's code."""

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import estimate
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import HARDWARE_BY_KEY
from headroom.core.specs.interconnect import default_cluster
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.timing.comm import step_communication
from headroom.core.timing.step import datasheet_profile, step_time
from headroom.core.timing.step_ops import forward_ops

TE = ("te-delayed", "te-current")
H100 = datasheet_profile(HARDWARE_BY_KEY["h100-sxm"])
S, TP = 8192, 2


def _config(fp8="te-current", sp=False, policy="none", **changes):
    fields = {"seq_len": S, "micro_batch": 1, "precision": "bf16-master", "stack": "megatron",
              "layout": Layout(tp=TP, sp=sp)} | changes
    return TrainConfig(fp8=fp8, recompute=parse_policy(policy), **fields)


@pytest.mark.parametrize("recipe", TE)
@pytest.mark.parametrize("sp", [False, True])
def test_a_block_keeps_its_linears_inputs_in_fp8(recipe, sp):
    """Llama 3 8B at 8,192 tokens over 2 tensor-parallel ranks, one byte an element less or more than bf16 for:
    the two norms' outputs (q/k/v's and fc1's input: kept in fp8, the sharded s / tp rows under sequence
    parallelism), the attention's output (kept in bf16 by the attention kernel, and now in fp8 by the output
    projection too) and the SwiGLU output (fc2's input, kept in fp8 instead of bf16)."""
    spec = get_preset("llama3-8b")
    rows = S // TP if sp else S
    change = -2 * rows * spec.hidden + S * spec.q_dim // TP - S * spec.ffn_hidden // TP
    fp8, bf16 = (estimate(spec, _config(fp8=f, sp=sp), "cuda").ledger.per_layer_bytes for f in (recipe, "off"))
    assert fp8 - bf16 == change


def test_checkpointed_blocks_keep_only_their_input_under_either_recipe():
    spec = get_preset("llama3-8b")
    full = [estimate(spec, _config(fp8=f, policy="full"), "cuda").ledger.per_layer_bytes for f in ("off", *TE)]
    assert full[0] == full[1] == full[2] == S * spec.hidden * 2  # the block's bf16 input


@pytest.mark.parametrize("recipe, state", [("te-delayed", 4 * 5 * 2 * 4), ("te-current", 0)])
def test_the_fp8_weights_are_cached_beside_the_bf16_ones(recipe, state):
    """Two bytes (row- and column-wise copies) for each weight element of the rank's blocks, and under delayed
    scaling each linear's amax history of one and scale for its five scaled tensors, fp32: 4 linears a block."""
    spec = get_preset("llama3-8b")
    h, q, kv, f = spec.hidden, spec.q_dim, spec.kv_dim, spec.ffn_hidden
    per_block = (h * (q + 2 * kv) + q * h + 2 * h * f + f * h) // TP
    static = estimate(spec, _config(fp8=recipe), "cuda").static
    assert static.fp8_weights == spec.n_layers * (2 * per_block + state)
    plain = estimate(spec, _config(fp8="off"), "cuda").static
    assert static.total - plain.total == static.fp8_weights and plain.fp8_weights == 0


def test_estimate_shows_the_cached_weights(run_cli):
    args = ("estimate", "--model", "llama3-8b", "--seq-len", "8192", "--precision", "bf16-master", "--stack",
            "megatron", "--tp", "2")
    text = run_cli(*args, "--fp8", "te-current")
    assert text.returncode == 0, text.stderr
    assert "fp8 weights" in text.stdout and "bf16-master + fp8 te-current" in text.stdout
    assert "fp8 weights" not in run_cli(*args).stdout
    memory = json.loads(run_cli(*args, "--fp8", "te-current", "--json").stdout)["memory_bytes"]
    assert memory["fp8_weights"] == estimate(get_preset("llama3-8b"), _config(), "cuda").static.fp8_weights


@pytest.mark.parametrize("recipe, inputs", [("te-delayed", ("attn.sdpa_out", "mlp.swiglu")),
                                            ("te-current", ("attn_norm.out", "attn.sdpa_out", "mlp_norm.out",
                                                            "mlp.swiglu"))])
def test_casts_the_norm_does_not_write_run_once_a_tensor(recipe, inputs):
    """Delayed scaling's norm writes q/k/v's and fc1's fp8 input itself; current scaling casts it after an amax
    pass. Either way one cast a tensor however many linears read it (q, k and v one), each linear's output
    gradient cast in backward only, every block GEMM in fp8 and the head in bf16 (Megatron's own linear)."""
    spec = get_preset("llama3-8b")
    ops = forward_ops(spec, _config(fp8=recipe), "cuda", spec.n_layers)
    block = ops.dense_block
    casts = [op.name for op in block if op.name.endswith("_fp8") and not op.backward_only]
    assert casts == [f"block.{name}_fp8" for name in inputs]
    gemms = [op for op in block if op.kind == "gemm"]
    grads = [op for op in block if op.backward_only]
    assert [op.name for op in grads] == [f"block.{n}.grad_fp8" for n in ("attn.q_proj", "attn.k_proj", "attn.v_proj",
                                                                         "attn.o_proj", "mlp.fc1", "mlp.down_proj")]
    assert len(gemms) == 6 and {op.dtype for op in gemms} == {"fp8"}
    assert [(op.name, op.dtype) for op in ops.head if op.kind == "gemm"] == [("lm_head.out", "bf16")]
    # a backward-only op launches no forward kernel
    assert ops.launches == spec.n_layers * (len(block) - len(grads)) + len(ops.head)


def test_a_cast_reads_its_tensor_once_delayed_and_twice_current():
    """The attention output of Llama 3 8B at 8,192 tokens on 2 ranks (8192 x 2048 bf16): read once (delayed) or
    twice (current: the amax first), written row- and column-wise (2 bytes an element); its output projection's
    gradient (8192 x 4096) the same way in backward."""
    spec = get_preset("llama3-8b")
    elements, grad = S * spec.q_dim // TP, S * spec.hidden
    for recipe, reads in (("te-delayed", 1), ("te-current", 2)):
        ops = {op.name: op for op in forward_ops(spec, _config(fp8=recipe), "cuda", 1).dense_block}
        cast = ops["block.attn.sdpa_out_fp8"]
        assert (cast.read_bytes, cast.bytes, cast.backward_moved) == (reads * 2 * elements, 2 * elements, ())
        grad_cast = ops["block.attn.o_proj.grad_fp8"]
        assert grad_cast.backward_moved == (grad * (2 * reads + 2),) and grad_cast.backward_only


def test_weights_are_cast_once_a_step_not_once_a_micro_batch():
    """Transformer Engine casts a weight on a step's first micro-batch and caches it; torchao casts it in every
    micro-batch. The optimizer's term carries TE's casts: the same with 1 or 8 micro-batches."""
    spec = get_preset("llama3-8b")
    cluster = default_cluster("h100-sxm")

    def optimizer_s(fp8, m):
        return step_time(estimate(spec, _config(fp8=fp8), "cuda", m), H100, m, cluster).optimizer_s

    cast = optimizer_s("te-current", 1) - optimizer_s("off", 1)
    assert cast > 0 and optimizer_s("te-current", 8) - optimizer_s("off", 8) == pytest.approx(cast, rel=1e-12)
    delayed = optimizer_s("te-delayed", 1) - optimizer_s("off", 1)
    assert 0 < delayed < cast  # one read of each weight, not two


def test_current_scaling_all_reduces_each_sequence_parallel_norm_outputs_amax():
    """Under sequence parallelism current scaling reduces one fp32 amax for each norm output it quantizes (two a
    block, again in a recomputed forward), and the norm outputs are all-gathered in fp8; delayed scaling reduces
    none over the tensor-parallel ranks."""
    spec = get_preset("llama3-8b")
    cluster = default_cluster("h100-sxm")

    def terms(fp8, policy="none"):
        return step_communication(spec, _config(fp8=fp8, sp=True, policy=policy), 1, cluster)

    def amax(fp8, policy="none"):
        return [(t.op, t.message_bytes, t.calls) for t in terms(fp8, policy) if "amax" in t.note]

    assert amax("te-current") == [("all_reduce", 4, 2 * spec.n_layers)]
    assert amax("te-current", "full") == [("all_reduce", 4, 4 * spec.n_layers)]
    assert amax("te-delayed") == []
    for fp8, width in (("te-current", spec.hidden), ("off", 2 * spec.hidden)):
        gathers = [t for t in terms(fp8) if t.op == "all_gather" and "norms' outputs" in t.note]
        assert [t.message_bytes for t in gathers] == [S * width]


@pytest.mark.parametrize("changes, message", [
    ({"stack": "reference"}, "--fp8 te-current under --stack reference: Transformer Engine current scaling"),
    ({"stack": "torchtitan"}, "is run by the megatron stack only"),
    ({"precision": "amp-bf16"}, "Megatron-LM has no autocast"),
    ({"precision": "fp32"}, "float8 linears take a bf16 input"),
])
def test_a_te_recipe_refuses_what_megatron_does_not_run(changes, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        _config(**changes)


def test_torchao_recipes_are_refused_on_the_megatron_stack():
    with pytest.raises(ConfigError, match="is run by the reference and torchtitan stacks only"):
        _config(fp8="torchao-rowwise")


def test_rows_transformer_engine_cannot_multiply_are_refused():
    spec = get_preset("bench-llama-tiny")
    config = _config(seq_len=12, layout=Layout())
    with pytest.raises(ConfigError, match=r"its row count 12 does not \(assert_dim_for_fp8_exec\)"):
        config.check_model(spec)
    _config(seq_len=16, layout=Layout()).check_model(spec)


@pytest.mark.parametrize("recipe, flag", [("te-delayed", "delayed"), ("te-current", "tensorwise")])
def test_megatrons_export_carries_the_recipe(run_cli, recipe, flag):
    result = run_cli("plan", "--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "16", "--hardware",
                     "h100-sxm", "--gpus", "8", "--tp", "2", "--precision", "bf16-master", "--stack", "megatron",
                     "--fp8", recipe, "--export", "megatron")
    assert result.returncode == 0, result.stderr
    args = result.stdout.split("\n")[0].split()
    at = args.index("--fp8-format")
    assert args[at:at + 4] == ["--fp8-format", "hybrid", "--fp8-recipe", flag]


@pytest.mark.parametrize("fmt, reason", [
    ("torchtitan", "torchtitan converts linears with torchao, not Transformer Engine"),
    ("hf", "the HF Trainer's TrainingArguments have no float8 linear conversion"),
])
def test_other_exports_refuse_a_te_recipe_and_name_megatron(run_cli, fmt, reason):
    result = run_cli("plan", "--model", "llama3.2-1b", "--seq-len", "4096", "--global-batch", "8", "--hardware",
                     "h100-sxm", "--precision", "bf16-master", "--stack", "megatron", "--fp8", "te-delayed",
                     "--export", fmt)
    assert result.returncode == 2 and result.stdout == ""
    assert f"--export {fmt} of a plan with --fp8 te-delayed: {reason}" in result.stderr
    assert "or export it with --export megatron" in result.stderr


def test_plan_searches_both_te_recipes_under_megatron(plan_json):
    plan = plan_json("--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "16", "--hardware", "h100-sxm",
                     "--gpus", "8", "--precision", "bf16-master", "--stack", "megatron", "--fp8", "auto")
    assert {c["fp8"] for c in plan["candidates"]} == {"off", "te-delayed", "te-current"}
    assert plan["recommendation"]["fp8"] in TE


def test_the_published_megatron_bridge_h100_fp8_runs_within_10_percent():
    """Megatron-Bridge's DGX-H100 FP8-CS rows pinned to their layouts, their first and last blocks in bf16 as the
    recipe keeps them, nothing fitted: Llama 3 70B (1,602 tokens/s per GPU) predicted at 1,477, -7.8%, the same
    layout in bf16 at 1,135; Llama 3.1 405B (292), its 126 layers over 64 chunks with the embedding and the loss
    counted, at 311, +6.3%; Llama 3 8B (14,451), its first 5 blocks recomputed (block-5), at 14,070, -2.6%. The
    26.02 container's rows of the same layouts at larger batches: the 70B at 256 (1,621) at 1,489, -8.1%, the 405B
    at 1,536 (311) at 317, +2.1%."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import validation
    from published_runs import RUNS

    rows = [r for r in validation.published_rows() if r.source.startswith("Megatron-Bridge") and
            r.source.endswith("DGX-H100")]  # the target: its H100 rows (its B200 rows are reported beside)
    assert [r.name for r in rows] == ["Llama 3 70B, FP8-CS, TP 4 x PP 8 (v5) x DP 2",
                                      "Llama 3.1 405B, FP8-CS, TP 8 x PP 8 (v8) x CP 2 x DP 8",
                                      "Llama 3 70B, FP8-CS, TP 4 x PP 8 (v5) x DP 2, batch 256 (26.02)",
                                      "Llama 3.1 405B, FP8-CS, TP 8 x PP 8 (v8) x CP 2 x DP 8, batch 1536 (26.02)",
                                      "Llama 3 8B, FP8-CS, DP 8, block-5 recompute"]
    errors = [r.error for r in rows]
    assert all(abs(e) <= 0.10 for e in errors)
    assert -0.08 < errors[0] < -0.07 and 0.06 < errors[1] < 0.07 and -0.03 < errors[4] < -0.02
    assert -0.09 < errors[2] < -0.08 and 0.02 < errors[3] < 0.03
    run = next(r for r in RUNS if r.source.startswith("Megatron-Bridge"))
    bf16 = validation.predict(dataclasses.replace(run, config=dataclasses.replace(run.config, fp8="off",
                                                                                   first_last_bf16=False)))
    assert 1130 < bf16 < 1140 and bf16 < 0.78 * rows[0].predicted  # fp8 GEMMs and casts: 1.30x, two blocks bf16


def test_fp8_parameters_hold_each_block_weight_in_a_byte_and_gather_it_so():
    """Megatron's --fp8-param-gather over 2 data-parallel ranks under ZeRO 1: the block weights are the fp8
    parameters (a byte an element, not the recipe's 2) with their column-wise copy (a byte), and the updated
    parameters are all-gathered in fp8."""
    spec = get_preset("llama3-8b")
    h, q, kv, f = spec.hidden, spec.q_dim, spec.kv_dim, spec.ffn_hidden
    weights = spec.n_layers * (h * (q + 2 * kv) + q * h + 2 * h * f + f * h) // TP
    layout = Layout(tp=TP, dp=2, zero=1)
    held, cached = (estimate(spec, _config(layout=layout, fp8_param_gather=on), "cuda").static for on in (True, False))
    assert cached.parameters - held.parameters == weights
    assert (cached.fp8_weights, held.fp8_weights) == (2 * weights, weights)
    cluster = default_cluster("h100-sxm")

    def gathered(on):
        terms = step_communication(spec, _config(layout=layout, fp8_param_gather=on), 4, cluster)
        return next((t.calls, t.message_bytes) for t in terms if t.axis == "dp" and t.op == "all_gather")

    # Megatron-LM without overlap: a bucket a buffer, the fp8 weights' buffer apart from the 16-bit rest's
    (calls, whole), (fp8_calls, fp8_each) = gathered(False), gathered(True)
    assert (calls, fp8_calls) == (1, 2)
    assert fp8_each == -(-(whole - weights) // 2)


def test_fp8_parameters_need_the_distributed_optimizer_and_megatron(run_cli):
    plain = _config(layout=Layout(tp=TP, dp=2), fp8_param_gather=True)  # a layout the planner's search may try
    with pytest.raises(ConfigError, match=r"needs Megatron-LM's distributed optimizer.*--zero 1 or more"):
        plain.check_sharding()
    _config(layout=Layout(tp=TP), fp8_param_gather=True).check_sharding()  # one data-parallel rank: nothing to shard
    with pytest.raises(ConfigError, match="the torchtitan stack has none"):
        _config(fp8="off", stack="torchtitan", fp8_param_gather=True)
    args = ("estimate", "--model", "llama3-8b", "--precision", "bf16-master", "--stack", "megatron",
            "--fp8-param-gather", "on")
    off = run_cli(*args)
    assert off.returncode == 2 and "--fp8 is off: use --fp8 te-delayed, te-current or auto" in off.stderr
    unsharded = run_cli(*args, "--fp8", "te-current", "--dp", "2")
    assert unsharded.returncode == 2 and "use --zero 1 or more" in unsharded.stderr


def test_a_search_with_fp8_parameters_tries_only_sharded_layouts_and_exports_the_flag(run_cli, plan_json):
    args = ("--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "16", "--hardware", "h100-sxm",
            "--gpus", "8", "--precision", "bf16-master", "--stack", "megatron", "--fp8", "te-current",
            "--fp8-param-gather", "on")
    plan = plan_json(*args, "--exhaustive")  # every layout tried, none left out by its floor
    assert plan["request"]["fp8_param_gather"] is True
    layouts = [c["layout"] for c in plan["candidates"] + plan["rejected"]]
    assert layouts and all(lay["zero"] >= 1 or lay["dp"] * lay["cp"] == 1 for lay in layouts)
    assert any(lay["zero"] == 0 for lay in layouts)  # one data-parallel rank: nothing to shard, nothing refused
    exported = run_cli("plan", *args, "--export", "megatron")
    assert exported.returncode == 0, exported.stderr
    assert "--fp8-param-gather" in exported.stdout.split("\n")[0].split()


def test_a_run_configuration_keeps_fp8_parameters():
    from headroom.core.specs.run_config import RunConfig

    run = RunConfig(train=_config(layout=Layout(tp=TP, dp=2, zero=1), fp8_param_gather=True), accumulation_steps=2)
    document = run.to_dict()
    assert document["fp8_param_gather"] is True and RunConfig.from_dict(document) == run
    assert "fp8_param_gather" not in RunConfig(train=_config()).to_dict()
