"""Transformer Engine's MXFP8 on the megatron stack (``--fp8 te-mxfp8``: Megatron-LM's ``--fp8-format e4m3
--fp8-recipe mxfp8``, headroom.core.specs.float8): current scaling's fp8 copies, each with its e8m0 scales, one pass
a cast, no amax all-reduced, Blackwell only.

Transformer Engine does not run on a CPU: the bytes here are worked by hand from its source
(transformer_engine/pytorch/tensor/mxfp8_tensor.py, ``MXFP8Quantizer.get_scale_shape``: row-wise scales
[rows to 128, cols / 32 to 4], column-wise [rows / 32 to 4, cols to 128], a byte each), independently of the
ledger's code."""

from __future__ import annotations

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

SPEC = get_preset("llama3-8b")
B200 = datasheet_profile(HARDWARE_BY_KEY["b200"])
S, TP = 8192, 2


def _config(fp8="te-mxfp8", sp=False, policy="none", layout=None, **changes):
    return TrainConfig(seq_len=S, micro_batch=1, precision="bf16-master", stack="megatron", fp8=fp8,
                       recompute=parse_policy(policy), layout=layout or Layout(tp=TP, sp=sp), **changes)


def _column_scales(rows: int, cols: int) -> int:
    return -(-(rows // 32) // 4) * 4 * -(-cols // 128) * 128


def _both_scales(rows: int, cols: int) -> int:
    return -(-rows // 128) * 128 * -(-(cols // 32) // 4) * 4 + _column_scales(rows, cols)


@pytest.mark.parametrize("sp", [False, True])
def test_a_block_keeps_current_scalings_fp8_copies_and_their_column_wise_scales(sp):
    """Llama 3 8B at 8,192 tokens over 2 tensor-parallel ranks: the same fp8 copies as current scaling (q/k/v's and
    fc1's input, the sharded s / tp rows of it under sequence parallelism, kept column-wise and gathered so in
    backward; the attention output's; the SwiGLU output's), each with a column-wise scale a block of 32 rows."""
    rows = S // TP if sp else S
    scales = 2 * _column_scales(rows, SPEC.hidden) + _column_scales(S, SPEC.q_dim // TP) \
        + _column_scales(S, SPEC.ffn_hidden // TP)
    mx, current = (estimate(SPEC, _config(fp8=f, sp=sp), "cuda").ledger.per_layer_bytes
                   for f in ("te-mxfp8", "te-current"))
    assert mx - current == scales


def test_the_cached_weights_carry_both_copies_scales():
    """Two bytes a weight element (its row- and column-wise copies) and each copy's scales, for the four linears
    of each block on the rank: q/k/v (6,144 x 4,096 over tp 2), the attention's output, fc1 and fc2."""
    h, f = SPEC.hidden, SPEC.ffn_hidden
    shapes = (((SPEC.q_dim + 2 * SPEC.kv_dim) // TP, h), (h, SPEC.q_dim // TP), (2 * f // TP, h), (h, f // TP))
    mx, current = (estimate(SPEC, _config(fp8=fp8), "cuda").static.fp8_weights for fp8 in ("te-mxfp8", "te-current"))
    assert mx - current == SPEC.n_layers * sum(_both_scales(rows, cols) for rows, cols in shapes)


def test_a_cast_reads_its_tensor_once_and_no_amax_is_reduced():
    """Current scaling reads a tensor twice to cast it (its amax first) and all-reduces two amaxes a block under
    sequence parallelism; MXFP8's amaxes are its blocks': one read, nothing reduced."""
    ops = {f: {op.name: op for op in forward_ops(SPEC, _config(fp8=f), "cuda", 1).dense_block}
           for f in ("te-mxfp8", "te-current")}
    mx, current = ops["te-mxfp8"]["block.attn_norm.out_fp8"], ops["te-current"]["block.attn_norm.out_fp8"]
    assert (current.read_bytes, mx.read_bytes) == (2 * S * SPEC.hidden * 2, S * SPEC.hidden * 2)
    assert mx.bytes - current.bytes == _both_scales(S, SPEC.hidden)
    cluster = default_cluster("b200")

    def amaxes(fp8: str) -> int:
        return sum(t.calls for t in step_communication(SPEC, _config(fp8=fp8, sp=True), 1, cluster)
                   if t.op == "all_reduce" and t.message_bytes == 4)

    assert (amaxes("te-current"), amaxes("te-mxfp8")) == (2 * SPEC.n_layers, 0)


def test_it_runs_where_blackwell_runs_it_and_is_refused_elsewhere(run_cli):
    """A B200 plans it (tensor parallelism and bf16 end blocks included, as Megatron-LM runs them); an H100 has
    no MXFP8 tensor cores; rows that do not divide by 32 are refused by name; Megatron's export names its format
    and recipe, and with MXFP8 parameters the gradient buffer their bf16 gather reuses."""
    config = _config(sp=True, first_last_bf16=True)
    assert step_time(estimate(SPEC, config, "cuda", 8), B200, 8, default_cluster("b200")).total_s > 0
    with pytest.raises(ConfigError, match=r"need each linear's input width to divide by 32 and its rows by 32, and "
                                          r"its row count 8,200 does not \(MXFP8Quantizer.is_quantizable\)"):
        TrainConfig(seq_len=8200, precision="bf16-master", stack="megatron", fp8="te-mxfp8").check_model(SPEC)
    flags = ("plan", "--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "8", "--stack", "megatron",
             "--precision", "bf16-master", "--fp8", "te-mxfp8", "--micro-batch", "1", "--recompute", "full",
             "--budget", "180GB")
    refused = run_cli(*flags, "--hardware", "h100-sxm")
    assert refused.returncode == 2 and "it has no MXFP8 tensor cores (Blackwell)" in refused.stderr
    exported = run_cli(*flags, "--hardware", "b200", "--export", "megatron")
    assert exported.returncode == 0, exported.stderr
    assert "--fp8-format e4m3 --fp8-recipe mxfp8" in exported.stdout
    gathered = run_cli(*flags, "--hardware", "b200", "--fp8-param-gather", "on", "--export", "megatron")
    assert gathered.returncode == 0, gathered.stderr
    assert "--fp8-recipe mxfp8 --fp8-param-gather --reuse-grad-buf-for-mxfp8-param-ag" in gathered.stdout


def test_mxfp8_parameters_are_the_cached_copies_gathered_in_bf16():
    """Megatron-LM's MXFP8 parameters (--fp8-param-gather --reuse-grad-buf-for-mxfp8-param-ag): each block weight
    is its two fp8 copies and their scales, with no 16-bit parameter beside them (distributed/param_and_grad_buffer:
    "param buffer is not mapped to model params for MXFP8"); the updated shard is gathered in bf16 into the
    gradient buffer and cast after, so the data-parallel gather moves 16-bit weights, as without fp8 parameters."""
    layout = Layout(dp=2, zero=1)
    held, cached = (estimate(SPEC, _config(layout=layout, fp8_param_gather=on), "cuda").static for on in (True, False))
    h, f = SPEC.hidden, SPEC.ffn_hidden
    weights = SPEC.n_layers * (h * (SPEC.q_dim + 2 * SPEC.kv_dim) + SPEC.q_dim * h + 2 * h * f + f * h)
    assert cached.parameters - held.parameters == 2 * weights
    assert held.fp8_weights == cached.fp8_weights
    cluster = default_cluster("b200")

    def gathers(on: bool) -> list[tuple[int, int]]:
        return [(t.message_bytes, t.calls) for t in step_communication(SPEC, _config(layout=layout, fp8_param_gather=on),
                                                                       1, cluster)
                if t.axis == "dp" and t.op == "all_gather"]

    assert gathers(True) == gathers(False)


def test_a_search_of_recipes_tries_it_on_blackwell_alone(plan_json):
    flags = ("--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "16", "--gpus", "8", "--stack",
             "megatron", "--precision", "bf16-master", "--fp8", "auto")
    plans = {hw: plan_json(*flags, "--hardware", hw) for hw in ("b200", "h100-sxm")}
    tried = {hw: {c["fp8"] for c in plan["candidates"] + plan["rejected"]} for hw, plan in plans.items()}
    assert tried == {"b200": {"off", "te-delayed", "te-current", "te-mxfp8"},
                     "h100-sxm": {"off", "te-delayed", "te-current"}}
