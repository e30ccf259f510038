"""Pipeline stages of different sizes: the split each stack makes, a split given, what it costs in memory and time,
and where it goes (flags, the Plan page, run documents, exports). The memory of an uneven split is measured on two
gloo ranks in tests/test_multi_rank.py; torchtitan's own splitter is checked in tests/test_export_frameworks.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import estimate, for_rank
from headroom.core.memory.pipeline import pipeline_seconds
from headroom.core.planning.layout_search import candidate_layouts
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.run_config import RunConfig
from headroom.core.specs.stages import chunk_layers, stage_layers, weighted_split
from headroom.core.timing.step import datasheet_profile, step_time
from headroom.dashboard.planning import PlanInputs, build_layout

LLAMA = get_preset("llama3-8b")  # 32 layers
LLAMA_405B = get_preset("llama3.1-405b")  # 126 layers
H100 = datasheet_profile(get_hardware("h100-sxm"))


def test_torchtitans_rule_counts_the_embedding_and_head_as_a_block_each():
    assert weighted_split(126, 16) == (7, *(8,) * 14, 7)
    assert weighted_split(32, 4) == (8, 9, 8, 7)  # 34 weights: the first two stages one more
    assert weighted_split(2, 4) == (0, 1, 1, 0)  # the first and last stages hold only the embedding and the head
    with pytest.raises(ConfigError, match="2 layers do not split over 5 pipeline stages .* use fewer stages"):
        weighted_split(2, 5)


@pytest.mark.parametrize(("stack", "layout", "n_layers", "expected"), [
    ("reference", Layout(pp=4), 32, (8, 8, 8, 8)),
    ("megatron", Layout(pp=4), 32, (8, 8, 8, 8)),
    ("torchtitan", Layout(pp=4), 32, (8, 9, 8, 7)),  # even where the layers divide
    ("megatron", Layout(pp=16), 126, (7, *(8,) * 14, 7)),  # they do not divide: the planner's choice
    ("torchtitan", Layout(pp=4, schedule="interleaved", virtual_stages=2), 32, (8, 9, 8, 7)),  # chunks 4,5,.. summed
    ("reference", Layout(pp=4, schedule="interleaved", virtual_stages=2), 32, (8, 8, 8, 8)),
    ("reference", Layout(pp=2, stage_layers=(10, 22)), 32, (10, 22)),
])
def test_each_stack_splits_the_layers_by_its_rule(stack, layout, n_layers, expected):
    assert stage_layers(layout, n_layers, stack) == expected


@pytest.mark.parametrize(("layout", "message"), [
    ({"pp": 3, "stage_layers": (16, 16)}, r"stage layers 16,16 give 2 stage\(s\) for pp 3: give one count per stage$"),
    ({"stage_layers": (32,)}, "give one count per stage, with --pp above 1"),
    ({"pp": 3, "stage_layers": (16, 0, 16)}, "a middle stage holds at least one block"),
    ({"pp": 2, "stage_layers": (-1, 33)}, "stage layers must be a count of blocks per pipeline stage"),
    ({"pp": 2, "schedule": "interleaved", "virtual_stages": 2, "stage_layers": (15, 17)},
     "under the interleaved schedule: each stage's blocks split evenly over its 2 chunks .* divisible by 2$"),
    ({"pp": 2, "schedule": "zbv", "virtual_stages": 2, "stage_layers": (16, 16)},
     "the zbv schedule splits the layers over its chunks itself"),
])
def test_a_split_that_cannot_apply_is_refused_by_name(layout, message):
    with pytest.raises(ConfigError, match=message):
        Layout(**layout)


def test_a_split_must_hold_the_models_layers_and_the_interleaved_schedule_an_even_one():
    with pytest.raises(ConfigError, match="^llama3-8b: stage layers 10,10 hold 20 blocks, not the model's 32"):
        TrainConfig(seq_len=4096, layout=Layout(pp=2, stage_layers=[10, 10])).check_model(LLAMA)
    with pytest.raises(ConfigError, match=r"^llama3.1-405b: its 126 layers do not split over pp 6 x 2 virtual stages, "
                                          r"evenly or with the embedding and the loss counted as a layer each \(128\); "
                                          r"use --pp x --virtual-stages among 6, 7, 9, 14, 18 \(or 1, 2, 4, 8, 16\), "
                                          r"or --stage-layers, a count a stage \(divisible by 2 under the "
                                          r"interleaved schedule\)$"):
        TrainConfig(seq_len=4096, stack="megatron",
                    layout=Layout(pp=6, schedule="interleaved", virtual_stages=2)).check_model(LLAMA_405B)
    assert str(Layout(pp=4, stage_layers=[7, 9, 9, 7])) == "tp 1, pp 4 (1f1b, stages 7/9x2/7), cp 1, dp 1, zero 0"


def test_under_the_interleaved_schedule_a_given_split_divides_each_stage_over_its_chunks(run_cli):
    """Megatron-LM's uneven split with virtual stages (get_transformer_layer_offset): the first and last stages'
    counts and the middle stages' each split evenly over a stage's chunks; rank i holds chunks i and i + pp. Its
    export gives the first and last stages' counts and the virtual stages by number; torchtitan's, each model part's
    modules."""
    layout = Layout(pp=4, schedule="interleaved", virtual_stages=2, stage_layers=(6, 10, 10, 6))
    assert chunk_layers(layout, 32, "megatron") == (3, 5, 5, 3, 3, 5, 5, 3)
    assert stage_layers(layout, 32, "megatron") == (6, 10, 10, 6)
    flags = ("--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "32", "--hardware", "h100-sxm", "--pp",
             "4", "--dp", "1", "--schedule", "interleaved", "--virtual-stages", "2", "--stage-layers", "6,10,10,6",
             "--micro-batch", "1", "--recompute", "full")
    megatron = run_cli("plan", *flags, "--stack", "megatron", "--export", "megatron")
    assert megatron.returncode == 0, megatron.stderr
    assert ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 6 "
            "--decoder-last-pipeline-num-layers 6 --virtual-pipeline-model-parallel-size 2") in megatron.stdout
    titan = run_cli("plan", *flags, "--stack", "torchtitan", "--export", "torchtitan")
    assert titan.returncode == 0, titan.stderr
    parts = titan.stdout.split("--parallelism.module_fqns_per_model_part ")[1].split(" \\")[0].split()
    assert [sum(name.startswith("layers.") for name in part.split(",")) for part in parts] == [3, 5, 5, 3, 3, 5, 5, 3]


def test_every_middle_stage_size_is_a_rank_kind_of_its_own():
    """Middle stages of 9 and of 8 blocks are two kinds (the first of each size keeps the most micro-batches in
    flight); alike middle stages stay one."""
    config = TrainConfig(seq_len=2048, precision="bf16-pure", layout=Layout(pp=4, stage_layers=(7, 9, 8, 8)))
    result = estimate(LLAMA, config, "cuda", accumulation_steps=8)
    kinds = [(r.rank.name, r.rank.stage, r.rank.layers, r.rank.in_flight) for r in result.ranks]
    assert kinds == [("first stage", 0, 7, 4), ("middle stage 1", 1, 9, 3), ("middle stage 2", 2, 8, 2),
                     ("last stage", 3, 8, 1)]
    _, nine, eight, _ = result.ranks
    block = nine.static.parameters - eight.static.parameters  # one block's parameters, in the stage's dtype
    assert block == LLAMA.layer_parameters() * 2
    assert for_rank(result, 2).rank.layers == 8 and for_rank(result, 1).rank.layers == 9
    alike = estimate(LLAMA, TrainConfig(seq_len=2048, layout=Layout(pp=4, stage_layers=(7, 9, 9, 7))), "cuda", 8)
    assert [r.rank.name for r in alike.ranks] == ["first stage", "middle stage", "last stage"]


def test_the_slowest_stage_sets_the_pipelines_pace():
    """m t_max + (sum t - t_max) / v: Narayanan et al.'s (m + pp - 1) t for alike stages; every rank's step is the
    pipeline's, its own micro-batches plus what it waits."""
    assert pipeline_seconds((1.0, 1.0, 1.0, 1.0), 8) == 11.0
    assert pipeline_seconds((1.0, 1.0, 1.0, 1.0), 8, virtual_stages=2) == 9.5
    assert pipeline_seconds((1.0, 3.0), 2) == 7.0

    def timed(split: tuple[int, ...]):
        config = TrainConfig(seq_len=2048, layout=Layout(pp=2, stage_layers=split))
        result = estimate(LLAMA, config, "cuda", accumulation_steps=8)
        return [step_time(for_rank(result, rank), H100, 8, H100.cluster()) for rank in (0, 1)]

    even, uneven = timed((16, 16)), timed((8, 24))
    for times in (even, uneven):
        pipelines = [t.total_s - t.accumulation_s - t.optimizer_s - t.communication_s for t in times]
        assert pipelines[0] == pytest.approx(pipelines[1], rel=1e-9)
    first, last = uneven
    assert first.bubble_s > last.bubble_s  # the 8-block stage waits for the 24-block one
    assert last.total_s > even[1].total_s * 1.3  # 24 blocks set the pace: (8 x 24 + 8) / (8 x 16 + 16) = 1.39


def test_the_search_plans_pipelines_the_layers_do_not_divide():
    train = TrainConfig(seq_len=2048, stack="megatron", layout=Layout(tp=8))
    layouts = candidate_layouts(LLAMA_405B, train, 256, 128, 8, frozenset({"tp"}))
    depths = {(layout.pp, layout.schedule) for layout in layouts}
    # 126 = 7 + 8 x 14 + 7; over 32 chunks with the embedding and the loss counted (Megatron-LM's account-for split)
    assert (16, "1f1b") in depths and (16, "interleaved") in depths
    titan = candidate_layouts(LLAMA_405B, TrainConfig(seq_len=2048, stack="torchtitan", layout=Layout(tp=8)), 256,
                              128, 8, frozenset({"tp"}))
    assert (16, "interleaved") in {(layout.pp, layout.schedule) for layout in titan}  # torchtitan splits any


def test_plan_reports_the_split_and_takes_one(run_cli):
    base = ("plan", "--model", "llama3.1-405b", "--seq-len", "2048", "--global-batch", "16", "--tp", "8",
            "--budget", "200GB")
    result = run_cli(*base, "--pp", "16", "--stack", "torchtitan")
    assert result.returncode == 0, result.stderr
    assert "pipeline stages: 7/8x14/7 blocks (torchtitan's split: the embedding and the head count as a block " \
           "each)" in " ".join(result.stdout.split())
    given = run_cli(*base, "--stage-layers", "6,8,8,8,8,8,8,8,8,8,8,8,8,8,8,8", "--json")
    assert given.returncode == 0, given.stderr
    best = json.loads(given.stdout)["recommendation"]
    assert best["layout"]["pp"] == 16 and best["stage_layers"] == [6, *[8] * 15]
    assert best["layout"]["stage_layers"] == [6, *[8] * 15]
    bad = run_cli(*base, "--stage-layers", "7;8")
    assert bad.returncode == 2 and "'7;8' is not a comma-separated list of block counts" in bad.stderr


def test_the_document_of_a_run_carries_its_split():
    run = RunConfig(train=TrainConfig(seq_len=4096, layout=Layout(pp=2, stage_layers=(12, 20))), accumulation_steps=4)
    document = json.loads(json.dumps(run.to_dict()))
    assert document["layout"]["stage_layers"] == [12, 20]
    assert RunConfig.from_dict(document) == run
    assert "stage_layers" not in RunConfig(train=TrainConfig(seq_len=4096, layout=Layout(pp=2))).to_dict()["layout"]


def test_the_plan_page_pins_a_split():
    inputs = PlanInputs.from_query({"gpus": "0", "stage_layers": "7, 9,9,7"})
    assert inputs.stage_layers == "7,9,9,7"
    layout = build_layout(inputs)
    assert (layout.pp, layout.stage_layers) == (4, (7, 9, 9, 7))
    assert PlanInputs.from_query({"stage_layers": "7;9"}).stage_layers == "auto"
    with pytest.raises(ConfigError, match="stage layers '7;9' is neither auto nor comma-separated block counts"):
        build_layout(PlanInputs(stage_layers="7;9"))


def test_megatron_takes_first_and_last_stages_of_their_own(run_cli):
    """7, 8 x 14, 7 is Megatron-LM's split with the embedding and the loss counted a layer each (128 over 16); other
    first and last counts around alike middle stages are its decoder-first and -last flags; anything else a note."""
    base = ("plan", "--model", "llama3.1-405b", "--seq-len", "2048", "--global-batch", "16", "--tp", "8",
            "--budget", "200GB", "--stack", "megatron", "--export", "megatron")
    chosen = run_cli(*base, "--pp", "16")
    assert chosen.returncode == 0, chosen.stderr
    assert ("--pipeline-model-parallel-size 16 --account-for-embedding-in-pipeline-split "
            "--account-for-loss-in-pipeline-split --context-parallel-size 1") in chosen.stdout
    ends = run_cli(*base, "--stage-layers", "5,8,8,8,8,8,8,8,8,8,8,8,8,8,8,9")
    assert ends.returncode == 0, ends.stderr
    assert "--decoder-first-pipeline-num-layers 5 --decoder-last-pipeline-num-layers 9" in ends.stdout
    odd = run_cli(*base, "--stage-layers", "6,9,8,8,8,8,8,8,8,8,8,8,8,8,8,7")
    assert "--decoder-first-pipeline-num-layers" not in odd.stdout
    assert "Megatron-LM cannot split the layers 6,9,8,8" in " ".join(odd.stderr.split())  # a note, on stderr


def test_estimate_says_the_split(run_cli):
    base = ("estimate", "--model", "llama3-8b", "--seq-len", "4096", "--pp", "4", "--accumulation", "8",
            "--stack", "torchtitan")
    text = run_cli(*base)
    assert text.returncode == 0, text.stderr
    assert "pipeline stages: 8/9/8/7 blocks (torchtitan's split" in text.stdout
    report = json.loads(run_cli(*base, "--json").stdout)
    assert report["config"]["stage_layers"] == [8, 9, 8, 7] and report["config"]["layout"]["stage_layers"] is None
    assert [r["layers"] for r in report["ranks"]] == [8, 9, 8, 7]


def test_megatron_counts_the_embedding_and_the_loss_where_interleaved_chunks_do_not_divide():
    """Llama 3.1 405B as Megatron-Bridge's recipe splits it over pp 8 x v 8 (account_for_embedding_in_pipeline_split,
    account_for_loss_in_pipeline_split): 126 + 2 weights, 2 a chunk; the first chunk holds the embedding and one
    block, the last one block and the loss (megatron/core/transformer/transformer_layer.py)."""
    from headroom.core.specs.stages import (
        accounts_for_ends,
        chunk_layers,
        split_text_for,
    )

    layout = Layout(tp=8, pp=8, schedule="interleaved", virtual_stages=8)
    assert chunk_layers(layout, 126, "megatron") == (1, *(2,) * 62, 1)
    assert stage_layers(layout, 126, "megatron") == (15, 16, 16, 16, 16, 16, 16, 15)  # rank i: chunks i, i + 8, ...
    assert split_text_for(layout, 126, "megatron") == (
        "15/16x6/15 blocks (chosen: the layers do not divide, so the embedding and the loss count as a layer each "
        "(Megatron-LM's --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split))")
    assert chunk_layers(Layout(pp=4, schedule="interleaved", virtual_stages=2), 32, "megatron") == (4,) * 8  # even
    assert [accounts_for_ends(n, 64) for n in (126, 128, 127, 62)] == [True, False, False, False]
    estimated = estimate(LLAMA_405B, TrainConfig(seq_len=8192, stack="megatron", precision="bf16-master",
                                                  layout=dataclasses.replace(layout, sp=True, cp=2)), "cuda", 64)
    assert [r.rank.layers for r in estimated.ranks] == [15, 16, 15]  # first, middle and last kinds


def test_megatron_exports_the_split_with_the_embedding_and_the_loss_counted(run_cli):
    """Megatron-Bridge's Llama 3.1 405B FP8 layout on 1,024 H100s, as its recipe sets it: the account-for flags and
    the virtual stages by their count (each rank's chunks hold different blocks)."""
    result = run_cli("plan", "--model", "llama3.1-405b", "--seq-len", "8192", "--global-batch", "512",
                     "--hardware", "h100-sxm", "--stack", "megatron", "--precision", "bf16-master", "--tp", "8",
                     "--sp", "on", "--budget", "200GB", "--pp", "8", "--schedule", "interleaved", "--virtual-stages", "8", "--cp", "2", "--dp", "8",
                     "--zero", "1", "--micro-batch", "1", "--recompute", "none", "--export", "megatron")
    assert result.returncode == 0, result.stderr
    assert ("--pipeline-model-parallel-size 8 --account-for-embedding-in-pipeline-split "
            "--account-for-loss-in-pipeline-split --virtual-pipeline-model-parallel-size 8 --context-parallel-size 2"
            in result.stdout)
    assert "--num-layers-per-virtual-pipeline-stage" not in result.stdout
