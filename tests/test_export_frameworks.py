"""Every export loads in its own framework, as the framework reads it: DeepSpeed's config classes,
transformers' TrainingArguments, Lightning's Trainer and strategies, torchtitan 0.3's config manager.

The frameworks are the ``frameworks`` extra (CI installs it). What stands in for the target machine
is said where it is done: a launched job's rank and data-parallel size for DeepSpeed, a bf16-capable
GPU for transformers; the exported text itself is never edited.
"""

from __future__ import annotations

import ast
import json
import warnings

import pytest

from headroom.core.exports import export
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.stages import chunk_layers
from tests.test_export import CASES, LLAMA3, candidate, torchtitan_command

MISSING = "the training frameworks the exports are checked against: pip install -e '.[frameworks]'"


@pytest.fixture(autouse=True)
def _quiet_frameworks():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # their deprecation chatter is theirs, not the export's
        yield


@pytest.mark.parametrize("case", CASES)
def test_deepspeed_config_loads(case, monkeypatch):
    pytest.importorskip("deepspeed", reason=MISSING)
    from deepspeed.runtime import config as ds_config

    request, best = CASES[case]
    data_parallel = best.config.layout.dp

    class DataParallel:
        """DeepSpeed's model-parallel unit, as Megatron passes one: the data-parallel ranks the batch spans."""

        def get_data_parallel_world_size(self) -> int:
            return data_parallel

    # Rank 0 of a launched job: outside one, DeepSpeed's rank query fails and it takes a world of 1.
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda group=None: 0)
    loaded = ds_config.DeepSpeedConfig(json.loads(export("deepspeed", request, best).text), mpu=DataParallel())
    assert loaded.world_size == data_parallel
    assert loaded.train_batch_size == request.global_batch
    assert loaded.train_micro_batch_size_per_gpu == best.config.micro_batch
    assert loaded.gradient_accumulation_steps == best.accumulation_steps
    assert loaded.zero_optimization_stage == best.config.layout.zero


def test_deepspeed_rejects_what_it_does_not_know(monkeypatch):
    """The loader above is strict: a key DeepSpeed does not define fails, so passing means something."""
    pytest.importorskip("deepspeed", reason=MISSING)
    from deepspeed.runtime import config as ds_config

    config = json.loads(export("deepspeed", *CASES["zero3"]).text)
    config["zero_optimization"]["stages"] = 3
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda group=None: 0)
    with pytest.raises(Exception, match="stages"):
        ds_config.DeepSpeedConfig(config)


def _tiny_hf_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=128))


@pytest.mark.parametrize("case", CASES)
def test_training_arguments_load(case, monkeypatch, tmp_path):
    pytest.importorskip("transformers", reason=MISSING)
    import torch
    import transformers.training_args

    request, best = CASES[case]
    # The target is a bf16-capable GPU; this CPU is not, and TrainingArguments checks the machine it runs on.
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.chdir(tmp_path)
    if best.config.layout.zero in (1, 2):  # the snippet names the DeepSpeed export, saved as the user is told
        (tmp_path / "ds_config.json").write_text(export("deepspeed", request, best).text)
    model = _tiny_hf_model()
    namespace = {"model": model}  # the user's model, for snippets that configure its checkpointing
    exec(compile(export("hf", request, best).text, "training_args.py", "exec"), namespace)
    args = namespace["args"]
    counted = best.layout.world // best.layout.tp  # the Trainer's data-parallel ranks: it has no pipeline or context
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * counted == request.global_batch
    assert args.bf16 == (best.config.precision != "fp32")
    if model.is_gradient_checkpointing:  # the op-selective policy set on the model runs a step
        model.train()
        model(torch.randint(0, 128, (2, 8)), labels=torch.randint(0, 128, (2, 8))).loss.backward()


def test_a_liger_plan_turns_liger_on(monkeypatch):
    """The hf-liger stack's plan sets the switch whose kernels it accounts for (tests/test_liger_stack.py)."""
    pytest.importorskip("transformers", reason=MISSING)
    import transformers.training_args

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    exported = export("hf", *candidate(Layout(dp=8, zero=3), "full", stack="hf-liger"))
    namespace: dict = {}
    exec(compile(exported.text, "training_args.py", "exec"), namespace)
    assert namespace["args"].use_liger_kernel is True
    assert not [n for n in exported.notes if "re-plan with --stack" in n]
    plain = export("hf", *candidate(Layout(dp=8, zero=3), "full", stack="hf"))
    assert "use_liger_kernel" not in plain.text


GPU_ONLY = "requires a GPU accelerator"
"""Lightning's refusal to build an FSDP Trainer on a machine without a GPU."""


@pytest.mark.parametrize("case", CASES)
def test_lightning_trainer_loads(case):
    pytest.importorskip("lightning", reason=MISSING)
    import inspect

    import lightning as L
    import torch

    request, best = CASES[case]
    text = export("lightning", request, best).text
    counted = best.layout.world // best.layout.tp  # Lightning's data-parallel ranks: it has no pipeline or context

    def trains(accumulate: int) -> int:
        return namespace["loader"].batch_size * accumulate * counted

    class Block(torch.nn.Module):
        """The user's transformer block, which the snippet's checkpointing policy names."""

    namespace = {"dataset": list(range(8)), "Block": Block}
    try:
        exec(compile(text, "lightning_trainer.py", "exec"), namespace)
        assert trains(namespace["trainer"].accumulate_grad_batches) == request.global_batch
    except ValueError as err:
        # FSDP needs a GPU to build its Trainer: check the call against Trainer's signature instead, with every
        # argument (the strategy object included) evaluated as Lightning builds it.
        assert GPU_ONLY in str(err), err
        call = next(n for n in ast.walk(ast.parse(text))
                    if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "Trainer")
        kwargs = {k.arg: eval(compile(ast.Expression(k.value), "<arg>", "eval"), namespace) for k in call.keywords}
        inspect.signature(L.Trainer).bind(**kwargs)
        assert trains(kwargs["accumulate_grad_batches"]) == request.global_batch


@pytest.fixture(scope="module")
def torchtitan_config():
    """torchtitan 0.3's own parser: the launch command's arguments after ``-m torchtitan.train``."""
    pytest.importorskip("torchtitan", reason=MISSING)
    pytest.importorskip("triton", reason=MISSING)  # torchtitan's model registry imports it
    from torchtitan.config.manager import ConfigManager

    def load(text: str):
        _, fields, subcommand = torchtitan_command(text)
        args = []
        for name, value in fields.items():
            args += [f"--{name}"] if value is None else [f"--{name}", *value.split(" ")]
        return ConfigManager().parse_args([*args, subcommand])

    return load


TORCHTITAN_CASES = {
    **{name: CASES[name] for name in ("zero3", "tp-sp-pp-zero1", "interleaved-every2-shard-grad-op")},
    "llama3-8b-tp-no-sp-full": candidate(Layout(tp=2, dp=4, zero=3), "full", spec=LLAMA3),
    "mixtral-ep4-full": candidate(Layout(dp=16, zero=3, ep=4), "full", spec=get_preset("mixtral-8x7b")),
}


@pytest.mark.parametrize("case", TORCHTITAN_CASES)
def test_torchtitan_command_loads(case, torchtitan_config):
    request, best = TORCHTITAN_CASES[case]
    exported = export("torchtitan", request, best)
    config = torchtitan_config(exported.text)
    layout = best.config.layout
    p, t = config.parallelism, config.training
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree,
            p.expert_parallel_degree) == (layout.tp, layout.pp, layout.cp, layout.ep)
    assert p.data_parallel_replicate_degree * p.data_parallel_shard_degree == layout.dp
    assert p.enable_sequence_parallel == (layout.sp or layout.tp == 1)
    assert t.global_batch_size == request.global_batch and t.seq_len == best.config.seq_len
    per_rank = best.config.micro_batch * best.accumulation_steps
    assert t.local_batch_size == (per_rank if layout.pp > 1 else best.config.micro_batch)
    if layout.reshard_after_forward is False:
        assert p.fsdp_reshard_after_forward == "never"
    policy = torchtitan_command(exported.text)[2].removeprefix("activation-checkpoint:")
    loaded = config.activation_checkpoint
    assert (type(loaded).__qualname__ if loaded else None) == AC_CONFIGS[policy]


@pytest.mark.parametrize("n_layers, pp, v", [(32, 4, 1), (126, 16, 1), (80, 8, 2), (32, 4, 2), (2, 2, 1), (61, 5, 1)])
def test_the_torchtitan_stack_splits_the_layers_as_torchtitan_does(n_layers, pp, v):
    """The torchtitan stack's split (headroom.core.specs.stages) is what torchtitan 0.3's own splitter gives with
    its default weights for the embedding and head: Llama 3 405B over 16 stages 7, 8 x 14, 7."""
    pytest.importorskip("torchtitan", reason=MISSING)
    pytest.importorskip("triton", reason=MISSING)
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
    )

    parts = _generate_llm_fqn_per_model_part(pp * v, n_layers, 1, 1)
    layout = Layout(pp=pp, schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v)
    assert chunk_layers(layout, n_layers, "torchtitan") == tuple(
        sum(module.startswith("layers.") for module in part) for part in parts)


def test_a_given_split_exports_module_by_module_and_torchtitan_reads_it(torchtitan_config):
    """--stage-layers 12,20 on Llama 3 8B: torchtitan's parser reads one module list a stage, the embedding first,
    the norm and head last, every module a name its own splitter uses."""
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
    )

    request, best = candidate(Layout(pp=2, stage_layers=(12, 20), dp=4), "full", spec=LLAMA3, stack="torchtitan")
    parts = torchtitan_config(export("torchtitan", request, best).text).parallelism.module_fqns_per_model_part
    assert [sum(m.startswith("layers.") for m in part) for part in parts] == [12, 20]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    assert [m for part in parts for m in part] == _generate_llm_fqn_per_model_part(1, 32)[0]


def test_async_tensor_parallelism_reads_as_torchtitan_compiles_it(torchtitan_config):
    """--tp-overlap on exports torchtitan's async TP with the compile it needs (its CompileConfig refuses the one
    without the other)."""
    request, best = candidate(Layout(tp=8, sp=True, dp=2, tp_overlap=True), "full", spec=LLAMA3, stack="torchtitan")
    compiled = torchtitan_config(export("torchtitan", request, best).text).compile
    assert compiled.enable and compiled.enable_async_tensor_parallel and "model" in compiled.components


AC_CONFIGS = {"none": None, "full": "FullAC.Config", "selective": "SelectiveAC.Config"}
"""The activation-checkpoint subcommand -> the config class torchtitan builds for it."""


@pytest.mark.parametrize("preset, flavor", [("llama3-8b", "8B"), ("llama3-70b", "70B")])
def test_torchtitan_recipes_train_the_model_they_are_named_for(preset, flavor):
    """The recipe an export names builds, on the meta device, a model of exactly headroom's parameter count."""
    pytest.importorskip("torchtitan", reason=MISSING)
    pytest.importorskip("triton", reason=MISSING)
    import torch
    from torchtitan.models.llama3 import model_registry

    with torch.device("meta"):
        model = model_registry(flavor).model.build()
    assert sum(p.numel() for p in model.parameters()) == get_preset(preset).parameters
