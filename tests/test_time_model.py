"""The operator-level time model against independent numbers: the FLOPs the accounting counts (FlopCounterMode
checks those), the H200 reference run's GEMM sweep and training steps, published runs pinned to their
configurations, and Megatron's own FLOP formula for MFU. benchmarks/validation.py prints what these assert."""

import dataclasses
import json
import statistics
import sys
from pathlib import Path

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import estimate
from headroom.core.memory.flops import step_flops
from headroom.core.planning.planner import PlanRequest, plan, plan_to_dict
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import HARDWARE, get_hardware
from headroom.core.specs.layout import Layout
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.timing.device_curves import CURVES, SUSTAINED_OVER_BURST
from headroom.core.timing.op_time import gemm_s
from headroom.core.timing.run_cost import RunCost
from headroom.core.timing.step import datasheet_profile, step_time
from headroom.core.timing.step_ops import forward_ops
from headroom.core.units import GB

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import h200_reference  # noqa: E402
import published_runs  # noqa: E402
import validation  # noqa: E402
from published_runs import RUNS  # noqa: E402

H200 = datasheet_profile(get_hardware("h200"))
MOE = dataclasses.replace(get_preset("llama3.2-1b"), name="moe", n_experts=8, experts_per_token=2,
                          expert_ffn_hidden=2048)


@pytest.mark.parametrize(("spec", "config"), [
    (get_preset("llama3.2-1b"), TrainConfig(seq_len=2048, micro_batch=2)),
    (get_preset("llama3.2-1b"), TrainConfig(seq_len=2048, micro_batch=1, stack="torchtitan")),
    (get_preset("gpt2-xl"), TrainConfig(seq_len=1024, micro_batch=2, attention="standard", dropout=0.1)),
    (get_preset("gpt2-xl"), TrainConfig(seq_len=1024, micro_batch=1, stack="megatron", precision="bf16-master")),
    (get_preset("llama3-8b"), TrainConfig(seq_len=4096, layout=Layout(tp=4, sp=True))),
    (get_preset("llama3-8b"), TrainConfig(seq_len=4096, layout=Layout(cp=2, dp=2))),
    (MOE, TrainConfig(seq_len=512, micro_batch=2)),
], ids=["llama", "torchtitan", "gpt-standard", "megatron", "tp4-sp", "cp2", "moe"])
def test_the_ops_gemms_add_up_to_the_flops_the_accounting_counts(spec, config):
    """Every matmul and attention kernel the enumeration prices, over the ranks that split a micro-batch, is
    exactly headroom.core.memory.flops's forward (which tests/test_torch_reference.py checks against FlopCounterMode)."""
    ops = forward_ops(spec, config, "cuda", spec.n_layers)
    priced = sum(n * sum(op.flops for op in block) for block, n in ops.blocks) + sum(op.flops for op in ops.head)
    split = config.layout.tp * config.layout.cp
    assert priced * split == step_flops(spec, config, "cuda").forward


ATEN_NOT_KERNELS = {"view", "_unsafe_view", "t", "transpose", "expand", "slice", "detach", "unsqueeze", "squeeze",
                    "permute", "select", "alias", "reshape", "as_strided", "split", "split_with_sizes", "unbind",
                    "lift_fresh", "_reshape_alias", "empty", "empty_like"}
"""aten ops that launch no kernel: views and metadata, and allocations."""


@pytest.mark.parametrize(("name", "attention", "dropout", "precision", "stack"), [
    ("bench-llama-tiny", "flash", 0.0, "fp32", "reference"),
    ("bench-llama-tiny", "standard", 0.0, "fp32", "reference"),
    ("bench-llama-tiny", "flash", 0.0, "bf16-pure", "reference"),
    ("bench-llama-tiny", "flash", 0.0, "amp-bf16", "reference"),
    ("bench-llama-tiny", "flash", 0.0, "fp32", "torchtitan"),
    ("bench-llama-tiny", "flash", 0.0, "amp-bf16", "torchtitan"),
    ("bench-gpt-tiny", "standard", 0.1, "fp32", "reference"),
    ("bench-gpt-tiny", "standard", 0.1, "amp-bf16", "reference"),
    ("bench-gpt-tiny", "flash", 0.0, "fp32", "reference"),
    ("bench-gpt-tiny", "flash", 0.1, "fp32", "reference"),
])
def test_the_ops_are_the_ops_the_agents_decoder_dispatches(name, attention, dropout, precision, stack):
    """Every kernel-launching aten op of the agent's decoder's forward on a CPU, counted by a TorchDispatchMode,
    one for one against the enumeration the time model prices (headroom.core.timing.step_ops): norms, RoPE's tables and
    rotation, casts under autocast, masks, dropout, the loss."""
    torch = pytest.importorskip("torch")
    from contextlib import nullcontext

    from torch.utils._python_dispatch import TorchDispatchMode

    from headroom.agent.model import Decoder

    class Count(TorchDispatchMode):
        launches = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ not in ATEN_NOT_KERNELS:
                self.launches += 1
            return func(*args, **(kwargs or {}))

    spec = get_preset(name)
    config = TrainConfig(seq_len=64, micro_batch=2, precision=precision, attention=attention, dropout=dropout,
                         stack=stack)
    model = Decoder(spec, attention=attention, dropout=dropout, recompute=parse_policy("none"), stack=stack).train()
    if precision == "bf16-pure":
        model = model.to(torch.bfloat16)
    tokens = torch.randint(0, spec.vocab_size, (2, 64))
    counted = Count()
    with counted, torch.autocast("cpu", dtype=torch.bfloat16) if precision == "amp-bf16" else nullcontext():
        model(tokens, tokens)
    assert counted.launches == forward_ops(spec, config, "cpu", spec.n_layers).launches


def test_the_ops_write_every_tensor_the_ledger_keeps():
    """What a block keeps for backward is made by one of its ops: the enumeration misses no saved tensor."""
    spec, config = get_preset("llama3.2-1b"), TrainConfig(seq_len=2048, precision="amp-bf16")
    ops = forward_ops(spec, config, "cuda", 1, first=False, last=False)
    written = {op.name for op in ops.dense_block}
    kept = {t.name for t in estimate(spec, config, "cuda").ledger.tensors if t.layer == 0}
    # The block's input (the embedding's output) comes from before it; a fused kernel's other outputs (the norms'
    # rstd, the attention's log-sum-exp and RNG state) are made by its one op.
    assert kept - written == {"embed", "block.attn_norm.rstd", "block.mlp_norm.rstd", "block.attn.logsumexp",
                              "block.attn.philox_seed", "block.attn.philox_offset"}


def test_the_shape_model_reproduces_its_anchor_and_the_h200_sweep():
    """The H200 row's cited GEMM exactly, and the reference run's bf16 sweep within 12% (median 2.3%): the worst
    is 1024^3, a burst at the 1,965 MHz boost clock that the sustained anchor (1,590 MHz) does not see. The sweep
    times kernels back to back, its launch gaps hidden: it is compared with the kernel's work, without the
    per-kernel gap a training step's dependent kernels pay."""
    rates = H200.rates
    m, n, k = CURVES["h200"].matmul_shape

    def work_s(m, n, k):
        return gemm_s(rates, m, n, k, 1, "bf16") - H200.kernel_gap_s

    assert 2 * m * n * k / work_s(m, n, k) == pytest.approx(709.8e12, rel=1e-9)
    sweep = [(r["m"], r["n"], r["k"], r["tflop_per_s"]) for run in h200_reference.bundle_runs()
             for r in run["results"]["matmul"] if r["dtype"] == "bf16" and r["status"] == "ok"]
    assert len(sweep) == 19
    errors = sorted(abs(2 * m * n * k / work_s(m, n, k) / 1e12 / measured - 1) for m, n, k, measured in sweep)
    assert errors[-1] <= 0.12 and errors[9] <= 0.025


def test_every_datasheet_device_has_a_cited_curve():
    for hw in HARDWARE:
        curves = CURVES[hw.key]
        assert curves.sms > 0 and curves.matmul_source and curves.attention_source and curves.bandwidth_source
        profile = datasheet_profile(hw)
        assert 0.3 < profile.matmul_efficiency < 1.0, hw.key
    assert SUSTAINED_OVER_BURST == pytest.approx(709.8 / 776.0)


def test_a_tiny_step_is_bound_by_its_launches_and_the_host():
    """The step of a 4-layer model on 8 tokens launches hundreds of kernels: it takes milliseconds, not the
    microseconds its FLOPs would."""
    spec, config = get_preset("bench-llama-tiny"), TrainConfig(seq_len=8)
    time = step_time(estimate(spec, config, "cuda"), H200, 1)
    assert time.launches > 150
    assert time.host_bound
    assert time.total_s >= time.launches * H200.kernel_gap_s
    assert time.total_s > 1e-3


def test_op_selective_at_micro_batch_1_is_host_bound_on_the_h200_and_micro_batch_8_is_not():
    rows = {(r["micro_batch"], r["recompute"]): r for r in h200_reference.train_steps()}
    profile = h200_reference.h200_profile()

    def timed(micro, policy):
        row = rows[micro, policy]
        spec = ModelSpec(**row["model_spec"])
        return step_time(estimate(spec, h200_reference.config_of(row), "cuda", row["accumulation_steps"]), profile,
                         row["accumulation_steps"])

    assert timed(1, "op-selective").host_bound
    assert not timed(8, "none").host_bound
    assert timed(1, "op-selective").by_term()["host"] > 0


def test_h200_steps_within_what_the_model_achieves():
    """Uncalibrated |predicted / measured - 1| median 5.3%, worst 14.4%; calibrated on the same steps (in-sample,
    |measured / (factor x predicted) - 1| as headroom.core.measured.calibration reports it) median 2.8%, worst 10.7%
    (docs/time-model.md)."""
    errors = sorted(abs(r.error) for r in validation.h200_rows())
    assert (errors[10] + errors[11]) / 2 <= 0.055 and errors[-1] <= 0.15
    raw = h200_reference.ratios(h200_reference.h200_profile())
    factor = h200_reference.calibration_of(h200_reference.h200_profile()).time.correction
    median, worst = h200_reference.summary([r / factor for r in raw])
    assert median <= 0.03 and worst <= 0.11
    predicted = [r.predicted for r in validation.h200_rows()]
    measured = [r.published for r in validation.h200_rows()]
    assert validation.spearman(predicted, measured) >= 0.99


def test_narayanan_runs_within_the_issues_targets():
    """Median 1.4%, worst 4.5% (targets 5% and 15%). Predicted slower than they ran: the 7.5B and 18.4B runs,
    whose gradient all-reduce Megatron-LM runs after backward (5% of their step), and the 529.6B and 1T runs,
    whose last stages (one or two blocks and the head) set the pipeline's pace."""
    rows = [r for r in validation.published_rows() if r.source.startswith("Narayanan")]
    assert len(rows) == 10
    errors = [abs(r.error) for r in rows]
    assert statistics.median(errors) <= 0.015 and max(errors) <= 0.046
    assert [r.name for r in rows if r.error < 0] == ["GPT 7.5B", "GPT 18.4B", "GPT 529.6B", "GPT 1008.0B"]


def test_llm_foundry_tables_within_what_the_model_achieves():
    """Median |error| per table: A100 80GB 7.9%, A100 40GB 9.9%; the H100 runs -2% to +48% (66 of 70 predicted
    faster than they ran: docs/time-model.md, the open gap), those of 16,384 tokens or more, where attention at
    half FlashAttention-2's H100 rate dominates, within 8%."""
    rows = [r for r in validation.published_rows() if r.source.startswith("llm-foundry")]
    by_table = {}
    for r in rows:
        by_table.setdefault(r.source.rsplit(", ", 1)[-1] if "128" not in r.source else ">= 128", []).append(r)
    assert {k: len(v) for k, v in by_table.items()} == {">= 128": 18, "H100 80GB BF16": 52, "A100 80GB": 61,
                                                        "A100 40GB": 78}
    assert statistics.median([abs(r.error) for r in by_table["A100 80GB"]]) <= 0.08
    assert statistics.median([abs(r.error) for r in by_table["A100 40GB"]]) <= 0.10
    h100 = by_table["H100 80GB BF16"] + by_table[">= 128"]
    assert min(r.error for r in h100) > -0.03 and max(r.error for r in h100) < 0.49
    assert sum(r.error > 0 for r in h100) == 66
    long = [r for r in h100 if int(r.name.split(", s ")[1].split(",")[0]) >= 16384]
    assert len(long) == 12 and max(abs(r.error) for r in long) < 0.08


def test_mpt_specs_have_the_parameters_the_benchmark_tables_count():
    """Every llm-foundry row's NumParams, exactly: GPT blocks with biases, LayerNorm with bias, a learned
    position table of the run's sequence length, tied embeddings."""
    rows = published_runs.foundry_rows()
    assert len(rows) == 209
    for row in rows:
        assert published_runs.mpt_spec(row.model, row.seq_len).parameters == row.num_params, row


def test_rank_correlation_within_each_models_sweep():
    """27 groups (one model in one table, 3-11 runs): median 0.91. The six >= 128-GPU H100 groups vary only the
    GPU count, whose scaling loss (4-8% from 128 to 512) the model does not predict: each is -1."""
    correlations = validation.group_rank_correlations(validation.published_rows())
    assert len(correlations) == 27
    assert statistics.median(list(correlations.values())) >= 0.9
    assert sorted(key[1] for key, rho in correlations.items() if rho < 0) == sorted(
        f"mpt-{m}" for m in ("1b", "3b", "7b", "13b", "30b", "70b"))


def test_the_docs_validation_table_is_what_the_model_predicts_now():
    docs = (Path(__file__).resolve().parent.parent / "docs" / "time-model.md").read_text()
    table = validation.markdown(validation.published_rows() + validation.h200_rows())
    assert table in docs


def test_narayanans_table_2_an_independent_check_as_the_docs_show_it():
    """Not a validation set, nothing fitted: PTD-P at three GPU counts of the 175B and the 530B within 1.6%, each
    model's throughput per GPU falling with the GPU count as measured. ZeRO-3, predicted 1.45x to 4.4x faster than
    it ran, is the model's gap that docs/time-model.md shows, row for row."""
    rows = [r for r in validation.independent_rows() if r.source == validation.NARAYANAN_TABLE_2]
    ptdp = [r for r in rows if ", PTD-P," in r.name]
    zero3 = [r for r in rows if ", ZeRO-3," in r.name]
    assert len(ptdp) == len(zero3) == 6
    assert max(abs(r.error) for r in ptdp) <= 0.016
    for model in ("174.6B", "529.6B"):
        predicted = [r.predicted for r in ptdp if model in r.name]
        assert predicted == sorted(predicted, reverse=True)
    docs = (Path(__file__).resolve().parent.parent / "docs" / "time-model.md").read_text()
    assert validation.markdown(rows) in docs


def test_torchtitans_a100_table_an_independent_check_as_the_docs_show_it():
    """Not a validation set, nothing fitted: torchtitan's six expressible rows of April 2024 on 64 A100s, every one
    predicted fast (12-26%), the run without recompute among them; the cost of per-op checkpointing on the same
    Llama 2 13B run followed within 0.03 of its published share (0.881 measured, 0.901 predicted)."""
    rows = [r for r in validation.independent_rows() if r.source == validation.TORCHTITAN_A100]
    assert len(rows) == 6
    assert all(0.10 < r.error < 0.30 for r in rows)
    by_name = {r.name: r for r in rows}
    none, op = by_name["Llama 2 13B, FSDP 64, none"], by_name["Llama 2 13B, FSDP 64, op-selective"]
    assert abs(op.predicted / none.predicted - op.published / none.published) < 0.03
    docs = (Path(__file__).resolve().parent.parent / "docs" / "time-model.md").read_text()
    assert validation.markdown(rows) in docs


def test_korthikantis_530b_an_independent_check_as_the_docs_show_it():
    """Not a validation set, nothing fitted: the 530B on 2,240 A100s at 54.2% MFU with sequence parallelism and
    selective recomputation, predicted within 2%; at 42.1% recomputing every layer, predicted 7-10% slow (as fast
    as Table 2's 2021 run of the same layout, within 1%), so the model's gain from selective recomputation, 1.38x,
    exceeds the measured 1.29x."""
    rows = {r.name: r for r in validation.independent_rows() if r.source == validation.KORTHIKANTI}
    selective, full = rows["GPT 529.6B, selective + SP, 2240 GPUs"], rows["GPT 529.6B, full recompute, 2240 GPUs"]
    assert (selective.published, full.published) == (0.542, 0.421)
    assert abs(selective.error) < 0.02
    assert -0.10 < full.error < -0.07
    assert 1.35 < selective.predicted / full.predicted < 1.40
    docs = (Path(__file__).resolve().parent.parent / "docs" / "time-model.md").read_text()
    assert validation.markdown(list(rows.values())) in docs


def test_the_h200_regret_is_zero_at_80_gb_and_at_the_tight_budget():
    """Planned on the H200's profile with the fragmentation its steps measured, overall and by policy (as a box's
    own profile takes them), the pick at 80 GB and at the tight budget is the fastest measured configuration
    that fit. With one fragmentation for every policy (1.052) the tight pick was micro-batch 2 under full
    recompute, faster, but 0.63 GB over the budget as it ran: full recompute fragments more (1.080)."""
    regrets = h200_reference.regrets(h200_reference.h200_profile())
    roomy, tight = regrets["80 GB"], regrets["30.775 GB (tight)"]
    assert roomy.regret == 0.0 and roomy.recommended == "micro 8 x accum 1, none"
    assert tight.regret == 0.0 and tight.recommended == "micro 2 x accum 4, every-2"
    single = dataclasses.replace(h200_reference.h200_profile(), fragmentation_by_policy={})
    missed = h200_reference.regrets(single)["30.775 GB (tight)"]
    assert missed.recommended == "micro 2 x accum 4, full" and missed.outcome == "over budget"


def test_mfu_counts_megatrons_model_and_hardware_flops():
    """Narayanan et al.'s Eq. 3 counts a step with full recompute, 96 B s l h^2 (1 + s / 6h + V / 16lh); without
    the recompute pass it is 72 B s l h^2 (1 + s / 6h) + 6 B s h V. Both exactly, for the 1.7B run."""
    run = RUNS[0]
    request = PlanRequest(spec=run.spec, train=run.config, global_batch=run.global_batch,
                          micro_batch=run.config.micro_batch, recompute=run.config.recompute)
    candidate = plan(request, datasheet_profile(get_hardware(run.hardware))).pinned
    b, s, l, h, v = run.global_batch, 2048, run.spec.n_layers, run.spec.hidden, run.spec.vocab_size
    use = candidate.utilization
    assert use.model_flops == 72 * b * s * l * h * h + 12 * b * s * s * l * h + 6 * b * s * h * v
    assert use.hardware_flops == 96 * b * s * l * h * h + 16 * b * s * s * l * h + 6 * b * s * h * v
    assert use.mfu == pytest.approx(use.model_flops / candidate.step_time_s / run.gpus / 312e12, rel=1e-12)
    assert use.hfu > use.mfu


def test_run_cost_is_steps_times_step_time():
    cost = RunCost(train_tokens=10**9, tokens_per_step=3 * 10**5, step_time_s=2.0, gpus=64, price_per_gpu_hour=2.5)
    assert cost.steps == 3334  # the last step whole
    assert cost.wall_s == 6668.0
    assert cost.gpu_hours == pytest.approx(6668.0 / 3600 * 64)
    assert cost.cost == pytest.approx(cost.gpu_hours * 2.5)
    assert RunCost(10**9, 3 * 10**5, 2.0, 64).cost is None


REQUEST = PlanRequest(spec=get_preset("llama3.2-1b"), train=TrainConfig(seq_len=2048), global_batch=8)


def test_a_pinned_configuration_is_reported_fitting_or_not():
    fits = plan(dataclasses.replace(REQUEST, micro_batch=2, recompute=parse_policy("full")), H200)
    assert [c.label for c in fits.candidates] == ["micro 2 x accum 4, full"] and fits.pinned is fits.recommendation
    over = plan(dataclasses.replace(REQUEST, accumulation=1, recompute=parse_policy("none"), budget_bytes=40 * GB),
                H200)
    assert over.recommendation is None and over.pinned.label == "micro 8 x accum 1, none"
    report = plan_to_dict(over)["pinned"]
    assert report["fits"] is False and report["over_budget_bytes"] == over.pinned.required_bytes - 40 * GB > 0
    assert report["step_time_s"] == over.pinned.step_time_s and report["utilization"]["mfu"] > 0


def test_a_plan_prices_a_run_given_its_tokens():
    result = plan(dataclasses.replace(REQUEST, train_tokens=10**10, gpu_hour_price=3.0), H200)
    run = plan_to_dict(result)["run"]
    best = result.recommendation
    assert run["steps"] == -(-10**10 // (8 * 2048))
    assert run["wall_s"] == run["steps"] * best.step_time_s and run["cost"] == pytest.approx(run["gpu_hours"] * 3.0)


@pytest.mark.parametrize(("changes", "message"), [
    ({"micro_batch": 3}, r"--micro-batch 3 does not divide the per-rank batch 8 \(global batch 8 / dp 1\); "
                         r"valid: 1, 2, 4, 8"),
    ({"micro_batch": 2, "accumulation": 2}, r"--micro-batch 2 x --accumulation 2 is 4 sequences per rank, not the "
                                            r"per-rank batch 8"),
    ({"accumulation": 0}, r"--accumulation must be a positive integer, got 0"),
    ({"train_tokens": -5}, r"--train-tokens must be a positive number of tokens up to 1e\+18, got -5"),
    ({"train_tokens": 10**40}, r"--train-tokens must be a positive number of tokens up to 1e\+18, got 10{40}"),
    ({"gpu_hour_price": 2.0}, r"--gpu-hour-price prices a run: give --train-tokens too"),
    ({"train_tokens": 10**12, "gpu_hour_price": 1e300}, r"--gpu-hour-price must be a number from 0 to 1e\+09, got "
                                                         r"1e\+300"),
    ({"train_tokens": 10**12, "gpu_hour_price": float("nan")}, r"--gpu-hour-price must be a number from 0 to 1e\+09"),
])
def test_bad_pins_name_the_value_and_what_would_do(changes, message):
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(REQUEST, **changes)


def test_a_pinned_policy_the_stack_lacks_is_refused():
    torchtitan = dataclasses.replace(REQUEST, train=TrainConfig(seq_len=2048, stack="torchtitan"))
    with pytest.raises(ConfigError, match="the torchtitan stack has no selective checkpointing"):
        dataclasses.replace(torchtitan, recompute=parse_policy("selective"))


def test_plan_cli_evaluates_a_pinned_configuration(headroom):
    out = headroom("plan", "--model", "llama3.2-1b", "--global-batch", "8", "--hardware", "h200", "--micro-batch",
                   "8", "--recompute", "none", "--budget", "40GB", "--train-tokens", "1000000000")
    assert out.returncode == 3, out.stderr
    assert "pinned: tp 1, pp 1, cp 1, dp 1, zero 0; micro 8 x accum 1, none: does not fit: needs" in out.stdout
    assert "MFU" in out.stdout and "host" in out.stdout and "GPU-hours" in out.stdout
    report = json.loads(headroom("plan", "--model", "llama3.2-1b", "--global-batch", "8", "--hardware", "h200",
                                 "--accumulation", "4", "--recompute", "full", "--json").stdout)
    assert report["pinned"]["fits"] and report["recommendation"]["micro_batch"] == 2
    assert {"compute_s", "host_s", "host_bound", "utilization"} <= set(report["recommendation"])


def test_estimate_cli_prints_the_time_on_a_device(headroom):
    out = headroom("estimate", "--model", "llama3.2-1b", "--hardware", "h200", "--json")
    assert out.returncode == 0, out.stderr
    time = json.loads(out.stdout)["time"]
    assert time["step_time_s"] == pytest.approx(sum(time["time_s"].values()))
    assert time["utilization"]["mfu"] > 0 and time["compute_s"] > 0 and time["host_s"] > 0


def test_selective_reruns_the_attention_core_and_nothing_else():
    """Under the explicit attention, selective checkpointing reruns QK^T, the softmax and dropout (the share of the
    core's FLOPs torch's early stop reruns); the fused kernel reruns whole. Either way less than half a block."""
    for attention, dropout in (("standard", 0.1), ("flash", 0.0)):
        config = TrainConfig(seq_len=1024, micro_batch=2, attention=attention, dropout=dropout,
                             recompute=parse_policy("selective"))
        spec = get_preset("gpt2-xl")
        time = step_time(estimate(spec, config, "cuda"), H200, 1)
        full = step_time(estimate(spec, dataclasses.replace(config, recompute=parse_policy("full")), "cuda"), H200, 1)
        assert 0 < time.recompute_s < full.recompute_s / 2, attention


def test_fsdp_copies_its_units_in_and_out_of_the_collectives_buffers():
    """Under ZeRO-3 over 2 ranks each micro-batch's forward copies every parameter's shard into the all-gather's
    buffer and the gathered parameters out of it (read and written: 2 P b (1 + 1/2) bytes, b the compute dtype's),
    backward the same again and the gradients into and out of the reduce-scatter's (the reduction's dtype). The
    rest of the step is ZeRO-2's."""
    from headroom.core.specs.interconnect import default_cluster

    spec = get_preset("bench-llama-small")
    sharded = TrainConfig(seq_len=128, micro_batch=2, precision="bf16-pure", layout=Layout(dp=2, zero=3))
    cluster = default_cluster("h200")
    three, two = (step_time(estimate(spec, config, "cuda"), H200, 1, cluster)
                  for config in (sharded, dataclasses.replace(sharded, layout=Layout(dp=2, zero=2))))
    gather = 2 * spec.parameters * 2 * 1.5 / H200.hbm_bytes_per_s
    reduce = 2 * spec.parameters * 2 * 1.5 / H200.hbm_bytes_per_s  # bf16-pure reduces in bf16
    assert three.forward_s - two.forward_s == pytest.approx(gather, rel=1e-9)
    assert three.backward_s - two.backward_s == pytest.approx(gather + reduce, rel=1e-9)


def test_the_h100_runs_fall_short_of_the_a100_ones_alike_at_every_sequence_as_the_docs_show():
    """llm-foundry's configurations run on both the H100 and the A100 80GB: the model's speed-up of the one over the
    other is a flat ~15% too high, where attention dominates (16,384 tokens or more) as much as where it does not:
    the H100's gap is the device's, not one kind of work's. Nothing fitted; the docs print the line."""
    rows = validation.published_rows()
    pairs = validation.device_pairs(rows)
    assert len(pairs.ratios) == 37
    assert 0.80 <= statistics.median(pairs.ratios) <= 0.90
    docs = (Path(__file__).resolve().parent.parent / "docs" / "time-model.md").read_text()
    assert pairs.text() in docs
