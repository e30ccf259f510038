"""Exported settings parse in their own format, as is, carry the plan's layout, and say what they cannot express."""

import ast
import json
import math
import shlex
import subprocess

import pytest

from headroom.core.errors import ConfigError
from headroom.core.exports import EXPORTERS, Export, export
from headroom.core.measured.calibration import uncalibrated
from headroom.core.planning.planner import PlanRequest, evaluate, plan
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.timing.step import datasheet_profile

PROFILE = datasheet_profile(get_hardware("h100-sxm"))
LLAMA = get_preset("llama2-7b")  # 32 layers
LLAMA3 = get_preset("llama3-8b")  # a torchtitan recipe's model

REQUEST = PlanRequest(spec=LLAMA, train=TrainConfig(seq_len=4096, layout=Layout(dp=8, zero=3)), global_batch=64)
BEST = plan(REQUEST, PROFILE).recommendation

PARALLEL = PlanRequest(spec=LLAMA, train=TrainConfig(seq_len=4096, layout=Layout(tp=2, sp=True, pp=2, dp=2, zero=1)),
                       global_batch=64)
PARALLEL_BEST = plan(PARALLEL, PROFILE).recommendation

PARSE = {
    "hf": ast.parse,
    "lightning": ast.parse,
    "torchtitan": lambda text: torchtitan_command(text),
    "deepspeed": json.loads,
    "megatron": shlex.split,
}


def candidate(layout: Layout, policy: str = "none", micro_batch: int = 1, global_batch: int = 64, spec=LLAMA,
              **train):
    """One candidate of a request on ``layout``: that micro-batch under that checkpoint policy."""
    request = PlanRequest(spec=spec, train=TrainConfig(seq_len=train.pop("seq_len", 4096), layout=layout, **train),
                          global_batch=global_batch)
    return request, evaluate(request, PROFILE, uncalibrated(PROFILE.name), micro_batch, parse_policy(policy))


def flags(text: str) -> dict[str, str | None]:
    """A Megatron command line as {flag: its value, or None for a switch}."""
    args, out = shlex.split(text), {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            out[arg] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def torchtitan_command(text: str) -> tuple[list[str], dict[str, str | None], str]:
    """The exported script as bash runs it, with ``torchrun`` a function that prints its arguments:
    (torchrun's own arguments up to the module, {torchtitan field: value, None for a switch, or its values
    joined by spaces where it takes several}, subcommand)."""
    shell = subprocess.run(["bash", "-c", 'torchrun() { printf "%s\\0" "$@"; }\neval "$1"', "headroom", text],
                           capture_output=True, text=True, check=True, timeout=10)
    args = shell.stdout.split("\0")[:-1]
    split = args.index("torchtitan.train") + 1
    fields, rest = {}, args[split:-1]
    for i, arg in enumerate(rest):
        if arg.startswith("--"):
            values = []
            for nxt in rest[i + 1:]:
                if nxt.startswith("--"):
                    break
                values.append(nxt)
            fields[arg[2:]] = " ".join(values) if values else None
    return args[:split], fields, args[-1]


def training_arguments(text: str) -> dict:
    """The keyword arguments of the snippet's TrainingArguments(...) call, evaluated."""
    call = next(n for n in ast.walk(ast.parse(text))
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "TrainingArguments")
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords}


def trainer_arguments(text: str) -> dict[str, str]:
    """The keyword arguments of the snippet's L.Trainer(...) call, as source."""
    call = next(n for n in ast.walk(ast.parse(text))
                if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "Trainer")
    return {k.arg: ast.unparse(k.value) for k in call.keywords}


CASES = {
    "zero3": (REQUEST, BEST),
    "tp-sp-pp-zero1": (PARALLEL, PARALLEL_BEST),
    "interleaved-every2-shard-grad-op": candidate(Layout(pp=4, schedule="interleaved", virtual_stages=2, dp=2, zero=3,
                                                         reshard_after_forward=False), "every-2"),
    "cp-op-selective-bf16-pure": candidate(Layout(cp=2, dp=4, zero=3), "op-selective", precision="bf16-pure"),
    "gpipe-selective-standard": candidate(Layout(pp=2, schedule="gpipe", dp=4), "selective", attention="standard",
                                          precision="bf16-master"),
    "single-offload-fp32-sgd": candidate(Layout(), "offload", global_batch=8, precision="fp32",
                                         optimizer="sgd-momentum"),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("fmt", PARSE)
def test_every_format_parses_as_is_and_keeps_its_notes(fmt, case):
    exported = export(fmt, *CASES[case])
    assert isinstance(exported, Export) and exported.format == fmt
    PARSE[fmt](exported.text)  # no pre-processing: a trailing comment in JSON would fail here
    assert exported.notes_in_text == (fmt in ("hf", "torchtitan", "lightning"))
    if exported.notes_in_text:
        for note in exported.notes:
            assert f"# note: {note}" in exported.text
    assert str(exported) == exported.text
    layout = CASES[case][1].layout
    unexpressed = tuple(axis for axis in NO_SETTING[fmt] if getattr(layout, axis) > 1)
    assert exported.unexpressed == unexpressed
    assert all(any(f"{axis} {getattr(layout, axis)}" in note for note in exported.notes) for axis in unexpressed)
    assert exported.to_dict() == {"format": fmt, "text": exported.text, "notes": list(exported.notes),
                                  "unexpressed": list(unexpressed)}


NO_SETTING = {"hf": ("tp", "pp", "cp", "ep"), "torchtitan": (), "megatron": (), "deepspeed": ("pp", "cp", "ep"),
              "lightning": ("pp", "cp", "ep")}
"""The layout axes each format has no setting for: the HF Trainer none of tp (set when the model loads), pp, cp,
ep; DeepSpeed's config no pipeline (a PipelineModule in code), experts (deepspeed.moe in code) or ring attention;
Lightning no pipeline, context or expert strategy."""


def test_megatron_carries_the_layout():
    args = flags(export("megatron", PARALLEL, PARALLEL_BEST).text)
    assert args["--tensor-model-parallel-size"] == "2"
    assert "--sequence-parallel" in args and args["--sequence-parallel"] is None
    assert args["--pipeline-model-parallel-size"] == "2"
    assert args["--context-parallel-size"] == "1"
    assert "--use-distributed-optimizer" in args and "--use-megatron-fsdp" not in args  # ZeRO-1 exactly
    assert args["--micro-batch-size"] == str(PARALLEL_BEST.config.micro_batch)
    assert args["--global-batch-size"] == "64"
    assert args["--seq-length"] == "4096"
    assert "--num-layers-per-virtual-pipeline-stage" not in args


def test_megatron_interleaving_segments_and_zero3():
    request, best = candidate(Layout(pp=4, schedule="interleaved", virtual_stages=2, dp=2, zero=3), "every-2",
                              precision="bf16-fp32grad")
    exported = export("megatron", request, best)
    args = flags(exported.text)
    assert args["--num-layers-per-virtual-pipeline-stage"] == "4"  # 32 layers / (pp 4 x 2 chunks)
    assert (args["--recompute-granularity"], args["--recompute-method"], args["--recompute-num-layers"]) == (
        "full", "uniform", "2")
    assert args["--use-megatron-fsdp"] is None and args["--data-parallel-sharding-strategy"] == "optim_grads_params"
    assert args["--ckpt-format"] == "fsdp_dtensor"
    assert "--bf16" in args and "--grad-reduce-in-bf16" not in args  # bf16-fp32grad is Megatron's own --bf16
    assert any("ZeRO-1" in n and "Megatron-FSDP" in n for n in exported.notes)
    assert any("launch 8 ranks" in n for n in exported.notes)


@pytest.mark.parametrize("policy, expected, note", [
    ("none", {}, None),
    ("full", {"--recompute-granularity": "full", "--recompute-method": "uniform", "--recompute-num-layers": "1"}, None),
    ("selective", {"--recompute-granularity": "selective", "--recompute-modules": "core_attn"}, None),
    ("op-selective", {"--recompute-granularity": "selective", "--recompute-modules": "layernorm"}, "op-level"),
    ("offload", {}, "offload"),
])
def test_megatron_recompute(policy, expected, note):
    # Megatron's own precision, and its stack where it offers the policy (op-selective: the reference's).
    stack = "reference" if policy == "op-selective" else "megatron"
    exported = export("megatron", *candidate(Layout(dp=8), policy, precision="bf16-fp32grad", stack=stack))
    args = flags(exported.text)
    assert {k: v for k, v in args.items() if k.startswith("--recompute")} == expected
    assert any(note in n for n in exported.notes) if note else len(exported.notes) == 1  # just the launch note


@pytest.mark.parametrize(("framework", "stack", "name"), [("megatron", "megatron", "Megatron-LM"),
                                                          ("hf", "hf", "transformers")])
def test_a_plan_on_another_stacks_kernels_says_to_replan_with_the_frameworks(framework, stack, name):
    """Megatron's fused kernels and transformers' modules keep other tensors than the reference decoder's."""
    notes = export(framework, *candidate(Layout(dp=8), "full", precision="bf16-pure")).notes
    assert (f"planned with the reference stack's kernels, but {name} follows the {stack} stack's: re-plan with "
            f"--stack {stack} for its activation memory") in notes
    assert not [n for n in export(framework, *candidate(Layout(dp=8), "full", precision="bf16-pure",
                                                        stack=stack)).notes if "re-plan with --stack" in n]


def test_megatron_writes_dropout_and_precision_it_cannot_match():
    # Megatron's dropouts default to 0.1: 0 must be said.
    args = flags(export("megatron", *candidate(Layout(dp=8))).text)
    assert args["--attention-dropout"] == "0" and args["--hidden-dropout"] == "0"
    request, best = candidate(Layout(dp=8), spec=get_preset("gpt2-small"), seq_len=1024, dropout=0.1,
                              precision="bf16-pure", attention="standard")
    exported = export("megatron", request, best)
    args = flags(exported.text)
    assert args["--attention-dropout"] == "0.1" and args["--hidden-dropout"] == "0.1"
    assert args["--attention-backend"] == "unfused"
    assert "--grad-reduce-in-bf16" in args and any("fp32 master copy" in n for n in exported.notes)


def test_torchtitan_carries_the_layout():
    exported = export("torchtitan", PARALLEL, PARALLEL_BEST)
    launch, fields, checkpoint = torchtitan_command(exported.text)
    assert launch == ["--nproc-per-node", "8", "-m", "torchtitan.train"]
    assert (fields["module"], fields["config"]) == ("llama3", "llama3_8b")  # no llama2 recipe: a stand-in, noted
    assert any("no recipe for llama2-7b" in n and "32 layers, dim 4096" in n for n in exported.notes)
    p = {k.removeprefix("parallelism."): v for k, v in fields.items() if k.startswith("parallelism.")}
    t = {k.removeprefix("training."): v for k, v in fields.items() if k.startswith("training.")}
    assert (p["tensor_parallel_degree"], p["pipeline_parallel_degree"], p["context_parallel_degree"]) == ("2", "2", "1")
    assert p["pipeline_parallel_schedule"] == "1F1B" and "no-enable-sequence-parallel" not in p  # sp planned
    # torchtitan has no ZeRO-1: FSDP over the 2 data-parallel ranks, said in a note.
    assert (p["data_parallel_replicate_degree"], p["data_parallel_shard_degree"]) == ("1", "2")
    assert any("no ZeRO-1" in n for n in exported.notes)
    degrees = ("data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
               "pipeline_parallel_degree", "context_parallel_degree")
    assert math.prod(int(p[d]) for d in degrees) == 8
    # One optimizer step is one pipeline flush: the per-rank batch split into micro-batches.
    micro, accumulation = PARALLEL_BEST.config.micro_batch, PARALLEL_BEST.accumulation_steps
    assert t["local_batch_size"] == str(micro * accumulation) and p["pipeline_parallel_microbatch_size"] == str(micro)
    assert (t["global_batch_size"], t["seq_len"]) == ("64", "4096")
    # 16 blocks a stage, which torchtitan's own split gives too (the embedding and head counted a block each)
    assert not {"pipeline_parallel_layers_per_stage", "module_fqns_per_model_part"} & set(p)
    assert checkpoint == "activation-checkpoint:none"


def test_torchtitan_names_the_recipe_of_the_same_model_and_launches_by_node():
    request, best = candidate(Layout(tp=2, sp=False, dp=8, zero=3), spec=get_preset("llama3-70b"))
    exported = export("torchtitan", request, best)
    launch, fields, _ = torchtitan_command(exported.text)
    assert launch[:4] == ["--nnodes", "2", "--nproc-per-node", "8"]
    assert (fields["module"], fields["config"]) == ("llama3", "llama3_70b")
    assert fields["parallelism.no-enable-sequence-parallel"] is None  # tensor parallelism without sp, as planned
    assert not any("recipe" in n for n in exported.notes)


@pytest.mark.parametrize("layout, replicate, shard, noted", [
    (Layout(dp=8), 8, 1, False),
    (Layout(dp=8, zero=3), 1, 8, False),
    (Layout(dp=8, zero=3, reshard_after_forward=False), 1, 8, False),
    (Layout(tp=2, dp=4), 1, 4, True),  # torchtitan replicates only when data parallelism is its one axis
    (Layout(cp=2, dp=4), 4, 1, True),  # HSDP: FSDP over the cp ranks, said in a note
])
def test_torchtitan_data_parallel_degrees(layout, replicate, shard, noted):
    exported = export("torchtitan", *candidate(layout, spec=LLAMA3))
    _, fields, _ = torchtitan_command(exported.text)
    degrees = fields["parallelism.data_parallel_replicate_degree"], fields["parallelism.data_parallel_shard_degree"]
    assert degrees == (str(replicate), str(shard))
    assert bool(exported.notes) == noted


@pytest.mark.parametrize("layout, schedule, layers", [
    (Layout(pp=4, schedule="interleaved", virtual_stages=2, dp=2), "Interleaved1F1B", 4),
    (Layout(pp=4, schedule="gpipe", dp=2), "GPipe", 8),
    (Layout(pp=2, schedule="gpipe", dp=4), "GPipe", None),  # 16 and 16: torchtitan's own split
])
def test_torchtitan_pipeline_schedules(layout, schedule, layers):
    """The plan's even split (the reference stack's) is torchtitan's own where that gives the same counts, else
    set as layers per stage with the embedding and head counted as none."""
    _, fields, _ = torchtitan_command(export("torchtitan", *candidate(layout)).text)
    assert fields["parallelism.pipeline_parallel_schedule"] == schedule
    split = ("parallelism.pipeline_parallel_layers_per_stage", "parallelism.pipeline_parallel_first_stage_less_layers",
             "parallelism.pipeline_parallel_last_stage_less_layers")
    if layers is None:
        assert not set(split) & set(fields)
    else:
        assert [fields[name] for name in split] == [str(layers), "0", "0"]


@pytest.mark.parametrize("policy, stack, subcommand, note", [
    ("none", "torch", "none", None),
    ("full", "torch", "full", "reruns each block whole (no early stop)"),
    ("full", "torchtitan", "full", None),  # planned with torchtitan's own checkpointing: nothing to say
    ("op-selective", "torch", "selective", "every second matmul"),
    ("op-selective", "torchtitan", "selective", None),
    ("every-4", "torch", "full", "every-4"),
    ("selective", "torch", "none", "attention core"),
])
def test_torchtitan_checkpointing(policy, stack, subcommand, note):
    exported = export("torchtitan", *candidate(Layout(dp=8, zero=3), policy, spec=LLAMA3, stack=stack))
    assert torchtitan_command(exported.text)[2] == f"activation-checkpoint:{subcommand}"
    assert any(note in n for n in exported.notes) if note else not exported.notes


def test_deepspeed_is_strict_json():
    exported = export("deepspeed", REQUEST, BEST)
    config = json.loads(exported.text)
    assert config["train_batch_size"] == 64
    assert config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * 8 == 64
    assert config["zero_optimization"]["stage"] == 3
    # amp-bf16 is autocast over fp32 parameters, not DeepSpeed's bf16 (bf16 parameters, fp32 master copy).
    assert config["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"} and "bf16" not in config
    assert not exported.notes_in_text


def test_deepspeed_says_what_its_config_cannot_express():
    exported = export("deepspeed", PARALLEL, PARALLEL_BEST)
    config = json.loads(exported.text)
    assert config["tensor_parallel"] == {"autotp_size": 2}
    notes = " ".join(exported.notes)
    assert "pipeline parallelism" in notes and "without sequence parallelism" in notes
    request, best = candidate(Layout(cp=2, dp=4, zero=3), "op-selective", precision="bf16-pure")
    exported = export("deepspeed", request, best)
    config = json.loads(exported.text)
    assert config["bf16"] == {"enabled": True}
    notes = " ".join(exported.notes)
    assert "context parallelism" in notes and "master copy" in notes and "no op-level selection" in notes


@pytest.mark.parametrize("zero, grad_accum", [(1, "fp32"), (2, None)])
def test_deepspeed_fp32_gradients_only_under_zero1(zero, grad_accum):
    exported = export("deepspeed", *candidate(Layout(dp=8, zero=zero), "full", precision="bf16-fp32grad",
                                              stack="megatron"))
    config = json.loads(exported.text)
    assert config.get("data_types", {}).get("grad_accum_dtype") == grad_accum
    assert any("deepspeed.checkpointing.checkpoint" in n for n in exported.notes)
    assert any("only under ZeRO-1" in n for n in exported.notes) == (grad_accum is None)


def test_hf_sharding_and_whole_layer_checkpointing():
    kwargs = training_arguments(export("hf", *candidate(Layout(dp=8, zero=3), "full")).text)
    # Under FSDP the Trainer checkpoints through fsdp_config and refuses gradient_checkpointing with it.
    assert kwargs["fsdp"] == "full_shard auto_wrap" and kwargs["fsdp_config"] == {"activation_checkpointing": True}
    assert kwargs["gradient_checkpointing"] is False
    kwargs = training_arguments(export("hf", *candidate(Layout(dp=8), "full")).text)
    assert kwargs["gradient_checkpointing"] is True and "fsdp" not in kwargs
    kwargs = training_arguments(export("hf", *candidate(Layout(dp=8, zero=1))).text)
    assert kwargs["deepspeed"] == "ds_config.json"
    # ZeRO-2 is DeepSpeed's too (the hf stack's); FSDP's shard_grad_op is ZeRO-3 kept gathered to backward
    exported = export("hf", *candidate(Layout(dp=8, zero=2), stack="hf"))
    assert training_arguments(exported.text)["deepspeed"] == "ds_config.json" and "fsdp" not in exported.text
    assert any("ZeRO-2 runs through DeepSpeed" in note for note in exported.notes)
    kwargs = training_arguments(export("hf", *candidate(Layout(dp=8, zero=3, reshard_after_forward=False))).text)
    assert kwargs["fsdp"] == "shard_grad_op auto_wrap"


def test_fsdp_kept_from_forward_to_backward_is_carried_or_noted_where_zero_3_regathers():
    """A shard kept over k ranks is ZeRO++'s secondary partition in DeepSpeed; kept whole (SHARD_GRAD_OP), DeepSpeed
    and Megatron-FSDP have no per-unit setting, which the export says; resharded, nothing to say."""
    exported = export("deepspeed", *candidate(Layout(dp=8, zero=3, reshard_after_forward=2), stack="hf"))
    assert json.loads(exported.text)["zero_optimization"] == {"stage": 3, "zero_hpz_partition_size": 2}
    assert any(note.startswith("zero_hpz_partition_size 2: ZeRO++'s secondary partition") for note in exported.notes)
    kept = candidate(Layout(dp=8, zero=3, reshard_after_forward=False))
    exported = export("deepspeed", *kept)
    assert json.loads(exported.text)["zero_optimization"] == {"stage": 3}
    assert any("stage3_max_reuse_distance and under stage3_max_live_parameters" in note for note in exported.notes)
    megatron = export("megatron", *kept)
    assert "--data-parallel-sharding-strategy optim_grads_params" in megatron.text
    assert any("Megatron-FSDP's optim_grads_params frees each after its forward" in n for n in megatron.notes)
    resharded = candidate(Layout(dp=8, zero=3))
    for fmt in ("deepspeed", "megatron"):
        assert not any("SHARD_GRAD_OP" in note or "hpz" in note for note in export(fmt, *resharded).notes)


def test_hf_does_not_pass_op_selective_off_as_full():
    exported = export("hf", *candidate(Layout(dp=8), "op-selective"))
    assert training_arguments(exported.text)["gradient_checkpointing"] is False
    assert "create_selective_checkpoint_contexts" in exported.text and "context_fn" in exported.text
    assert any("whole layers" in n for n in exported.notes)
    exported = export("hf", *candidate(Layout(dp=8), "every-4"))
    assert training_arguments(exported.text)["gradient_checkpointing"] is True
    assert any("every-4" in n for n in exported.notes)


def test_hf_names_the_attention_implementation_the_plan_counts():
    """sdpa is transformers' default; eager attention (--attention standard) must be asked for, and Gemma 2, which
    SDPA cannot soft-cap, runs flash attention only through FlashAttention 2."""
    from headroom.core.specs.hf_config import load_hf_config
    from tests.conftest import FIXTURES

    gemma2 = load_hf_config(FIXTURES / "hf" / "gemma-2-9b.json")
    notes = {(spec.name, attention): [n for n in export("hf", *candidate(
                 Layout(dp=8), "full", spec=spec, seq_len=4096, precision="bf16-pure", stack="hf",
                 attention=attention)).notes if "attn_implementation" in n]
             for spec in (LLAMA, gemma2) for attention in ("flash", "standard")}
    eager = ('load the model with attn_implementation="eager": the plan counts transformers\' eager attention '
             "(--attention standard), which keeps the s x s scores")
    assert notes == {
        ("llama2-7b", "flash"): [], ("llama2-7b", "standard"): [eager], ("google/gemma-2-9b", "standard"): [eager],
        ("google/gemma-2-9b", "flash"): [
            'load the model with attn_implementation="flash_attention_2" (pip install flash-attn): SDPA cannot '
            "soft-cap google/gemma-2-9b's attention scores, so transformers refuses sdpa for it and would run its "
            "eager attention, whose s x s scores the plan (--attention flash) does not count"]}


def test_hf_says_it_cannot_express_model_parallelism():
    exported = export("hf", PARALLEL, PARALLEL_BEST)
    assert any("cannot express tp 2, pp 2" in n for n in exported.notes)
    assert any("no pipeline parallelism" in n for n in exported.notes)
    assert any(n.startswith("transformers' tensor parallelism has no sequence parallelism") for n in exported.notes)


def test_lightning_strategies():
    args = trainer_arguments(export("lightning", *candidate(Layout(dp=8, zero=3), "full")).text)
    assert args["strategy"] == "FSDPStrategy(sharding_strategy='FULL_SHARD', activation_checkpointing_policy={Block})"
    assert (args["devices"], args["num_nodes"]) == ("8", "1")
    # plain PyTorch's ZeRO-2, FSDP kept gathered to backward, is FSDP1's SHARD_GRAD_OP
    kept = Layout(dp=16, zero=3, reshard_after_forward=False)
    args = trainer_arguments(export("lightning", *candidate(kept, global_batch=128)).text)
    assert args["strategy"] == "FSDPStrategy(sharding_strategy='SHARD_GRAD_OP')"
    assert (args["devices"], args["num_nodes"]) == ("8", "2")
    exported = export("lightning", *candidate(Layout(dp=16, zero=3, reshard_after_forward=2), global_batch=128))
    assert trainer_arguments(exported.text)["strategy"] == "FSDPStrategy(sharding_strategy='FULL_SHARD')"
    assert any("cannot keep a shard over 2 ranks" in note for note in exported.notes)
    # the HF Trainer's ZeRO-2 is DeepSpeed's, and so is Lightning's
    args = trainer_arguments(export("lightning", *candidate(Layout(dp=8, zero=2), stack="hf")).text)
    assert args["strategy"] == "DeepSpeedStrategy(stage=2)"
    exported = export("lightning", PARALLEL, PARALLEL_BEST)
    args = trainer_arguments(exported.text)
    # tp 2 x pp 2 x dp 2: Lightning has no pipeline, so the pipeline's ranks are data-parallel to it
    assert args["strategy"] == "ModelParallelStrategy(data_parallel_size=4, tensor_parallel_size=2)"
    assert any("pp 2 cannot be expressed" in n for n in exported.notes)


def test_export_uses_the_searched_layout_not_the_requests():
    request = PlanRequest(spec=LLAMA, train=TrainConfig(seq_len=4096), global_batch=64, gpus=8)
    best = plan(request, PROFILE).recommendation
    assert best.layout.world == 8 and request.layout.world == 1
    args = flags(export("megatron", request, best).text)
    assert args["--tensor-model-parallel-size"] == str(best.layout.tp)
    assert args["--pipeline-model-parallel-size"] == str(best.layout.pp)
    assert int(args["--micro-batch-size"]) * best.accumulation_steps * best.layout.dp == 64


def test_a_candidate_of_another_request_is_refused():
    with pytest.raises(ConfigError, match="is not the request's global batch 128"):
        export("megatron", PlanRequest(spec=LLAMA, train=TrainConfig(seq_len=4096, layout=Layout(dp=8, zero=3)),
                                       global_batch=128), BEST)


def test_unknown_format():
    assert list(EXPORTERS) == ["hf", "torchtitan", "megatron", "deepspeed", "lightning"]
    valid = "hf, torchtitan, megatron, deepspeed, lightning"
    with pytest.raises(ConfigError, match=f"unknown export format 'axolotl'; valid: {valid}"):
        export("axolotl", REQUEST, BEST)


def _lightning_batch(text: str) -> tuple[int, int, str]:
    """(DataLoader batch_size, accumulate_grad_batches, the strategy's source) of a Lightning export."""
    tree = ast.parse(text)
    calls = {getattr(n.func, "id", None) or getattr(n.func, "attr", None): n for n in ast.walk(tree)
             if isinstance(n, ast.Call)}
    loader = {k.arg: ast.literal_eval(k.value) for k in calls["DataLoader"].keywords}
    trainer = {k.arg: k.value for k in calls["Trainer"].keywords}
    return loader["batch_size"], ast.literal_eval(trainer["accumulate_grad_batches"]), ast.unparse(trainer["strategy"])


BATCH_LAYOUTS = {  # layout, global batch: the ranks DeepSpeed and Lightning count as data-parallel differ from dp
    "pp 8, cp 4 on 64": (Layout(pp=8, cp=4, dp=2, zero=3), 64),
    "tp 2, pp 2 on 16": (Layout(tp=2, sp=True, pp=2, dp=4, zero=1), 64),
    "dp 8 (as planned)": (Layout(dp=8, zero=3), 64),
    "pp 4 on 8, batch 6": (Layout(pp=4, dp=2), 6),
}


@pytest.mark.parametrize("case", BATCH_LAYOUTS)
def test_the_batch_arithmetic_is_what_the_framework_checks(case):
    """DeepSpeed refuses a config whose train_batch_size is not micro x accumulation x its data-parallel ranks
    (every rank outside a tensor-parallel group, as its config cannot carry a pipeline or ring attention);
    Lightning and the HF Trainer train micro x accumulation x their data-parallel ranks, whatever the plan said."""
    layout, global_batch = BATCH_LAYOUTS[case]
    request, best = candidate(layout, global_batch=global_batch, spec=get_preset("llama3-70b"), seq_len=8192)
    counted = layout.world // layout.tp
    config = json.loads(export("deepspeed", request, best).text)
    micro, accumulation = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    assert (micro, accumulation) == (best.config.micro_batch, best.accumulation_steps)
    if layout.pp == layout.cp == 1:
        assert config["train_batch_size"] == micro * accumulation * counted == global_batch
    else:
        assert "train_batch_size" not in config  # inferred by DeepSpeed from the two, never refused
        note = next(n for n in export("deepspeed", request, best).notes if n.startswith("train_batch_size"))
        assert f"it trains {micro * accumulation * counted:,}" in note
    lightning = export("lightning", request, best)
    batch, accumulate, strategy = _lightning_batch(lightning.text)
    hf = export("hf", request, best)
    arguments = training_arguments(hf.text)
    for exported, (micro, steps) in ((lightning, (batch, accumulate)), (hf, (
            arguments["per_device_train_batch_size"], arguments["gradient_accumulation_steps"]))):
        if global_batch % counted == 0:  # the batch asked for, in micro-batches no larger than planned
            assert micro * steps * counted == global_batch and micro <= best.config.micro_batch
        else:  # 6 sequences over 8 ranks: cannot be kept, and the note says what it trains instead
            assert (micro, steps) == (best.config.micro_batch, best.accumulation_steps)
            assert any(f"trains {micro * steps * counted:,} sequences a step; plan a multiple of {counted}" in n
                       for n in exported.notes)
    if layout.tp > 1:
        assert f"data_parallel_size={counted}, tensor_parallel_size={layout.tp}" in strategy
