"""The hf-liger stack (headroom.core.specs.stack): transformers' Llama under the HF Trainer's ``use_liger_kernel=True``.

Checked against Liger's own kernels, run on the CPU through Triton's interpreter in a process of their own
(tests/liger_run.py): the saved-tensor probe on the patched model equals the analytic ledger tensor for tensor,
and Liger's fused linear cross-entropy holds, beyond what it keeps, the bytes the ledger adds at the forward's
last moment. The CUDA path of its weight gradient (accumulated in place) and the autocast copy of the head's
weight are read from its source, not run: no GPU has checked them.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from headroom.core.errors import ConfigError
from headroom.core.memory.ledger import activation_ledger
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hf_config import spec_from_hf_config
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from tests.xdist_support import once_per_run

RUNNER = Path(__file__).with_name("liger_run.py")


@pytest.fixture(scope="module")
def liger(tmp_path_factory) -> dict:
    """What tests/liger_run.py printed (about 20 s with its imports, once a test run)."""
    for module in ("liger_kernel", "triton", "transformers"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install 'headroom[frameworks]')")

    def build(_folder: Path) -> dict:
        proc = subprocess.run([sys.executable, str(RUNNER)], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(proc.stdout)

    return once_per_run(tmp_path_factory, "liger-run", build)


def _traced(entry: dict, n_layers: int):
    """A traced ledger back from its JSON (headroom.agent.hf_trace.TracedLedger.to_dict)."""
    from headroom.agent.hf_trace import TracedLedger

    return TracedLedger.from_dict(entry, n_layers)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["none", "full"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-pure"])
def test_the_hf_liger_stack_is_what_liger_patched_llama_keeps(liger, precision, policy):
    """Layer by layer and tensor for tensor: Liger's RMSNorm (input, fp32 rstd), SwiGLU (gate, up), RoPE (cos and
    sin) and fused linear cross-entropy (the gradients of its input and weight, no logits, no targets)."""
    pytest.importorskip("torch")
    from headroom.agent.hf_trace import differences

    config = liger["llama"]
    entry = liger["models"][f"{precision} {policy}"]
    traced = _traced(entry, config["num_hidden_layers"])
    train = TrainConfig(seq_len=liger["seq_len"], micro_batch=liger["micro_batch"], precision=precision,
                        recompute=parse_policy(policy), stack="hf-liger")
    analytic = activation_ledger(spec_from_hf_config(config, "liger-llama"), train, "cpu")
    assert differences(traced, analytic) == []
    assert traced.saved_bytes == analytic.saved_bytes == entry["saved_bytes"]
    head = {(t.name, t.bytes) for t in analytic.traced if t.name.startswith("loss.")}
    tokens, h, vocab = liger["seq_len"] * liger["micro_batch"], config["hidden_size"], config["vocab_size"]
    width = {"fp32": 4, "bf16-pure": 2}[precision]
    assert head == {("loss.grad_input", tokens * h * width), ("loss.grad_weight", vocab * h * width)}


def _tiny_loss_ledger(liger: dict, precision: str):
    """bench-llama-tiny's ledger for the loss alone's tokens (tests/liger_run.py LOSS_SHAPE)."""
    spec = get_preset("bench-llama-tiny")
    shape = liger["loss_shape"]
    assert (spec.hidden, spec.vocab_size) == (shape["hidden"], shape["vocab"])
    return activation_ledger(spec, TrainConfig(seq_len=shape["tokens"] // 2, micro_batch=2, precision=precision,
                                               stack="hf-liger"), "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16-pure"])
def test_the_fused_losss_moments_are_the_ledgers(liger, precision):
    """Forward: a 32-row chunk of logits and, on the CPU (Liger's path without in-place accumulation), the whole
    V x h product for the weight's gradient (and its fp32 copy from bf16), plus the fp32 per-token losses. The
    ledger leaves out the target mask (a bool a token). Backward scales the kept gradients in place: the seed
    gradient and the 1.0 Liger compares it with, 4 bytes each, are all it makes."""
    measured = liger["loss"][precision]
    ledger = _tiny_loss_ledger(liger, precision)
    tokens, h, vocab = 200, 64, 512
    width = {"fp32": 4, "bf16-pure": 2}[precision]
    kept = sum(t.bytes for t in ledger.traced if t.name.startswith("loss."))
    assert kept == (tokens + vocab) * h * width
    assert measured["kept"] == kept + 4  # and the loss, a scalar
    weight_gradient = vocab * h * (4 if width == 4 else width + 4)
    assert ledger.forward_transient_bytes == 32 * vocab * width + weight_gradient + 4 * tokens
    assert 0 <= measured["forward"] - ledger.forward_transient_bytes <= tokens, measured
    assert ledger.loss_gradient_bytes == 0 and measured["backward"] == 8


def test_at_llama3_8b_liger_keeps_no_logits_and_no_norm_copies():
    """amp-bf16 on CUDA, s = 8192: per layer, Liger drops the fp32 normalised tensor transformers' RMSNorm keeps
    (twice a layer, 4 b s h bytes each; under autocast the residual stream it reads is fp32 already, so it makes
    no upcast copy) and SiLU's bf16 output (2 b s f); the head keeps the fp32 gradients of its
    input and weight (4 b s h + 4 V h) where the reference loss keeps the fp32 log-probabilities (4 b s V) beside
    the head's inputs; the forward's last moment holds one 256-row chunk of bf16 logits, the chunk of its input's
    gradient and the fp32 losses (the head weight's bf16 copy is in autocast's cache with the others'), and keeps
    no copy of the head's weight for backward."""
    spec = get_preset("llama3-8b")
    s, h, f, vocab = 8192, spec.hidden, spec.ffn_hidden, spec.vocab_size

    def ledger(stack: str):
        return activation_ledger(spec, TrainConfig(seq_len=s, precision="amp-bf16", stack=stack), "cuda")

    hf, liger = ledger("hf"), ledger("hf-liger")
    assert hf.layer_bytes(5) - liger.layer_bytes(5) == 2 * 4 * s * h + 2 * s * f
    assert {t.name: t.bytes for t in liger.traced if t.name.startswith("loss.")} == {
        "loss.grad_input": 4 * s * h, "loss.grad_weight": 4 * vocab * h}
    assert not [t for t in liger.traced if t.layer is None and vocab in t.shape and t.name != "loss.grad_weight"]
    assert liger.forward_transient_bytes == 256 * (vocab + h) * 2 + 4 * s
    assert hf.parameter_copy_bytes - liger.parameter_copy_bytes == 2 * vocab * h
    assert (liger.loss_gradient_bytes, hf.loss_gradient_bytes) == (0, 2 * 4 * s * vocab)


def test_liger_has_no_tensor_parallelism():
    spec = get_preset("llama3-8b")
    with pytest.raises(ConfigError) as caught:
        activation_ledger(spec, TrainConfig(seq_len=4096, stack="hf-liger", layout=Layout(tp=2, sp=True)))
    assert str(caught.value) == ("--stack hf-liger --tp 2: Liger's fused linear cross-entropy needs the head's whole "
                                 "vocabulary on each rank; use tp 1 (data parallelism and sharding), or --stack hf")


def test_the_layout_search_keeps_liger_on_one_tensor_parallel_rank():
    from headroom.core.planning.layout_search import candidate_layouts

    spec = get_preset("llama3-8b")
    layouts = candidate_layouts(spec, TrainConfig(seq_len=4096, stack="hf-liger"), 64, 8, 8, frozenset())
    assert layouts and {layout.tp for layout in layouts} == {1}
    assert {layout.tp for layout in candidate_layouts(spec, TrainConfig(seq_len=4096, stack="hf"), 64, 8, 8, frozenset())} \
        == {1, 2, 4, 8}


def test_a_trace_under_liger_is_refused_by_name(tmp_path, capsys):
    """The trace runs transformers' own modules on meta; Liger's kernels are Triton's and cannot run there."""
    from headroom.cli.main import main

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256}))
    flags = ["--model", str(tmp_path), "--seq-len", "64", "--precision", "fp32", "--stack", "hf-liger", "--trace"]
    assert main(["estimate", *flags]) == 2
    assert ("--trace runs transformers' own modules on the meta device, where Liger's Triton kernels cannot run: "
            "--stack hf-liger's ledger is checked against those kernels run on a CPU instead (docs/accounting.md); "
            "trace with --stack hf") in capsys.readouterr().err
    assert main(["plan", *flags, "--global-batch", "8"]) == 2
    assert "where Liger's Triton kernels cannot run" in capsys.readouterr().err
