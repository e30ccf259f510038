"""Expert parallelism: the routed experts split over ep of the dp x cp ranks, tokens moved by all-to-all.

Worked by hand on Mixtral 8x7B (32 blocks, h 4,096, 8 experts of ffn 14,336, top-2,
46,702,792,704 parameters): one block's routed experts are 8 x 3 x 4,096 x 14,336 =
1,409,286,144 parameters, 45,097,156,608 over the 32 blocks, and everything else is
46,702,792,704 - 45,097,156,608 = 1,605,636,096.
"""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import estimate
from headroom.core.memory.flops import step_flops
from headroom.core.planning.advice import plan_and_advise
from headroom.core.planning.layout_search import candidate_layouts
from headroom.core.planning.planner import PlanRequest, plan
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.interconnect import Cluster, Link
from headroom.core.specs.layout import Layout
from headroom.core.specs.precision import get_precision
from headroom.core.specs.presets import get_preset, resolve_model
from headroom.core.specs.recompute import RecomputePolicy
from headroom.core.timing.comm import step_communication
from headroom.core.timing.step import datasheet_profile
from headroom.core.timing.step_ops import forward_ops

MIXTRAL = get_preset("mixtral-8x7b")
BLOCK_EXPERTS = 8 * 3 * 4_096 * 14_336
EXPERTS = 32 * BLOCK_EXPERTS
REST = 46_702_792_704 - EXPERTS
LINK = Link(key="ideal", name="450 GB/s, no latency", bytes_per_s=450e9, latency_s=0.0, source="test")
NODE = Cluster(gpus_per_node=8, intra=LINK, inter=LINK)


def mixtral(micro_batch: int = 1, recompute: str = "none", precision: str = "amp-bf16", stack: str = "reference",
            **layout) -> TrainConfig:
    return TrainConfig(seq_len=4096, micro_batch=micro_batch, precision=precision, stack=stack,
                       recompute=RecomputePolicy(recompute), layout=Layout(**layout))


def test_the_worked_numbers_are_mixtrals():
    assert EXPERTS == 45_097_156_608 and REST == 1_605_636_096
    assert MIXTRAL.parameters == 46_702_792_704


# ---- what a layout may say ---------------------------------------------------------------------------------


def test_ep_borrows_data_and_context_parallel_ranks():
    assert Layout(dp=4, cp=2, ep=8).world == 8  # ep adds no ranks
    assert Layout(dp=8, ep=2).expert_data_parallel == 4
    assert str(Layout(dp=8, zero=3, ep=4)) == "tp 1, pp 1, cp 1, dp 8, zero 3, ep 4"
    assert str(Layout(dp=8, zero=3)) == "tp 1, pp 1, cp 1, dp 8, zero 3"
    with pytest.raises(ConfigError, match=r"^ep 8 does not divide dp x cp = 4: expert-parallel ranks are data- or "
                                          r"context-parallel ranks that split the experts; use --ep among 1, 2, 4$"):
        Layout(dp=4, ep=8)
    with pytest.raises(ConfigError, match=r"^ep must be a positive integer, got 0$"):
        Layout(ep=0)


def test_ep_is_refused_for_a_dense_model_and_for_experts_it_does_not_divide():
    with pytest.raises(ConfigError, match=r"^llama3-8b: ep 2 splits a mixture of experts' routed experts over ranks, "
                                          r"and this model has none: use ep 1$"):
        estimate(get_preset("llama3-8b"), TrainConfig(seq_len=4096, layout=Layout(dp=2, ep=2)))
    with pytest.raises(ConfigError, match=r"^mixtral-8x7b: its 8 routed experts do not split over ep 3; "
                                          r"use --ep among 1, 2, 4, 8$"):
        estimate(MIXTRAL, mixtral(dp=3, ep=3))


# ---- memory ------------------------------------------------------------------------------------------------


def test_each_rank_holds_its_share_of_the_experts_and_all_of_the_rest():
    amp = get_precision("amp-bf16")
    replicated = estimate(MIXTRAL, mixtral(dp=8, zero=1, stack="megatron")).static
    split = estimate(MIXTRAL, mixtral(dp=8, zero=1, ep=8, stack="megatron")).static
    assert replicated.parameters == (REST + EXPERTS) * amp.param_bytes
    assert split.parameters == (REST + EXPERTS // 8) * amp.param_bytes
    assert split.gradients == (REST + EXPERTS // 8) * amp.grad_bytes
    # Megatron-LM's distributed optimizer shards the rest's optimizer state evenly over all 8 ranks; each expert is
    # on one rank only (ep = dp). (Plain PyTorch's keeps tensors whole: tests/test_parallel_memory.py.)
    assert split.optimizer_states == (REST // 8 + EXPERTS // 8) * 8


def test_experts_are_sharded_over_the_ranks_that_hold_the_same_experts():
    """ep 2 of dp 8: each rank's half of the experts is sharded over the 4 ranks that hold that half."""
    sharded = estimate(MIXTRAL, mixtral(dp=8, zero=2, ep=2, stack="megatron")).static
    amp = get_precision("amp-bf16")
    assert sharded.parameters == (REST + EXPERTS // 2) * amp.param_bytes
    assert sharded.gradients == (REST // 8 + EXPERTS // 2 // 4) * amp.grad_bytes
    assert sharded.optimizer_states == (REST // 8 + EXPERTS // 2 // 4) * 8


def test_fsdp_gathers_only_the_ranks_own_experts():
    """Under ZeRO-3 a Mixtral block unit is attention 4,096 x (4,096 + 2 x 1,024) + 4,096 x 4,096, two norms,
    the router (8 x 4,096) and the rank's experts: gathered in bf16, two units at a time in forward."""
    block = 4_096 * 6_144 + 4_096 * 4_096 + 2 * 4_096 + 8 * 4_096
    for ep in (1, 8):
        unit = block + BLOCK_EXPERTS // ep
        assert estimate(MIXTRAL, mixtral(dp=8, zero=3, ep=ep)).gathered_parameter_bytes[0] == 2 * 2 * unit


def test_activations_and_flops_do_not_change_with_ep():
    """With balanced routing a rank receives as many routed rows as it sends: the same tensors, the same FLOPs."""
    plain, split = (estimate(MIXTRAL, mixtral(dp=8, zero=1, ep=ep)) for ep in (1, 8))
    assert step_flops(MIXTRAL, plain.config) == step_flops(MIXTRAL, split.config)
    assert plain.ledger.saved_bytes == split.ledger.saved_bytes
    # Autocast's bf16 copies of the weights backward needs: only the rank's own experts'.
    assert plain.ledger.parameter_copy_bytes - split.ledger.parameter_copy_bytes == 32 * 2 * (BLOCK_EXPERTS * 7 // 8)


# ---- communication -----------------------------------------------------------------------------------------


def terms(config: TrainConfig, m: int = 1) -> dict[tuple[str, str], list]:
    out: dict[tuple[str, str], list] = {}
    for term in step_communication(MIXTRAL, config, m, NODE, efficiency=1.0):
        out.setdefault((term.axis, term.op), []).append(term)
    return out


def test_tokens_go_to_their_experts_and_back_by_all_to_all():
    """Per expert block and micro-batch: dispatch and combine forward, their gradients backward; each moves
    the rank's b x s x k routed rows of h bf16 values: 1 x 4,096 x 2 x 4,096 x 2 = 64 MiB."""
    (a2a,) = terms(mixtral(dp=8, zero=3, ep=8), m=2)[("ep", "all_to_all")]
    assert (a2a.message_bytes, a2a.calls, a2a.group_size) == (64 * 2**20, 2 * 32 * 4, 8)
    assert a2a.seconds == pytest.approx(a2a.calls * 64 * 2**20 * 7 / 8 / 450e9)
    assert not a2a.overlappable and a2a.link_key == "ideal"
    (again,) = terms(mixtral(dp=8, zero=3, ep=8, recompute="full"))[("ep", "all_to_all")]
    assert again.calls == 32 * 6  # block recompute runs dispatch and combine again
    assert ("ep", "all_to_all") not in terms(mixtral(dp=8, zero=3))


def test_under_autocast_the_routed_rows_move_in_fp32():
    """Without ZeRO-3 an amp-bf16 model's residual stream is fp32, and torchtitan's experts cast their output back
    to their input's dtype: dispatch and combine both move 1 x 4,096 x 2 x 4,096 x 4 bytes = 128 MiB."""
    (a2a,) = terms(mixtral(dp=8, zero=1, ep=8))[("ep", "all_to_all")]
    assert a2a.message_bytes == 128 * 2**20
    (pure,) = terms(mixtral(dp=8, zero=1, ep=8, precision="bf16-pure"))[("ep", "all_to_all")]
    assert pure.message_bytes == 64 * 2**20


def _measured_config(precision: str, policy: str, stack: str) -> TrainConfig:
    from tests.distributed import expert_parallel

    train = expert_parallel.config(precision, policy, stack)
    return dataclasses.replace(train, layout=Layout(dp=2, ep=2))


@pytest.mark.parametrize("precision", ["bf16-pure", "amp-bf16"])
@pytest.mark.parametrize("stack", ["reference", "torchtitan"])
@pytest.mark.parametrize("policy", ["none", "full"])
def test_core_counts_each_all_to_all_of_an_expert_parallel_step(two_ranks, precision, stack, policy):
    """Two gloo ranks, each with 2 of 4 experts in each of 2 blocks, each training its own 2 x 32 tokens
    (tests/distributed/expert_parallel.py, torchtitan's all-to-all dispatcher): every all-to-all of the step,
    as torch's profiler saw it, is headroom.core.timing.comm's. Each rank runs the core's count; what it sends is its t k rows
    (dispatch forward, the combine's gradient backward), what it sends back is what it received, which the
    routing decides, so the ranks' bytes add up to ep times the core's message; forward, each dispatch is
    exactly the core's message. A recompute runs both forward ones again, early stop or not: the combine's
    output is scaled by the routing weights, which keeps it."""
    from tests.distributed import expert_parallel
    from tests.distributed.collectives import ELEMENT_BYTES, messages

    spec = expert_parallel.SPEC
    (term,) = [t for t in step_communication(spec, _measured_config(precision, policy, stack), 1, NODE)
               if t.axis == "ep"]
    total = 0
    for record in two_ranks:
        collectives = record["expert_parallel"][expert_parallel.case_name(precision, stack, policy)]
        calls = messages(collectives, 2)
        assert set(op for op, _ in calls) == {"all_to_all"}
        assert sum(calls.values()) == term.calls
        total += sum(size * n for (_, size), n in calls.items())
        dispatches = collectives["forward"]["functional"][::2]
        assert [math.prod(shape) * ELEMENT_BYTES[dtype] for _, shape, dtype in dispatches] == \
            [term.message_bytes] * spec.moe_layers
    assert total == 2 * term.calls * term.message_bytes


def test_expert_weights_are_reduced_over_the_ranks_that_hold_them():
    """dp 8, ep 2, ZeRO-1 as Megatron-LM's distributed optimizer runs it: the rest's gradients reduce-scattered over
    8 ranks, the rank's half of the experts' over the 4 ranks that hold the same half (its expert data-parallel
    group), each in its buckets (the average bucket a call); each then all-gathers its updated parameters."""
    def reductions(config: TrainConfig) -> list:
        return terms(config)[("dp", "reduce_scatter")]

    rest, experts = reductions(mixtral(dp=8, zero=1, ep=2, stack="megatron"))
    assert rest.group_size == 8 and rest.message_bytes * rest.calls - REST * 4 in range(rest.calls)
    assert experts.group_size == 4 and experts.message_bytes * experts.calls - EXPERTS // 2 * 4 in range(experts.calls)
    assert "(the experts' weights)" in experts.note and "dp x cp / ep = 4" in experts.note
    assert {t.group_size for t in terms(mixtral(dp=8, zero=1, ep=2, stack="megatron"))[("dp", "all_gather")]} == {8, 4}
    # ep = dp: no two ranks hold the same experts, so their gradients need no reduction at all.
    (only,) = reductions(mixtral(dp=8, zero=1, ep=8, stack="megatron"))
    assert only.group_size == 8 and only.message_bytes * only.calls - REST * 4 in range(only.calls)


def test_deepspeeds_zero_1_and_2_refuse_transformers_experts():
    """DeepSpeed builds expert groups for its own deepspeed.moe layers only: the hf stack's ZeRO-1 and 2 with ep
    above 1 are refused by name, and the search tries them at ZeRO-0 and 3 alone."""
    for zero in (1, 2):
        with pytest.raises(ConfigError, match=f"--ep 2 under --stack hf --zero {zero}: its ZeRO-{zero} is DeepSpeed's"):
            mixtral(dp=8, zero=zero, ep=2, stack="hf").check_sharding()
    layouts = candidate_layouts(MIXTRAL, TrainConfig(seq_len=4096, stack="hf"), 64, 16, 8, frozenset())
    assert {layout.zero for layout in layouts if layout.ep > 1} == {0, 3}
    assert {layout.zero for layout in layouts if layout.ep == 1} == {0, 1, 2, 3}


def test_an_ep_group_that_leaves_the_node_runs_at_the_nic():
    slow = Link(key="nic", name="50 GB/s", bytes_per_s=50e9, latency_s=0.0, source="test")
    two_per_node = Cluster(gpus_per_node=2, intra=LINK, inter=slow)
    inside = step_communication(MIXTRAL, mixtral(dp=8, zero=3, ep=2), 1, two_per_node)
    across = step_communication(MIXTRAL, mixtral(dp=8, zero=3, ep=4), 1, two_per_node)
    assert {t.link_key for t in inside if t.axis == "ep"} == {"ideal"}
    assert {t.link_key for t in across if t.axis == "ep"} == {"nic"}


# ---- the search --------------------------------------------------------------------------------------------


def test_the_search_tries_every_ep_that_divides_the_experts():
    request = TrainConfig(seq_len=4096)
    layouts = candidate_layouts(MIXTRAL, request, 64, 16, 8, frozenset())
    assert {layout.ep for layout in layouts} == {1, 2, 4, 8}  # 16 divides dp x cp, 8 experts do not split 16 ways
    assert {layout.ep for layout in candidate_layouts(MIXTRAL, request, 64, 2, 8, frozenset())} == {1, 2}
    pinned = candidate_layouts(MIXTRAL, TrainConfig(seq_len=4096, layout=Layout(dp=4, ep=4)), 64, 16, 8,
                               frozenset({"ep"}))
    assert {layout.ep for layout in pinned} == {4}
    dense = candidate_layouts(get_preset("llama3-8b"), request, 64, 16, 8, frozenset())
    assert {layout.ep for layout in dense} == {1}


def test_a_mixtral_plan_on_16_gpus_weighs_ep():
    request = PlanRequest(spec=MIXTRAL, global_batch=64, train=TrainConfig(seq_len=4096), gpus=16)
    result = plan(request, datasheet_profile(get_hardware("h100-sxm")))
    assert {o.layout.ep for o in result.layouts} == {1, 2, 4, 8}
    assert result.recommendation is not None
    best = result.recommendation
    ep_terms = [t for t in best.time.communication if t.axis == "ep"]
    assert bool(ep_terms) == (best.config.layout.ep > 1)


def test_a_moe_model_still_refuses_tensor_and_pipeline_parallelism_by_name():
    spec = get_preset("qwen3-30b-a3b")
    with pytest.raises(ConfigError, match=r"qwen3-30b-a3b: a mixture of experts \(128 experts, 8 per token\) is "
                                          r"planned on data, context and expert parallelism with sharding; tp 2 is not "
                                          r"modelled for it yet: use tp 1 and pp 1"):
        estimate(spec, TrainConfig(seq_len=4096, layout=Layout(tp=2, sp=True)))


def test_deepseek_v3_fits_80_gb_with_experts_split():
    """671B parameters, 256 routed experts a block: FSDP alone gathers whole 11B-parameter blocks (22 GB
    each in bf16); ep 64 gathers 1/64 of their experts."""
    spec = resolve_model(str(Path(__file__).parent / "fixtures" / "hf" / "deepseek-v3.json"))
    whole = estimate(spec, TrainConfig(seq_len=4096, recompute=RecomputePolicy("full"), layout=Layout(dp=256, zero=3)))
    split = dataclasses.replace(whole.config, layout=Layout(dp=256, zero=3, ep=64))
    assert whole.peak_bytes > 80e9
    assert estimate(spec, split).peak_bytes < 80e9


def test_one_ranks_shapes_are_keyed_by_the_fewest_data_parallel_ranks_its_experts_allow():
    """The ledger and the op list are shared by every dp of one layout: keyed by the fewest dp that keeps ep
    dividing dp x cp, never by dp = ep, which with cp 1,024 and ep 2,048 spanned 2,097,152 GPUs."""
    assert Layout(cp=1024, dp=2, zero=3, ep=2048).fewest_data_parallel() == Layout(cp=1024, dp=2, zero=3, ep=2048)
    assert Layout(cp=2, dp=8, ep=4).fewest_data_parallel() == Layout(cp=2, dp=2, ep=4)
    assert Layout(dp=64, ep=8).fewest_data_parallel() == Layout(dp=8, ep=8)
    assert Layout(dp=64).fewest_data_parallel() == Layout(dp=1)


MANY_EXPERTS = dataclasses.replace(MIXTRAL, name="mixtral-4096-experts", n_experts=4096)


def test_fewer_routed_rows_than_experts_run_one_expert_a_row():
    """cp 1,024 leaves 4 tokens of a 4,096-token sequence on a rank: 8 routed rows for 4,096 experts. At most
    8 experts run, on one row each (the op list once gave each expert 8 // 4,096 = 0 rows, and a division by
    zero)."""
    config = mixtral(zero=3, cp=1024, dp=2, ep=2)
    ops = forward_ops(MANY_EXPERTS, config, "cuda", layers=1)
    (moe_block,) = [block for block, _ in ops.blocks]
    experts = [op for op in moe_block if op.kind == "gemm" and op.name.startswith("block.moe.experts.")]
    assert [(op.m, op.batch) for op in experts] == [(1, 8)] * 3
    dense = forward_ops(MIXTRAL, mixtral(zero=3, dp=2, ep=2), "cuda", layers=1)
    (dense_block,) = [block for block, _ in dense.blocks]
    assert {(op.m, op.batch) for op in dense_block
            if op.kind == "gemm" and op.name.startswith("block.moe.experts.")} == {(2 * 4096 // 4, 4)}


def test_a_plan_of_4096_experts_on_2048_gpus_searches_the_layouts_asked_for(tmp_path, capsys):
    from headroom.cli.main import main

    config = json.loads((Path(__file__).parent / "fixtures" / "hf" / "mixtral-8x7b-v0.1.json").read_text())
    path = tmp_path / "moe4k.json"
    path.write_text(json.dumps(config | {"num_local_experts": 4096, "num_experts_per_tok": 2}))
    assert main(["plan", "--model", str(path), "--global-batch", "4096", "--gpus", "2048", "--json"]) == 3
    payload = json.loads(capsys.readouterr().out)
    assert payload["recommendation"] is None  # 23T parameters: static state alone breaks 80 GB
    layouts = [entry["layout"] for entry in payload["layouts"]]
    assert {layout["world"] for layout in layouts} == {2048}
    assert {"cp": 1024, "dp": 2, "ep": 2048} in [{k: layout[k] for k in ("cp", "dp", "ep")} for layout in layouts]


# ---- the command line, the dashboard and the exports ---------------------------------------------------------


def test_plan_pins_ep_and_estimate_refuses_it_for_a_dense_model(capsys):
    import json

    from headroom.cli.main import main

    assert main(["plan", "--model", "mixtral-8x7b", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096",
                 "--ep", "4", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert {entry["layout"]["ep"] for entry in payload["layouts"]} == {4} and payload["request"]["pinned"] == ["ep"]
    assert main(["estimate", "--model", "llama3-8b", "--dp", "2", "--ep", "2"]) == 2
    assert "llama3-8b: ep 2 splits a mixture of experts' routed experts over ranks" in capsys.readouterr().err


def test_the_dashboard_pins_ep_like_any_axis():
    from headroom.dashboard import planning

    h100 = datasheet_profile(get_hardware("h100-sxm"))
    request = planning.build_request(planning.PlanInputs(model="mixtral-8x7b", gpus=16, ep="4"), MIXTRAL, h100)
    assert request.pinned == frozenset({"ep"}) and request.layout.ep == 4
    assert planning.pins_text(request) == "ep 4"
    assert planning.PlanInputs.from_query({"ep": " 08"}).ep == "8"


def test_exports_name_the_expert_parallel_degree():
    from headroom.core.exports import export
    from tests.test_export import flags

    request = PlanRequest(spec=MIXTRAL, global_batch=64, train=TrainConfig(seq_len=4096, layout=Layout(dp=16, zero=3, ep=4)))
    best = plan(request, datasheet_profile(get_hardware("h100-sxm"))).recommendation
    assert best.config.layout.ep == 4
    assert flags(export("megatron", request, best).text)["--expert-model-parallel-size"] == "4"
    assert "--parallelism.expert_parallel_degree 4" in export("torchtitan", request, best).text
    assert flags(export("megatron", request, best).text)["--moe-token-dispatcher-type"] == "alltoall"
    assert "--moe-expert-capacity-factor" not in flags(export("megatron", request, best).text)
    assert any("MoE(..., ep_size=4, drop_tokens=False)" in note for note in export("deepspeed", request, best).notes)
    assert any("cannot express ep 4" in note for note in export("hf", request, best).notes)
    assert any("ep 4 cannot be expressed" in note for note in export("lightning", request, best).notes)


def test_exports_carry_a_capacity_factor_or_say_the_framework_is_dropless():
    from headroom.core.exports import export
    from tests.test_export import flags

    capped = dataclasses.replace(MIXTRAL, capacity_factor=1.25)
    request = PlanRequest(spec=capped, global_batch=64, train=TrainConfig(seq_len=4096, layout=Layout(dp=16, zero=3)))
    best = plan(request, datasheet_profile(get_hardware("h100-sxm"))).recommendation
    megatron = flags(export("megatron", request, best).text)
    assert megatron["--moe-expert-capacity-factor"] == "1.25" and "--moe-pad-expert-input-to-capacity" in megatron
    assert any("MoE(..., capacity_factor=1.25, drop_tokens=True)" in note
               for note in export("deepspeed", request, best).notes)
    for fmt in ("torchtitan", "hf", "lightning"):
        assert any("planned at capacity factor 1.25" in note and "dropless" in note
                   for note in export(fmt, request, best).notes), fmt


def test_when_a_mixture_does_not_fit_the_advice_tries_more_expert_parallel_ranks_first():
    spec = resolve_model(str(Path(__file__).parent / "fixtures" / "hf" / "deepseek-v3.json"))
    h100 = datasheet_profile(get_hardware("h100-sxm"))
    request = PlanRequest(spec=spec, global_batch=1024, train=TrainConfig(seq_len=4096, layout=Layout(dp=256, zero=3)))
    result = plan_and_advise(request, h100)
    assert result.recommendation is None
    assert result.advice[-1].startswith("smallest change that fits: --ep 8 (then ")
    assert [plan(request.with_layout(ep=ep), h100).recommendation is not None for ep in (2, 4, 8)] == [False, False, True]
