"""The data-parallel settings (headroom.core.specs.data_parallel): each stack's defaults with their sources, the
checks on a setting, what each does to the memory of an FSDP rank, and the flags and page inputs that set them.
The collectives and gathered bytes themselves are measured against FSDP2 in tests/test_fsdp_schedule.py."""

from __future__ import annotations

import json

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import estimate
from headroom.core.memory.static import fsdp_units
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.data_parallel import data_parallel_schedule
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.specs.run_config import RunConfig
from headroom.dashboard.planning import PlanInputs, build_layout

LLAMA = get_preset("llama3-8b")


@pytest.mark.parametrize(("stack", "pp", "reshard", "defer", "kept"), [
    ("reference", 1, True, False, False),  # the agent's loop: backward every micro-batch, nothing around it
    ("reference", 2, True, True, True),  # torch.distributed.pipelining defers and keeps units gathered
    ("torchtitan", 1, True, False, False),  # trainer.py's train_step
    ("torchtitan", 2, False, True, True),  # reshard_after_forward = not pp_enabled; pipelining as above
    ("megatron", 1, True, True, False),  # its schedules' no_sync on all but the last micro-batch
    ("megatron", 2, True, True, False),
    ("hf", 1, True, True, False),  # the Trainer's no_sync: accelerate's set_requires_gradient_sync(False)
    ("hf-liger", 1, True, True, False),
])
def test_each_stack_has_its_sourced_defaults(stack, pp, reshard, defer, kept):
    schedule = data_parallel_schedule(Layout(pp=pp, dp=4, zero=3), stack)
    assert (schedule.reshard_after_forward, schedule.defer_gradient_sync,
            schedule.keeps_gathered_between_micro_batches) == (reshard, defer, kept)


def test_a_setting_given_wins_over_the_stack():
    schedule = data_parallel_schedule(Layout(pp=2, dp=8, zero=3, reshard_after_forward=4, defer_gradient_sync=False),
                                      "torchtitan")
    assert (schedule.reshard_after_forward, schedule.defer_gradient_sync) == (4, False)
    assert schedule.text(3) == ("FSDP units kept as a shard over 4 ranks from forward to backward, and from one "
                                "micro-batch to the next; gradients reduced every micro-batch")
    assert data_parallel_schedule(Layout(dp=4), "megatron").text(0) == ("gradients reduced once per step (the last "
                                                                        "micro-batch), after backward (exposed)")


@pytest.mark.parametrize(("layout", "message"), [
    ({"dp": 8, "zero": 2, "reshard_after_forward": True}, r"needs zero 3 \(parameters sharded\), not zero 2"),
    ({"dp": 8, "zero": 3, "reshard_after_forward": 3}, r"\(dp x cp = 8\); use true, false or one of 2, 4"),
    ({"dp": 8, "zero": 3, "reshard_after_forward": 8}, "below the ranks that shard the parameters"),
    ({"dp": 8, "zero": 3, "ep": 4, "reshard_after_forward": 4}, r"dp x cp / ep = 2\); use true, false$"),
    ({"dp": 8, "zero": 3, "reshard_after_forward": "yes"}, "true, false or a number of ranks, got 'yes'"),
    ({"dp": 8, "zero": 2, "defer_gradient_sync": False}, "every micro-batch \\(it keeps only its shard\\)"),
])
def test_a_setting_that_cannot_apply_is_refused_by_name(layout, message):
    with pytest.raises(ConfigError, match=message):
        Layout(**layout)


def test_zero_1_defers_its_gradient_sync_where_it_is_ddp():
    """Plain PyTorch's ZeRO-1 is DDP under ZeroRedundancyOptimizer: no_sync defers its all-reduce to the last
    micro-batch; Megatron-LM's distributed optimizer reduces once per step already, and says so."""
    layout = Layout(dp=8, zero=1, defer_gradient_sync=True)
    deferred = TrainConfig(seq_len=2048, layout=layout)
    deferred.check_sharding()
    assert deferred.data_parallel.text(1).startswith("gradients reduced once per step (the last micro-batch)")
    with pytest.raises(ConfigError, match="defer-gradient-sync under --stack megatron --zero 1: its distributed "
                                          "optimizer reduces the gradients once per step already; leave it out"):
        TrainConfig(seq_len=2048, layout=layout, stack="megatron").check_sharding()


def test_a_rank_whose_fsdp_units_stay_gathered_holds_all_of_them():
    """Llama 3 8B on 8 ranks, amp-bf16: resharded, forward holds the largest unit (the head's, 525M parameters)
    twice, its buffer and its copy; kept, every unit and the head's once more; a shard over 4, a quarter of each
    unit before the head. The last adds the largest unit's bf16 and fp32 gradients in backward."""
    def gathered(**settings) -> tuple[int, int]:
        config = TrainConfig(seq_len=4096, layout=Layout(dp=8, zero=3, **settings))
        return estimate(LLAMA, config, "cuda").gathered_parameter_bytes

    runs = fsdp_units(LLAMA, Layout(dp=8, zero=3), estimate(LLAMA, TrainConfig(seq_len=8), "cuda").rank)
    total, head = sum(size * n for size, n in runs), runs[-1][0]
    assert head == max(size for size, _ in runs) == LLAMA.norm_parameters() + LLAMA.vocab_size * LLAMA.hidden
    assert gathered() == (2 * head * 2, 2 * head * 2 + head * 6)
    assert gathered(reshard_after_forward=False)[0] == (total + head) * 2
    assert gathered(reshard_after_forward=4)[0] == ((total - head) // 4 + 2 * head) * 2


def test_deferred_fsdp_gradients_stay_whole_in_the_reduce_dtype():
    config = TrainConfig(seq_len=4096, layout=Layout(dp=8, zero=3, defer_gradient_sync=True))
    deferred = estimate(LLAMA, config, "cuda", accumulation_steps=4)
    assert deferred.deferred_gradient_bytes == LLAMA.parameters * 4  # fp32, the whole model, not its eighth
    assert deferred.peak_components["gradients"] == LLAMA.parameters * 4
    synced = estimate(LLAMA, TrainConfig(seq_len=4096, layout=Layout(dp=8, zero=3)), "cuda", accumulation_steps=4)
    assert synced.deferred_gradient_bytes == 0 and synced.peak_components["gradients"] == synced.static.gradients
    assert estimate(LLAMA, config, "cuda").deferred_gradient_bytes == 0  # one micro-batch keeps nothing between


def test_the_document_of_a_run_carries_a_setting_given_and_leaves_out_one_left_to_the_stack():
    layout = Layout(dp=8, zero=3, reshard_after_forward=4)
    run = RunConfig(train=TrainConfig(seq_len=4096, layout=layout), accumulation_steps=2)
    document = run.to_dict()
    assert document["layout"]["reshard_after_forward"] == 4 and "defer_gradient_sync" not in document["layout"]
    assert RunConfig.from_dict(json.loads(json.dumps(document))) == run


def test_plan_takes_the_settings_as_flags(run_cli):
    result = run_cli("plan", "--model", "llama3-8b", "--seq-len", "2048", "--global-batch", "64", "--gpus", "16",
                     "--zero", "3", "--tp", "1", "--pp", "1", "--cp", "1", "--reshard-after-forward", "8",
                     "--defer-gradient-sync", "on", "--json")
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["recommendation"]
    assert best["layout"]["reshard_after_forward"] == 8 and best["layout"]["defer_gradient_sync"] is True
    assert best["data_parallel"]["text"] == ("FSDP units kept as a shard over 8 ranks from forward to backward; "
                                             "gradients reduced once per step (the last micro-batch)")
    again = [t for t in best["communication"] if t["op"] == "all_gather" and t["window"] == "backward"]
    assert {t["group_size"] for t in again} == {8}  # a term a run of units (the embedding's, the blocks')
    bad = run_cli("plan", "--model", "llama3-8b", "--global-batch", "64", "--reshard-after-forward", "maybe")
    assert bad.returncode == 2 and "'maybe' is not true, false or a number of ranks" in bad.stderr


def test_the_plan_page_pins_the_settings():
    inputs = PlanInputs.from_query({"gpus": "0", "dp": "8", "zero": "3", "reshard_after_forward": "False",
                                    "defer_gradient_sync": "on"})
    assert (inputs.reshard_after_forward, inputs.defer_gradient_sync) == ("off", "on")
    layout = build_layout(inputs)
    assert (layout.reshard_after_forward, layout.defer_gradient_sync) == (False, True)
    assert build_layout(PlanInputs.from_query({"dp": "8", "zero": "3", "reshard_after_forward": "4"})) \
        .reshard_after_forward == 4
    assert PlanInputs.from_query({"reshard_after_forward": "sometimes"}).reshard_after_forward == "auto"


def test_the_torchtitan_export_carries_the_resharding_it_can_say(run_cli):
    base = ("plan", "--model", "llama3-8b", "--seq-len", "2048", "--global-batch", "64", "--gpus", "16", "--zero",
            "3", "--tp", "1", "--pp", "1", "--cp", "1", "--export", "torchtitan")
    never = run_cli(*base, "--reshard-after-forward", "false")
    assert never.returncode == 0, never.stderr
    assert "--parallelism.fsdp_reshard_after_forward never" in never.stdout
    shard = run_cli(*base, "--reshard-after-forward", "8")
    assert "--parallelism.fsdp_reshard_after_forward" not in shard.stdout
    assert "cannot keep a shard over 8 ranks" in shard.stdout


def test_megatron_plans_its_reductions_after_the_pass_and_exports_the_flags_that_overlap_them(run_cli):
    """Megatron-LM reduces gradients after backward and gathers ZeRO-1's parameters after the step unless told
    otherwise; the plan says so, the flags overlap them, and the export writes Megatron's own flags."""
    base = ("plan", "--model", "llama3.2-1b", "--seq-len", "2048", "--global-batch", "64", "--dp", "8", "--zero", "1",
            "--stack", "megatron")
    plain = run_cli(*base, "--json")
    assert plain.returncode == 0, plain.stderr
    best = json.loads(plain.stdout)["recommendation"]
    assert best["data_parallel"]["text"] == ("gradients reduced once per step, after backward (exposed); updated "
                                             "parameters gathered after the optimizer step (exposed)")
    assert {t["window"] for t in best["communication"] if t["axis"] == "dp"} == {""}
    asked = json.loads(run_cli(*base, "--overlap-grad-reduce", "on", "--overlap-param-gather", "on",
                               "--json").stdout)["recommendation"]
    assert sorted(t["window"] for t in asked["communication"] if t["axis"] == "dp") == ["backward", "forward"]
    assert asked["time_s"]["communication"] < best["time_s"]["communication"]
    exported = run_cli(*base, "--overlap-grad-reduce", "on", "--overlap-param-gather", "on", "--export", "megatron")
    assert "--overlap-grad-reduce --overlap-param-gather" in exported.stdout
    assert "--overlap-grad-reduce" not in run_cli(*base, "--export", "megatron").stdout


def test_a_framework_that_always_overlaps_says_it_runs_faster_than_a_plan_that_waits(run_cli):
    base = ("plan", "--model", "llama3.2-1b", "--seq-len", "2048", "--global-batch", "64", "--dp", "8",
            "--overlap-grad-reduce", "off")
    titan = run_cli(*base, "--export", "torchtitan")
    assert "torchtitan's DDP reduces the gradients while backward runs, where the plan waits for it" in \
        " ".join(titan.stdout.split())
    deepspeed = run_cli(*base, "--zero", "1", "--export", "deepspeed")
    assert json.loads(deepspeed.stdout)["zero_optimization"] == {"stage": 1, "overlap_comm": False}
    refused = run_cli(*base, "--zero", "3")
    assert refused.returncode == 2 and "overlap-grad-reduce applies to zero 0, 1, 2, not zero 3" in refused.stderr


def test_the_plan_page_pins_the_overlaps():
    inputs = PlanInputs.from_query({"gpus": "0", "dp": "8", "zero": "1", "overlap_grad_reduce": "off",
                                    "overlap_param_gather": "on"})
    layout = build_layout(inputs)
    assert (layout.overlap_grad_reduce, layout.overlap_param_gather) == (False, True)


def test_a_stack_plans_only_the_sharding_stages_it_runs(run_cli):
    """torchtitan replicates or shards (FSDP2 either way): no ZeRO-1 or 2, refused by name when planned or
    estimated and never searched (a step the agent measured under torchtitan's kernels with its own ZeRO-1 still
    reads back). Plain PyTorch has no ZeRO-2 either: FSDP's SHARD_GRAD_OP is its nearest, zero 3 kept gathered
    from forward to backward, named where zero 2 is asked and searched beside resharding FSDP under both. Megatron
    and the HF Trainer run every stage."""
    measured = TrainConfig(seq_len=2048, stack="torchtitan", layout=Layout(dp=8, zero=1))
    with pytest.raises(ConfigError, match=r"the torchtitan stack has no ZeRO-1; it shards at --zero 0, 3 "):
        measured.check_sharding()
    TrainConfig(seq_len=2048, stack="torchtitan", layout=Layout(zero=1)).check_sharding()  # one rank: nothing shards
    for stack in ("megatron", "hf"):
        TrainConfig(seq_len=2048, stack=stack, layout=Layout(dp=8, zero=2)).check_sharding()
    with pytest.raises(ConfigError, match=r"the reference stack has no ZeRO-2; it shards at --zero 0, 1, 3 "):
        TrainConfig(seq_len=2048, stack="reference", layout=Layout(dp=8, zero=2)).check_sharding()
    kept = run_cli("plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--zero", "2")
    assert kept.returncode == 2 and kept.stderr.endswith(
        "its ZeRO-2 is FSDP's SHARD_GRAD_OP, parameters kept gathered from forward to backward: --zero 3 "
        "--reshard-after-forward false\n")
    pinned = run_cli("plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--stack", "torchtitan",
                     "--zero", "2")
    assert pinned.returncode == 2
    assert pinned.stderr == ("headroom: error: the torchtitan stack has no ZeRO-2; it shards at --zero 0, 3 "
                             "(0 replicates, 3 shards parameters, gradients and optimizer state); its ZeRO-2 is "
                             "FSDP's SHARD_GRAD_OP, parameters kept gathered from forward to backward: --zero 3 "
                             "--reshard-after-forward false\n")
    for stack in ("torchtitan", "reference"):
        searched = run_cli("plan", "--model", "llama3.2-1b", "--gpus", "8", "--seq-len", "4096", "--global-batch",
                           "64", "--stack", stack, "--exhaustive", "--json")
        assert searched.returncode == 0, searched.stderr
        found = json.loads(searched.stdout)
        stages = {(row["layout"]["zero"], row["layout"]["reshard_after_forward"]) for row in found["layouts"]}
        assert stages == {(0, None), (3, None), (3, False)} | ({(1, None)} if stack == "reference" else set())


def test_a_zero_bubble_pipeline_plans_every_k_recompute():
    """Under zbv the first rank's embedding is traced apart, with no block: every-K has no segment to cut (it
    divided by zero)."""
    config = TrainConfig(seq_len=2048, recompute=parse_policy("every-2"),
                         layout=Layout(pp=4, schedule="zbv", virtual_stages=2))
    assert estimate(LLAMA, config, "cuda", 8).peak_bytes > 0


def test_the_agent_measures_torchtitan_only_where_its_own_data_parallelism_is_torchtitans(run_cli, tmp_path):
    """The agent replicates by DDP and ZeroRedundancyOptimizer whatever the stack's kernels: under torchtitan, whose
    zero 0 is FSDP2 over a replicating dimension and which has no ZeRO-1, it measures zero 3 only (refused before
    anything launches)."""
    base = ("agent", "train", "--model", "bench-llama-tiny", "--nproc", "2", "--seq-len", "32", "--micro-batch", "1",
            "--stack", "torchtitan", "--db", f"sqlite:///{tmp_path / 'r.db'}")
    replicated = run_cli(*base, "--zero", "0")
    assert replicated.returncode == 2
    assert "torchtitan replicates through FSDP2 (an all-reduce a unit, no DDP buckets), which the agent does not " \
           "run: measure --zero 3, or --stack reference" in replicated.stderr
    zero1 = run_cli(*base, "--zero", "1")
    assert zero1.returncode == 2 and "the torchtitan stack has no ZeRO-1" in zero1.stderr
    assert not (tmp_path / "r.db").exists()


def test_fsdp_kept_gathered_is_searched_once_and_only_where_it_differs():
    """The search tries FSDP kept gathered (the reference and torchtitan stacks' ZeRO-2) beside resharding: only
    where ranks shard (no duplicate of a layout at dp x cp = 1), not where resharding is pinned, and not under
    torchtitan's pipeline, whose default keeps the units gathered already."""
    from headroom.core.planning.layout_search import candidate_layouts

    spec = get_preset("llama3-8b")

    def searched(stack: str = "reference", pinned: frozenset[str] = frozenset(), **layout) -> list[Layout]:
        train = TrainConfig(seq_len=2048, stack=stack, layout=Layout(**layout))
        return candidate_layouts(spec, train, 64, 8, 8, pinned)

    for stack in ("reference", "torchtitan"):
        layouts = searched(stack)
        kept = [layout for layout in layouts if layout.reshard_after_forward is False]
        assert len(set(layouts)) == len(layouts) and kept
        assert all(layout.zero == 3 and layout.dp * layout.cp > 1 for layout in kept)
        assert any(layout.pp > 1 for layout in kept) == (stack == "reference")
    assert not [layout for layout in searched("megatron") if layout.reshard_after_forward is False]
    one_replica = searched(pinned=frozenset({"tp", "zero"}), tp=8, zero=3)
    assert [layout.reshard_after_forward for layout in one_replica if layout.pp == 1] == [None]
    resharded = searched(pinned=frozenset({"zero", "reshard_after_forward"}), zero=3, reshard_after_forward=True)
    assert {layout.reshard_after_forward for layout in resharded} == {True}
