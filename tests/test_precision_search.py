"""``--precision auto`` (headroom.core.planning.planner.PlanRequest.precision_search): the planner tries each
precision recipe the hardware computes in, each with fp8 off and with each FP8 recipe the stack runs on a GPU
with fp8 units, and a plan says which it picked."""


import pytest

from headroom.core.specs.precision import LIGHTEST, PRECISIONS, searched_precisions

BF16_RECIPES = ["amp-bf16", "bf16-pure", "bf16-master", "bf16-fp32grad"]
PLAN = ("--model", "llama3.2-1b", "--seq-len", "4096", "--global-batch", "16", "--gpus", "2",
        "--precision", "auto", "--stack", "torchtitan")


def test_a_device_with_bf16_units_tries_every_bf16_recipe_and_one_without_fp32():
    assert searched_precisions({"bf16": 1e15, "fp32": 6e13}) == BF16_RECIPES
    assert searched_precisions({"fp32": 1e12}) == ["fp32"]
    assert searched_precisions({}) == BF16_RECIPES  # a box that timed no matmul
    assert set(BF16_RECIPES) | {"fp32"} == set(PRECISIONS) and LIGHTEST in BF16_RECIPES


def test_plan_searches_precisions_and_fp8_recipes_on_a_gpu_with_fp8_units(plan_json):
    plan = plan_json(*PLAN, "--hardware", "h100-sxm", "--exhaustive")  # every candidate, none left out
    assert (plan["request"]["precision"], plan["request"]["fp8"]) == ("auto", "auto")
    tried = {(c["precision"], c["fp8"]) for c in plan["candidates"] + plan["rejected"]}
    # torchtitan's converter runs torchao-rowwise; under amp-bf16 only on FSDP's mixed precision (zero 3)
    assert {precision for precision, _ in tried} == set(BF16_RECIPES)
    assert {fp8 for _, fp8 in tried} == {"off", "torchao-rowwise"}
    amp = [c for c in plan["candidates"] + plan["rejected"] if c["precision"] == "amp-bf16" and c["fp8"] != "off"]
    assert amp and all(c["layout"]["zero"] == 3 for c in amp)
    best = plan["recommendation"]
    assert best["precision"] in BF16_RECIPES and best["fp8"] == "torchao-rowwise"
    pruned = plan_json(*PLAN, "--hardware", "h100-sxm")  # what could not tie with it left out: the same pick
    assert pruned["recommendation"] == best and len(pruned["candidates"]) < len(plan["candidates"])


def test_no_fp8_recipe_is_tried_on_a_gpu_without_fp8_units(plan_json):
    candidates = plan_json(*PLAN, "--hardware", "a100-sxm-80gb", "--exhaustive")["candidates"]
    assert {c["fp8"] for c in candidates} == {"off"}
    assert {c["precision"] for c in candidates} == set(BF16_RECIPES)


def test_the_text_names_the_search_and_each_candidates_recipes(run_cli, plan_json):
    result = run_cli("plan", *PLAN, "--hardware", "h100-sxm", "--top", "4")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    # the header is wrapped at the terminal's width: its words, in order
    assert "precision recipes searched (each with the fp8 recipes the stack runs)" in " ".join(text.split())
    header = next(line for line in text.splitlines() if line.lstrip().startswith("#  micro"))
    assert "recipe" in header.split()
    rows = text.split(header, 1)[1].strip().split("\n\n", 1)[0].splitlines()  # the table, up to its blank line
    assert rows and all(any(f"{p} + " in row for p in BF16_RECIPES) for row in rows)
    best = plan_json(*PLAN, "--hardware", "h100-sxm")["recommendation"]
    recommendation = " ".join(text.split("recommendation:", 1)[1].split("tokens/s", 1)[0].split())
    assert f"recompute {best['recompute']}, fp8 {best['fp8']}, {best['precision']} " in recommendation


def test_a_pinned_configuration_with_the_precision_searched_is_one_candidate_a_recipe(plan_json):
    plan = plan_json("--model", "llama3.2-1b", "--seq-len", "4096", "--global-batch", "8", "--hardware",
                     "a100-sxm-80gb", "--precision", "auto", "--micro-batch", "2", "--recompute", "full")
    assert plan["pinned"] is None
    assert sorted(c["precision"] for c in plan["candidates"] + plan["rejected"]) == sorted(BF16_RECIPES)


@pytest.mark.parametrize("command", [("estimate", "--model", "llama3.2-1b"), ("agent", "train")])
def test_only_the_planner_takes_auto(run_cli, command):
    result = run_cli(*command, "--precision", "auto")
    assert result.returncode == 2
    assert "invalid choice: 'auto'" in result.stderr
