"""FP8 training recipes (headroom.core.specs.float8): the ledger against what autograd keeps under torchao's
float8 linears on the CPU, which linears convert, the recipes' refusals, and the casts and fp8 GEMMs the time
model prices."""

import dataclasses

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.ledger import activation_ledger
from headroom.core.memory.trace import TracedOp
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.float8 import FLOAT8_RECIPES
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy

RECIPES = tuple(name for name, recipe in FLOAT8_RECIPES.items() if not recipe.saves_fp8)
"""torchao's recipes, which run on the CPU (Transformer Engine's are tests/test_te_fp8.py's)."""
POLICIES = {"reference": ("none", "full", "every-2", "selective", "op-selective", "offload"),
            "torchtitan": ("none", "full", "op-selective")}
CASES = [(recipe, stack, policy) for recipe in RECIPES for stack in FLOAT8_RECIPES[recipe].stacks
         for policy in POLICIES[stack]]
MODELS = {"llama": ("bench-llama-tiny", "flash", 0.0), "gpt": ("bench-gpt-tiny", "standard", 0.1)}
"""GQA, SwiGLU, RMSNorm and RoPE; biases, LayerNorm, GELU, dropout and eager attention."""
MX_FFN = 192
"""The tiny llama's MLP for MXFP8, whose blocks of 32 its own 176 does not fill."""


def _config(recipe, stack="reference", policy="none", attention="flash", dropout=0.0, **changes):
    fields = {"seq_len": 32, "micro_batch": 2, "precision": "bf16-pure"} | changes
    return TrainConfig(attention=attention, dropout=dropout, recompute=parse_policy(policy), stack=stack, fp8=recipe,
                       **fields)


def _converted_linears(spec, recipe) -> int:
    """The linears a recipe converts, counted from the spec: float8 the block linears whose widths divide by 16
    (torchtitan's filter), MXFP8 every linear, the head's too."""
    recipe = FLOAT8_RECIPES[recipe]
    if spec.block == "gpt":
        widths = [(spec.hidden, spec.q_dim)] * 3 + [(spec.q_dim, spec.hidden), (spec.hidden, spec.ffn_hidden),
                                                      (spec.ffn_hidden, spec.hidden)]
    else:
        widths = [(spec.hidden, spec.q_dim), (spec.hidden, spec.kv_dim), (spec.hidden, spec.kv_dim),
                  (spec.q_dim, spec.hidden), (spec.hidden, spec.ffn_hidden), (spec.hidden, spec.ffn_hidden),
                  (spec.ffn_hidden, spec.hidden)]
    return spec.n_layers * sum(recipe.converts(i, o) for i, o in widths) + recipe.converts_head


def _probe(spec, config):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao")
    from headroom.agent.bench_train import forward_loss
    from headroom.agent.ledger_check import build
    from headroom.agent.probe import probe

    model, tokens, targets = build(spec, config)
    swapped = [m for m in model.modules() if type(m).__name__ in ("Float8Linear", "MXFP8Linear")]
    with torch.random.fork_rng():
        measured = probe(model, lambda: forward_loss(model, tokens, targets, config.precision))
    return measured, swapped


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize(("recipe", "stack", "policy"), CASES, ids=["-".join(case) for case in CASES])
def test_the_ledger_is_what_autograd_keeps_under_float8_linears(recipe, stack, policy, model):
    from headroom.agent.ledger_check import compare, difference

    name, attention, dropout = MODELS[model]
    spec = dataclasses.replace(get_preset(name), n_layers=4)
    if FLOAT8_RECIPES[recipe].block and model == "llama":
        spec = dataclasses.replace(spec, ffn_hidden=MX_FFN)
    config = _config(recipe, stack, policy, attention, dropout)
    measured, swapped = _probe(spec, config)
    ledger = activation_ledger(spec, config, "cpu")
    # Every eligible linear runs in float8 (torchtitan fuses q, k and v into one); the head under MXFP8 only.
    fused = stack == "torchtitan"
    assert len(swapped) == _converted_linears(spec, recipe) - (2 * spec.n_layers if fused else 0)
    assert compare(ledger, measured)["device activations"][0] == measured.device_activation_bytes
    assert difference(ledger, measured) == []
    # and what the 16-bit linears keep: float8 keeps no tensor of its own. Under torchtitan's per-op
    # checkpointing a biased float8 linear is an aten.mm (its bias added after), so the every-second-matmul rule
    # caches other outputs than for the bf16 addmm.
    bf16 = activation_ledger(spec, dataclasses.replace(config, fp8="off"), "cpu")
    if not (stack == "torchtitan" and policy == "op-selective" and spec.bias == "all"):
        assert bf16.tensors == ledger.tensors
    else:
        assert bf16.tensors != ledger.tensors


def test_a_linear_whose_width_does_not_divide_by_16_stays_in_bf16():
    """An MLP 168 wide (16 x 10.5): its three linears stay bf16, in the agent's decoder and in the time model's
    GEMMs; the attention's two (fused q/k/v and output) convert."""
    spec = dataclasses.replace(get_preset("bench-llama-tiny"), n_layers=2, ffn_hidden=168)
    config = _config("torchao-rowwise", "torchtitan", "op-selective")
    measured, swapped = _probe(spec, config)
    assert [(m.in_features, m.out_features) for m in swapped] == [(64, 128), (64, 64)] * spec.n_layers
    assert activation_ledger(spec, config, "cpu").device_activation_bytes == measured.device_activation_bytes
    gemms = {op.name: op.dtype for op in _ops(spec, config).dense_block if op.kind == "gemm"}
    assert gemms == {"block.attn.qkv_proj.out": "fp8", "block.attn.o_proj.out": "fp8",
                     "block.mlp.gate_proj.out": "bf16", "block.mlp.up_proj.out": "bf16",
                     "block.mlp.down_proj.out": "bf16"}


@pytest.mark.parametrize(("changes", "words"), [
    ({"stack": "megatron"}, ("--fp8 torchao-rowwise under --stack megatron", "reference and torchtitan stacks only",
                             "--stack torchtitan")),
    ({"stack": "torchtitan", "fp8": "torchao-tensorwise"},
     ("--fp8 torchao-tensorwise under --stack torchtitan",
      "the reference stack only (torchtitan 0.3's Float8LinearConverter offers the rowwise recipes only)",
      "--stack reference")),
    ({"precision": "fp32"}, ("--precision fp32", "bf16-pure")),
    ({"precision": "amp-bf16"}, ("autocast", "--zero 3")),
])
def test_a_recipe_refuses_what_it_does_not_model(changes, words):
    base = {"seq_len": 32, "precision": "bf16-pure", "fp8": "torchao-rowwise"}
    with pytest.raises(ConfigError) as err:
        TrainConfig(**(base | changes))
    for word in words:
        assert word in str(err.value)


def test_an_unknown_recipe_names_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown fp8 recipe 'e4m3'; valid: off, torchao-tensorwise, torchao-rowwise"):
        TrainConfig(seq_len=32, precision="bf16-pure", fp8="e4m3")


def test_fsdp_mixed_precision_takes_float8():
    """amp-bf16 under zero 3 is FSDP's mixed precision: no autocast, bf16 gathered weights."""
    config = TrainConfig(seq_len=32, precision="amp-bf16", fp8="torchao-rowwise", layout=Layout(dp=2, zero=3))
    assert config.float8 is FLOAT8_RECIPES["torchao-rowwise"] and not config.runs_autocast


@pytest.mark.parametrize(("spec", "kind"), [
    (get_preset("mixtral-8x7b"), "a mixture of experts"),
    (dataclasses.replace(get_preset("bench-llama-tiny"), n_kv_heads=4, head_size=24, kv_lora_rank=16,
                         rope_head_size=8, v_head_size=12), "latent attention"),
])
def test_experts_and_latent_attention_are_refused(spec, kind):
    with pytest.raises(ConfigError, match=f"--fp8 torchao-rowwise of {kind} is not modelled"):
        _config("torchao-rowwise").check_model(spec)


def _ops(spec, config):
    from headroom.core.timing.step_ops import forward_ops

    return forward_ops(spec, config, "cuda", spec.n_layers)


def test_the_block_gemms_run_in_fp8_with_two_casts_each_and_the_head_in_bf16():
    spec = get_preset("llama3-8b")
    ops = _ops(spec, _config("torchao-rowwise", "torchtitan", seq_len=8192, micro_batch=1))
    gemms = [op for op in ops.dense_block if op.kind == "gemm"]
    casts = [op for op in ops.dense_block if op.name.endswith("_fp8")]
    assert [op.name for op in gemms] == [f"block.{n}.out" for n in ("attn.qkv_proj", "attn.o_proj", "mlp.gate_proj",
                                                                     "mlp.up_proj", "mlp.down_proj")]
    assert {op.dtype for op in gemms} == {"fp8"} and len(casts) == 2 * len(gemms)
    head = [op for op in ops.head if op.kind == "gemm"]
    assert [(op.name, op.dtype) for op in head] == [("lm_head.out", "bf16")]
    plain = _ops(spec, _config("off", "torchtitan", seq_len=8192, micro_batch=1))
    assert [op.flops for op in gemms] == [op.flops for op in plain.dense_block if op.kind == "gemm"]


def test_a_cast_reads_its_bf16_tensor_twice_and_writes_one_byte_an_element():
    """o_proj of Llama 3 8B at 8,192 tokens: its input (8192 x 4096) and its weight (4096 x 4096) are each read for
    the amax and again for the cast, and written in fp8; backward casts the input again and the output's gradient
    (8192 x 4096) twice."""
    ops = {op.name: op for op in _ops(get_preset("llama3-8b"),
                                      _config("torchao-tensorwise", seq_len=8192, micro_batch=1)).dense_block}
    tokens, h = 8192, 4096
    x_in = ops["block.attn.o_proj.input_fp8"]
    assert (x_in.read_bytes, x_in.bytes) == (2 * 2 * tokens * h, tokens * h)
    assert x_in.backward_moved == (5 * tokens * h,) * 3
    weight = ops["block.attn.o_proj.weight_fp8"]
    assert (weight.read_bytes, weight.bytes, weight.backward_moved) == (4 * h * h, h * h, (5 * h * h,))


def test_a_cast_prices_each_of_its_backward_kernels():
    from headroom.core.timing.op_time import DeviceRates, memory_s, ops_time

    rates = DeviceRates({"bf16": 1e15}, 0.7, 132, 5e14, 2.5, 4e12)
    op = TracedOp("x_fp8", "memory", "fp8", bytes=100, read_bytes=400, backward_moved=(500, 700, 700))
    time = ops_time(rates, (op,))
    assert (time.launches, time.backward_launches) == (1, 3)
    assert time.memory_s == memory_s(rates, 500)
    assert time.backward_memory_s == pytest.approx(memory_s(rates, 500) + 2 * memory_s(rates, 700), rel=1e-12)


def test_the_h200s_fp8_gemm_reproduces_its_measured_rate():
    """The H200's fp8 anchor is the reference run's 8192^3 _scaled_mm (1,266.3 TFLOP/s): the shape model gives it
    back at that shape; bf16 keeps its own 709.8."""
    from headroom.core.specs.hardware import HARDWARE_BY_KEY
    from headroom.core.timing.op_time import gemm_s
    from headroom.core.timing.step import datasheet_profile

    rates = datasheet_profile(HARDWARE_BY_KEY["h200"]).rates
    n = 8192
    for dtype, tflop_per_s in (("fp8", 1266.3), ("bf16", 709.8)):
        seconds = gemm_s(rates, n, n, n, 1, dtype) - rates.kernel_gap_s
        assert 2 * n**3 / seconds / 1e12 == pytest.approx(tflop_per_s, rel=1e-9)


def test_fp8_on_a_device_without_fp8_units_is_refused():
    from headroom.core.memory.estimate import estimate
    from headroom.core.specs.hardware import HARDWARE_BY_KEY
    from headroom.core.timing.step import datasheet_profile, step_time

    spec = get_preset("bench-llama-tiny")
    est = estimate(spec, _config("torchao-rowwise"), "cuda")
    with pytest.raises(ConfigError, match="--fp8 torchao-rowwise on a100-sxm-80gb: it has no fp8 tensor cores"):
        step_time(est, datasheet_profile(HARDWARE_BY_KEY["a100-sxm-80gb"]), 1)
    assert step_time(est, datasheet_profile(HARDWARE_BY_KEY["h100-sxm"]), 1).total_s > 0


def test_a_large_float8_linear_is_as_much_faster_than_bf16_as_torchaos_benchmark():
    """torchao's float8 README (pytorch/ao, torchao/float8/README.md, "Performance"): on an H100 a float8 linear of
    M, K, N = 4096, 8192, 16384, forward and backward with its casts, runs 1.39x as fast as the bf16 one. The
    model, fitted to none of it, gives 1.33x from the H100 SXM's datasheet row (within 5%). Its small example
    (1024, 2048, 1024: 0.80x) the model puts at 0.50x: its six cast kernels' launch gaps, which a compiled step
    fuses into fewer, dominate there (docs/accounting.md)."""
    from headroom.core.memory.forward_trace import new_trace
    from headroom.core.specs.devices import device_rules
    from headroom.core.specs.hardware import HARDWARE_BY_KEY
    from headroom.core.timing.op_time import ops_time
    from headroom.core.timing.step import datasheet_profile

    rates = datasheet_profile(HARDWARE_BY_KEY["h100-sxm"]).rates
    m, k, n = 4096, 8192, 16384
    seconds = []
    for fp8 in ("off", "torchao-tensorwise"):
        tr = new_trace(get_preset("llama3-8b"), _config(fp8), device_rules("cuda"), layer=0)
        x = tr.new("x", (1, m, k), "bf16")
        tr.ops = []
        tr.linear(x, "up", n, "bf16")
        time = ops_time(rates, tuple(op for op in tr.ops if op is not None))
        seconds.append(time.forward_s + time.backward_s)
    assert len(tr.ops) == 3  # the product and its two casts
    assert seconds[0] / seconds[1] == pytest.approx(1.39, rel=0.05)


PLAN = ("plan", "--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "64", "--gpus", "8",
        "--precision", "amp-bf16", "--stack", "torchtitan")


def test_plan_searches_the_recipes_on_a_gpu_with_fp8_units(run_cli):
    import json

    result = run_cli(*PLAN, "--hardware", "h100-sxm", "--fp8", "auto", "--json", "--top", "0", "--exhaustive")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["request"]["fp8"] == "auto"
    # torchtitan runs the rowwise recipe (its converter's): the search tries it and bf16
    assert {c["fp8"] for c in plan["candidates"]} == {"off", "torchao-rowwise"}
    # under amp-bf16 float8 runs on FSDP's mixed precision only: every candidate without zero 3 is bf16
    assert all(c["fp8"] == "off" for c in plan["candidates"] if c["layout"]["zero"] != 3)
    assert any(c["fp8"] != "off" and c["layout"]["tp"] > 1 for c in plan["candidates"])
    assert plan["recommendation"]["fp8"] == "torchao-rowwise"
    assert any("fp8 GEMMs by shape" in line for line in plan["hardware"]["assumptions"])
    text = run_cli(*PLAN, "--hardware", "h100-sxm", "--fp8", "auto").stdout
    assert "(fp8 recipes searched)" in text and f"fp8 {plan['recommendation']['fp8']}" in text


def test_plan_searches_no_recipe_on_a_gpu_without_fp8_units_and_refuses_a_pinned_one(run_cli):
    import json

    result = run_cli(*PLAN, "--hardware", "a100-sxm-80gb", "--fp8", "auto", "--json", "--top", "0")
    assert result.returncode == 0, result.stderr
    assert {c["fp8"] for c in json.loads(result.stdout)["candidates"]} == {"off"}
    refused = run_cli(*PLAN, "--hardware", "a100-sxm-80gb", "--fp8", "torchao-rowwise")
    assert refused.returncode == 2
    assert "--fp8 torchao-rowwise on a100-sxm-80gb: it has no fp8 tensor cores" in refused.stderr


def test_estimate_names_the_recipe(run_cli):
    import json

    args = ("estimate", "--model", "llama3-8b", "--seq-len", "4096", "--precision", "bf16-pure", "--fp8",
            "torchao-rowwise")
    text = run_cli(*args, "--hardware", "h100-sxm")
    assert text.returncode == 0, text.stderr
    assert "bf16-pure + fp8 torchao-rowwise" in text.stdout
    assert json.loads(run_cli(*args, "--json").stdout)["config"]["fp8"] == "torchao-rowwise"
    assert "agent" not in run_cli("agent", "train", "--help").stdout.split("--fp8")[0][-1:]  # no --fp8 there


def test_a_run_configuration_keeps_its_recipe_and_reads_without_one():
    from headroom.core.specs.run_config import RunConfig

    run = RunConfig(train=_config("torchao-tensorwise"), accumulation_steps=2)
    document = run.to_dict()
    assert document["fp8"] == "torchao-tensorwise" and RunConfig.from_dict(document) == run
    assert run.label == "micro 2 x accum 2, none, fp8 torchao-tensorwise"
    plain = RunConfig(train=_config("off")).to_dict()
    assert "fp8" not in plain and RunConfig.from_dict(plain).train.fp8 == "off"


def test_a_pinned_recipe_under_amp_bf16_searches_only_fsdp_layouts(run_cli):
    """FSDP's mixed precision is how a float8 recipe runs beside fp32 parameters: the search holds zero 3; on one
    layout without FSDP the recipe is refused with what would run it."""
    import json

    result = run_cli(*PLAN, "--hardware", "h100-sxm", "--fp8", "torchao-rowwise", "--json", "--top", "0")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    layouts = [c["layout"] for c in plan["candidates"] + plan["rejected"]]
    assert layouts and all(layout["zero"] == 3 for layout in layouts)
    assert {c["fp8"] for c in plan["candidates"]} == {"torchao-rowwise"}
    single = run_cli("plan", "--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "8", "--hardware",
                     "h100-sxm", "--fp8", "torchao-rowwise")
    assert single.returncode == 2 and "use --zero 3 (FSDP's mixed precision) or bf16-pure" in single.stderr


@pytest.mark.parametrize("fmt", ["hf", "megatron", "deepspeed", "lightning", "torchtitan"])
def test_an_export_carries_the_recipe_or_refuses_it_with_the_reason(run_cli, fmt):
    from headroom.core.exports import FP8_UNEXPRESSED

    result = run_cli(*PLAN, "--hardware", "h100-sxm", "--fp8", "torchao-rowwise", "--export", fmt)
    reason = FP8_UNEXPRESSED.get(fmt) or ("Megatron-LM trains FP8 with Transformer Engine (--fp8-format, "
                                          "--fp8-recipe), not torchao's float8 linears" if fmt == "megatron" else None)
    if reason is not None:
        assert result.returncode == 2 and result.stdout == ""
        assert f"--export {fmt} of a plan with --fp8 torchao-rowwise: {reason}" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    assert ('converters=[Float8LinearConverter.Config(recipe_name="rowwise", filter_fqns=["lm_head"])]'
            in result.stdout)
    assert 'model_registry("8B"' in result.stdout and "--config llama3_8b" in result.stdout


def test_torchtitans_export_carries_mxfp8_as_its_mx_converter(run_cli):
    result = run_cli(*PLAN, "--hardware", "b200", "--fp8", "torchao-mxfp8", "--export", "torchtitan")
    assert result.returncode == 0, result.stderr
    assert 'model_registry("8B", converters=[MXFP8LinearConverter.Config(model_compile_enabled=True)])' \
        in result.stdout


def test_torchtitans_export_refuses_the_recipe_its_converter_lacks(run_cli):
    """A plan on the reference stack with a recipe torchtitan's converter lacks cannot be exported for it; on the
    torchtitan stack, where --export torchtitan plans by default, the recipe is refused before any planning."""
    args = ("plan", "--model", "llama3.2-1b", "--seq-len", "4096", "--global-batch", "8", "--hardware", "h100-sxm",
            "--precision", "bf16-pure", "--fp8", "torchao-tensorwise", "--export", "torchtitan")
    result = run_cli(*args, "--stack", "reference")
    assert result.returncode == 2 and result.stdout == ""
    assert ("--export torchtitan of a plan with --fp8 torchao-tensorwise: torchtitan 0.3's Float8LinearConverter "
            "offers the rowwise recipes only; plan with --fp8 off\n") in result.stderr
    refused = run_cli(*args)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "--fp8 torchao-tensorwise under --stack torchtitan: " in refused.stderr


def test_a_box_that_measured_fp8_gemms_anchors_fp8_on_its_own():
    """The H200 reference run's fp8 GEMMs of 4096^3 and 8192^3 (with and without fast accumulation:
    1,270.6 / 1,365.2 and 1,266.3 / 1,352.5 TFLOP/s): each size's median, the median of those, at the median size
    as a cube. Without fp8 GEMMs the datasheet row's anchor stays."""
    import statistics

    from headroom.core.measured.measurements import (
        DeviceRecord,
        MatmulRecord,
        profile_from_measurements,
    )
    from headroom.core.specs.hardware import HARDWARE_BY_KEY
    from headroom.core.timing.op_time import anchor_efficiency
    from headroom.core.timing.step import datasheet_profile

    rates = {4096: (1270.6, 1365.2), 8192: (1266.3, 1352.5)}
    fp8 = [MatmulRecord("fp8", 2 * n**3, t * 1e12) for n, ts in rates.items() for t in ts]
    bf16 = [MatmulRecord("bf16", 2 * 8192**3, 709.8e12)]
    device = DeviceRecord(name="NVIDIA H200", device_type="cuda", memory_bytes=141 * 10**9)
    measured = profile_from_measurements(device, matmul=bf16 + fp8)
    side = round((statistics.median([2 * 4096**3, 2 * 8192**3]) / 2) ** (1 / 3))
    rate = statistics.median(statistics.median(ts) for ts in rates.values()) * 1e12
    expected = anchor_efficiency(rate, HARDWARE_BY_KEY["h200"].peak("fp8"), side, side, side, 132)
    assert measured.dtype_efficiency["fp8"] == pytest.approx(expected, rel=1e-12)
    assert measured.dtype_sources["fp8"] == "measured on NVIDIA H200"
    unmeasured = profile_from_measurements(device, matmul=bf16)
    assert unmeasured.dtype_efficiency == datasheet_profile(HARDWARE_BY_KEY["h200"]).dtype_efficiency


def test_a_pinned_configuration_with_the_recipes_searched_compares_them(run_cli):
    """--micro-batch, --accumulation and --recompute pinned on one layout with --fp8 auto: one candidate per
    recipe, ranked, and no single pinned configuration reported."""
    import json

    result = run_cli("plan", "--model", "llama3.2-1b", "--seq-len", "4096", "--global-batch", "8", "--hardware",
                     "h100-sxm", "--precision", "bf16-pure", "--micro-batch", "2", "--recompute", "full", "--fp8",
                     "auto", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["pinned"] is None
    # an H100 has no MXFP8 tensor cores: the float8 recipes and bf16
    assert sorted(c["fp8"] for c in plan["candidates"]) == ["off", "torchao-rowwise", "torchao-tensorwise"]
    assert {(c["micro_batch"], c["recompute"]) for c in plan["candidates"]} == {(2, "full")}


def test_mxfp8_runs_every_linear_head_included_on_blackwell_only():
    """torchtitan's MX converter swaps every linear: the head's GEMM runs in fp8 too; each cast reads its 16-bit
    tensor once and writes a scale byte a block of 32 beside its bytes. An H100 has no MXFP8 tensor cores."""
    from headroom.core.memory.estimate import estimate
    from headroom.core.specs.hardware import HARDWARE_BY_KEY
    from headroom.core.timing.step import datasheet_profile, step_time

    spec = get_preset("llama3-8b")
    config = _config("torchao-mxfp8", "torchtitan", seq_len=8192, micro_batch=1)
    ops = _ops(spec, config)
    assert [(op.name, op.dtype) for op in ops.head if op.kind == "gemm"] == [("lm_head.out", "fp8")]
    casts = {op.name: op for op in ops.dense_block if op.name.endswith("_fp8")}
    o_proj = casts["block.attn.o_proj.input_fp8"]
    tokens, h = 8192, 4096
    assert (o_proj.read_bytes, o_proj.bytes) == (2 * tokens * h, tokens * h + tokens * h // 32)
    est = estimate(spec, config, "cuda")
    assert step_time(est, datasheet_profile(HARDWARE_BY_KEY["b200"]), 1).total_s > 0
    with pytest.raises(ConfigError, match="--fp8 torchao-mxfp8 on h100-sxm: it has no MXFP8 tensor cores"):
        step_time(est, datasheet_profile(HARDWARE_BY_KEY["h100-sxm"]), 1)


MISFIT = ("bench-llama-tiny: --fp8 torchao-mxfp8 casts every linear in blocks of 32 along each width, and its "
          "ffn_hidden 176 does not divide by that")


@pytest.mark.parametrize(("spec", "changes", "message"), [
    (get_preset("bench-llama-tiny"), {}, MISFIT),
    (get_preset("llama3-8b"), {"seq_len": 8200, "micro_batch": 1}, "a micro-batch's 8,200 tokens on a rank"),
    (get_preset("llama3-8b"), {"layout": Layout(tp=2)}, "MXFP8 under tensor parallelism is not measured yet"),
])
def test_mxfp8_refuses_what_its_blocks_cannot_cover(spec, changes, message):
    with pytest.raises(ConfigError, match=message):
        _config("torchao-mxfp8", **changes).check_model(spec)
