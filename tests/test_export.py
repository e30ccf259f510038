"""Exported settings parse in their own format and carry the recommendation."""

import ast
import json
import tomllib

import pytest

from core.errors import ConfigError
from core.export import export
from core.hardware import get_hardware
from core.planner import PlanRequest, plan
from core.presets import get_preset
from core.timing import datasheet_profile

REQUEST = PlanRequest(spec=get_preset("llama2-7b"), seq_len=4096, global_batch=64, dp=8, zero=3)
BEST = plan(REQUEST, datasheet_profile(get_hardware("h100-sxm"))).recommendation


def test_deepspeed_json():
    text = export("deepspeed", REQUEST, BEST)
    config = json.loads("\n".join(line for line in text.splitlines() if not line.startswith("//")))
    assert config["train_batch_size"] == 64
    assert config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * 8 == 64
    assert config["zero_optimization"]["stage"] == 3


def test_torchtitan_toml():
    config = tomllib.loads(export("torchtitan", REQUEST, BEST))
    assert config["training"]["local_batch_size"] == BEST.config.micro_batch
    assert config["training"]["global_batch_size"] == 64
    assert config["parallelism"]["data_parallel_shard_degree"] == 8
    assert config["activation_checkpoint"]["mode"] in ("none", "full", "selective")


@pytest.mark.parametrize("fmt", ["hf", "lightning"])
def test_python_snippets_parse_and_carry_the_batch(fmt):
    text = export(fmt, REQUEST, BEST)
    ast.parse(text)
    assert f"{BEST.accumulation_steps}," in text
    assert f"{BEST.config.micro_batch}" in text


def test_unknown_format():
    with pytest.raises(ConfigError, match="unknown export format 'megatron'; valid: hf, torchtitan, deepspeed, lightning"):
        export("megatron", REQUEST, BEST)
