"""torch.compile of the blocks (TrainConfig.compile): the ledger against what the compiled decoder keeps on the CPU,
tensor for tensor, where the compiled block keeps less than the eager one, what is refused, and how plans and
exports carry it.

The decoder is compiled as torchtitan compiles it (headroom.agent.compiled: each block, its checkpoint inside) and
probed with autograd's saved-tensor hooks alone (a dispatch mode would make dynamo run the blocks eagerly), in a
process of its own (tests/compile_run.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import estimate
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from tests.xdist_support import once_per_run


def _config(policy="none", stack="reference", **changes):
    fields = {"seq_len": 64, "micro_batch": 2, "precision": "bf16-pure", "compile": True} | changes
    return TrainConfig(recompute=parse_policy(policy), stack=stack, **fields)


RUNNER = Path(__file__).with_name("compile_run.py")


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory) -> dict:
    """What tests/compile_run.py printed (its own process: compiling leaves dynamo's caches and inductor's
    threads behind), once a test run."""
    pytest.importorskip("torch")

    def build(_folder: Path) -> dict:
        proc = subprocess.run([sys.executable, str(RUNNER)], capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(proc.stdout)

    return once_per_run(tmp_path_factory, "compile-run", build)


@pytest.mark.slow
@pytest.mark.parametrize("case", [
    "bench-llama-tiny reference none 2 64", "bench-llama-tiny reference full 2 64",
    "bench-llama-tiny torchtitan none 2 64", "bench-llama-tiny torchtitan full 2 64",
    "bench-llama-small torchtitan none 3 96",
])
def test_the_ledger_is_what_the_compiled_decoder_keeps(compiled_run, case):
    """Byte for byte and tensor for tensor (by dtype and size: the hooks alone cannot tell an activation from a
    token id), each block compiled (an OptimizedModule)."""
    result = compiled_run[case]
    assert result["compiled"]
    assert result["ledger_bytes"] == result["probed_bytes"]
    assert result["ledger"] == result["probed"]


def test_a_compiled_llama_block_keeps_neither_silus_output_nor_ropes_tables():
    """Llama 3.2 1B at 2,048 tokens on a GPU's rules (fused RMSNorm either way): compiled, each block keeps one
    (s, ffn) bf16 tensor less (SiLU's output, recomputed from the gate) and none of the four (s, head_dim) bf16
    casts of cos and sin eager RoPE keeps (one pair for q, one for k: remade in backward); the rest as eager."""
    spec = get_preset("llama3.2-1b")
    config = _config(seq_len=2048, micro_batch=1)
    compiled, eager = (estimate(spec, c, "cuda").ledger.per_layer_bytes
                       for c in (config, TrainConfig(seq_len=2048, precision="bf16-pure")))
    assert eager - compiled == 2048 * spec.ffn_hidden * 2 + 4 * 2048 * spec.head_dim * 2


@pytest.mark.parametrize("changes, message", [
    ({"stack": "megatron"}, "--compile on under --stack megatron"),
    ({"policy": "op-selective", "stack": "torchtitan"}, "under a per-op policy, measured, inductor keeps only"),
    ({"policy": "every-2"}, "--recompute every-2"),
    ({"precision": "amp-bf16"}, "compiled autocast is not measured"),
    ({"fp8": "torchao-rowwise", "stack": "torchtitan"}, "a compiled float8 block is not measured yet"),
])
def test_compile_refuses_what_was_not_measured(changes, message):
    with pytest.raises(ConfigError, match=message):
        _config(**changes)


def test_only_llama_blocks_compile():
    with pytest.raises(ConfigError, match="measured for llama blocks"):
        _config().check_model(get_preset("bench-gpt-tiny"))
    _config(precision="amp-bf16", layout=Layout(dp=2, zero=3))  # FSDP's mixed precision: bf16 blocks


def test_plan_tries_only_the_measured_policies_and_says_why(plan_json):
    plan = plan_json("--model", "llama3.2-1b", "--seq-len", "4096", "--global-batch", "8", "--hardware", "h100-sxm",
                     "--precision", "bf16-pure", "--stack", "torchtitan", "--compile", "on")
    assert plan["request"]["compile"] is True
    assert {c["recompute"] for c in plan["candidates"] + plan["rejected"]} <= {"none", "full"}
    assert any("op-selective checkpointing is not tried: a compiled block is measured" in n for n in plan["notes"])


def test_exports_carry_the_compile_or_say_they_do_not(run_cli):
    args = ("plan", "--model", "llama3.2-1b", "--seq-len", "4096", "--global-batch", "8", "--hardware", "h100-sxm",
            "--precision", "bf16-pure", "--stack", "torchtitan", "--compile", "on", "--export")
    titan = run_cli(*args, "torchtitan")
    assert titan.returncode == 0, titan.stderr
    assert "--compile.enable \\\n  --compile.components model" in titan.stdout
    hf = run_cli(*args, "hf")
    assert hf.returncode == 0, hf.stderr
    assert "the plan compiles each block with torch.compile" in " ".join(hf.stdout.split())


def test_a_run_configuration_keeps_the_compile():
    from headroom.core.specs.run_config import RunConfig

    run = RunConfig(train=_config(), accumulation_steps=2)
    document = run.to_dict()
    assert document["compile"] is True and RunConfig.from_dict(document) == run
    assert "compile" not in RunConfig(train=TrainConfig(seq_len=64)).to_dict()
