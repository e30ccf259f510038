"""Megatron-LM's ``--first-last-layers-bf16`` under Transformer Engine's current scaling
(headroom.core.specs.config.TrainConfig.first_last_bf16): the model's first and last blocks run outside the FP8
recipe, so each of them keeps, costs, casts, caches and gathers what the same block keeps without the recipe, and
every other block what it keeps under it. The checks compose the two configurations the ledger already accounts
for (tests/test_te_fp8.py works the fp8 block by hand from Transformer Engine's source)."""

from __future__ import annotations

import dataclasses

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import estimate
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import HARDWARE_BY_KEY
from headroom.core.specs.interconnect import default_cluster
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.specs.run_config import RunConfig
from headroom.core.timing.comm import step_communication
from headroom.core.timing.step import datasheet_profile, step_time
from headroom.core.timing.step_ops import forward_ops

SPEC = get_preset("llama3-8b")
H100 = datasheet_profile(HARDWARE_BY_KEY["h100-sxm"])
N = SPEC.n_layers
TP_SP = Layout(tp=2, sp=True)


def _config(fp8="te-current", first_last=False, layout=TP_SP, **changes):
    return TrainConfig(seq_len=4096, precision="bf16-master", stack="megatron", fp8=fp8, first_last_bf16=first_last,
                       layout=layout, **changes)


@pytest.mark.parametrize("fp8", ["te-delayed", "off"])
def test_it_is_current_scalings_alone(fp8):
    with pytest.raises(ConfigError, match=f"^--first-last-layers-bf16 keeps .* and --fp8 is {fp8}: use --fp8 te-current"):
        _config(fp8=fp8, first_last=True)


def test_the_end_stages_hold_the_bf16_blocks():
    config = _config(first_last=True)
    assert [config.bf16_blocks(n, first, last) for n, first, last in
            ((32, True, True), (10, True, False), (10, False, False), (10, False, True), (1, True, True))] == \
        [2, 1, 0, 1, 1]
    assert _config().bf16_blocks(32, True, True) == 0


def _saved(fp8: str, first_last: bool, **changes) -> int:
    return estimate(SPEC, _config(fp8=fp8, first_last=first_last, **changes), "cuda").ledger.saved_bytes


@pytest.mark.parametrize("policy", ["none", "selective"])
def test_two_blocks_keep_what_bf16_keeps_and_the_rest_what_fp8_keeps(policy):
    """One rank of the whole model: the two end blocks change from the recipe's to bf16's, the other 30 and the
    embedding, head and loss stay; so the change is 2/32 of the whole model's change to bf16."""
    fp8, mixed, bf16 = (_saved(f, first_last, recompute=parse_policy(policy))
                        for f, first_last in (("te-current", False), ("te-current", True), ("off", False)))
    assert (bf16 - fp8) % N == 0 and mixed - fp8 == 2 * (bf16 - fp8) // N != 0


def test_a_pipelines_end_stages_hold_one_bf16_block_each_and_the_middle_none():
    layout = Layout(tp=2, sp=True, pp=4)
    ranks = [{r.rank.name: r.ledger.saved_bytes for r in estimate(SPEC, _config(first_last=first_last, layout=layout),
                                                                   "cuda", 8).ranks}
             for first_last in (False, True)]
    block = estimate(SPEC, _config(fp8="off", layout=layout), "cuda", 8).ledger.per_layer_bytes \
        - estimate(SPEC, _config(layout=layout), "cuda", 8).ledger.per_layer_bytes
    assert {name: ranks[1][name] - ranks[0][name] for name in ranks[0]} == {
        "first stage": block, "middle stage": 0, "last stage": block}


def test_the_bf16_blocks_cache_no_fp8_weights_and_hold_their_weights_in_bf16():
    """fp8 weight copies (and scaling state) for 30 of 32 blocks; under fp8 parameters the two end blocks' weights
    are bf16 parameters (two bytes an element, not one)."""
    plain, mixed = (estimate(SPEC, _config(first_last=f, layout=Layout(tp=2, sp=True)), "cuda").static
                    for f in (False, True))
    assert mixed.fp8_weights * N == plain.fp8_weights * (N - 2)
    gathered = {f: estimate(SPEC, _config(first_last=f, fp8_param_gather=True, layout=Layout(tp=2, sp=True, dp=2,
                                                                                                zero=1)),
                            "cuda").static for f in (False, True)}
    weights = plain.fp8_weights // 2 // N  # one block's Transformer Engine weight elements on the rank
    assert gathered[True].parameters - gathered[False].parameters == 2 * weights  # a byte more an element, 2 blocks
    assert gathered[True].fp8_weights * N == gathered[False].fp8_weights * (N - 2)


def test_the_end_blocks_run_bf16_gemms_and_no_casts():
    ops = forward_ops(SPEC, _config(first_last=True), "cuda", N)
    counts = {len(block): n for block, n in ops.blocks}
    bf16 = forward_ops(SPEC, _config(fp8="off"), "cuda", 1).dense_block
    fp8 = forward_ops(SPEC, _config(), "cuda", 1).dense_block
    assert ops.bf16_block == bf16 and counts == {len(fp8): N - 2, len(bf16): 2}
    assert {op.dtype for op in ops.bf16_block if op.kind == "gemm"} == {"bf16"}
    assert ops.backward_only == (N - 2) * sum(op.backward_only for op in fp8)


def test_a_step_costs_two_blocks_bf16_time_over_fp8s():
    """On one rank: the micro-batch's device time grows by two blocks' bf16 time less their fp8 time, and the weight
    casts of the optimizer's step shrink to 30 blocks'."""
    cluster = default_cluster("h100-sxm")
    times = {f: step_time(estimate(SPEC, _config(first_last=f), "cuda"), H100, 1, cluster) for f in (False, True)}
    blocks = {f: H100.price(forward_ops(SPEC, _config(fp8=f), "cuda", 1).dense_block) for f in ("off", "te-current")}
    per_block = {f: t.forward_s + t.backward_s for f, t in blocks.items()}
    assert times[True].device_s - times[False].device_s == pytest.approx(
        2 * (per_block["off"] - per_block["te-current"]), rel=1e-9)
    assert times[True].optimizer_s < times[False].optimizer_s


def test_current_scalings_amax_reductions_and_fp8_gathers_skip_the_bf16_blocks():
    """Under sequence parallelism each block gathers its two norms' outputs forward and again backward (Megatron's
    re-gather for the weight gradients), one byte an element under the recipe, two in the bf16 blocks; current
    scaling all-reduces two amaxes a block under the recipe and none in the bf16 ones."""
    cluster = default_cluster("h100-sxm")
    tokens = 4096 * SPEC.hidden  # a gathered norm output: the whole sequence

    def calls(first_last: bool) -> dict[tuple[str, int], int]:
        found: dict[tuple[str, int], int] = {}
        for t in step_communication(SPEC, _config(first_last=first_last), 1, cluster):
            found[t.op, t.message_bytes] = found.get((t.op, t.message_bytes), 0) + t.calls
        return found

    plain, mixed = calls(False), calls(True)
    assert plain[("all_gather", tokens)] - mixed[("all_gather", tokens)] == 2 * (2 + 2)  # 2 blocks, fwd + bwd
    assert mixed[("all_gather", 2 * tokens)] - plain[("all_gather", 2 * tokens)] == 2 * (2 + 2)
    assert plain[("all_reduce", 4)] - mixed[("all_reduce", 4)] == 2 * 2  # fp32 amaxes, two a block


def test_it_travels_in_the_run_configuration_the_plan_and_the_megatron_export(run_cli, plan_json):
    run = RunConfig(train=_config(first_last=True))
    assert run.to_dict()["first_last_bf16"] is True and RunConfig.from_dict(run.to_dict()) == run
    assert "first_last_bf16" not in RunConfig(train=_config()).to_dict()
    flags = ("--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "8", "--hardware", "h100-sxm",
             "--stack", "megatron", "--precision", "bf16-master", "--fp8", "te-current", "--first-last-layers-bf16",
             "on", "--tp", "2", "--sp", "on", "--micro-batch", "1", "--recompute", "none", "--budget", "200GB")
    plan = plan_json(*flags)
    assert plan["request"]["first_last_bf16"] is True
    exported = run_cli("plan", *flags, "--export", "megatron")
    assert exported.returncode == 0, exported.stderr
    assert ("--first-last-layers-bf16 --num-layers-at-start-in-bf16 1 --num-layers-at-end-in-bf16 1"
            in exported.stdout)
    refused = run_cli("plan", *flags[:12], "--fp8", "te-delayed", "--first-last-layers-bf16", "on")
    assert refused.returncode == 2 and "megatron-core refuses it under delayed scaling" in refused.stderr


def test_the_floor_stays_under_the_step_with_bf16_end_blocks():
    from headroom.core.timing.step import step_floor_s

    for layout in (Layout(tp=2, sp=True), Layout(tp=2, sp=True, pp=4),
                   Layout(tp=2, sp=True, pp=4, schedule="interleaved", virtual_stages=2)):
        config = dataclasses.replace(_config(first_last=True), layout=layout)
        est = estimate(SPEC, config, "cuda", 8)
        total = step_time(est, H100, 8, default_cluster("h100-sxm")).total_s
        assert 0 < step_floor_s(SPEC, config, H100, 8) <= total


def test_a_search_of_fp8_recipes_is_refused_beside_it(run_cli):
    from headroom.dashboard.planning import PlanInputs, plan_ask

    refused = run_cli("plan", "--model", "llama3-8b", "--stack", "megatron", "--precision", "bf16-master", "--fp8",
                      "auto", "--first-last-layers-bf16", "on", "--global-batch", "8")
    assert refused.returncode == 2 and "applies to --fp8 te-current and te-mxfp8 alone" in refused.stderr
    with pytest.raises(ConfigError, match="apply to the te-current and te-mxfp8 recipes alone"):
        plan_ask(PlanInputs(stack="megatron", precision="bf16-master", fp8="auto", first_last_bf16=True))
