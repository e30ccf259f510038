"""The traced ledger (headroom.agent.hf_trace): transformers' own model, built from its config on the meta device.

Checked two ways: against a real CPU forward of the same model (byte for byte, tensor by tensor), and
against the analytic ledger of the same config, whose differences are listed exactly.
"""

import json
from collections import Counter
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from headroom.agent.hf_trace import (  # noqa: E402
    _one_sequence_per_row,
    build_model,
    checkpoint_every_layer,
    differences,
    ledger_of,
    trace,
)
from headroom.agent.probe import probe  # noqa: E402
from headroom.core.errors import ConfigError  # noqa: E402
from headroom.core.memory.ledger import activation_ledger  # noqa: E402
from headroom.core.planning.layout_search import candidate_layouts  # noqa: E402
from headroom.core.specs.config import TrainConfig  # noqa: E402
from headroom.core.specs.hf_config import spec_from_hf_config  # noqa: E402
from headroom.core.specs.layout import Layout  # noqa: E402
from headroom.core.specs.recompute import parse_policy  # noqa: E402

LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 2,
         "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 4096, "max_position_embeddings": 512,
         "tie_word_embeddings": False}
"""bench-llama-small's shape as a HuggingFace config: grouped k/v heads, untied head."""
SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256, "pad_token_id": None,
         "bos_token_id": None, "eos_token_id": None}


def kept(ledger) -> Counter:
    return Counter((t.name, t.shape, t.dtype, t.kind, t.layer, t.bytes) for t in ledger.tensors)


def cpu_forward(config: dict, train: TrainConfig):
    """The probe on a real CPU forward of the same transformers model: SDPA picks its own kernel."""
    torch.manual_seed(0)
    model = build_model(config, {"fp32": torch.float32, "bf16-pure": torch.bfloat16}[train.precision], "cpu")
    if str(train.recompute) == "full":
        checkpoint_every_layer(model)
    tokens = torch.randint(0, config["vocab_size"], (train.micro_batch, train.seq_len))
    with _one_sequence_per_row():
        probed = probe(model, lambda: model(input_ids=tokens, labels=tokens, use_cache=False).loss)
    return ledger_of(probed, "tiny", "cpu", model)


@pytest.mark.parametrize("policy", ["none", "full"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-pure"])
def test_the_meta_trace_under_cpu_rules_is_a_real_cpu_forward_tensor_for_tensor(precision, policy):
    train = TrainConfig(seq_len=128, micro_batch=2, precision=precision, recompute=parse_policy(policy))
    traced = trace(LLAMA, "tiny", train, "cpu")
    real = cpu_forward(LLAMA, train)
    assert kept(traced) == kept(real)
    assert traced.saved_bytes == real.saved_bytes > 0


SLIDING = {"mistral": {"model_type": "mistral", "sliding_window": 16},
           "gemma3": {"model_type": "gemma3_text", "head_dim": 32, "num_hidden_layers": 7, "sliding_window": 16}}
"""Sliding-window models whose window (16 tokens) is shorter than the tests' sequences: transformers hands SDPA an
explicit mask in Mistral's every layer and in all of Gemma 3's but the sixth."""


@pytest.mark.parametrize("policy", ["none", "full"])
@pytest.mark.parametrize("model", sorted(SLIDING))
def test_a_sliding_window_mask_is_traced_as_the_cpus_flash_kernel_takes_it(model, policy):
    """SDPA on a CPU runs its flash kernel with an explicit mask too, keeping the mask as it makes it additive,
    and transformers repeats grouped k/v heads for it: the meta trace equals a real CPU forward, tensor for
    tensor (before, the trace sent masked calls to SDPA's math path, keeping probabilities no kernel keeps)."""
    for precision in ("fp32", "bf16-pure"):
        train = TrainConfig(seq_len=64, micro_batch=2, precision=precision, recompute=parse_policy(policy))
        config = {**SMALL, **SLIDING[model]}
        traced, real = trace(config, model, train, "cpu"), cpu_forward(config, train)
        assert kept(traced) == kept(real)
        assert traced.saved_bytes == real.saved_bytes > 0


def test_on_the_cpu_the_trace_and_the_analytic_ledger_part_only_where_the_models_do():
    """transformers computes RoPE's cos and sin once and hands them to every layer; the reference decoder
    makes them in each layer, so the analytic ledger keeps one pair more per later layer."""
    train = TrainConfig(seq_len=128, micro_batch=2, precision="fp32")
    traced, analytic = trace(LLAMA, "tiny", train, "cpu"), activation_ledger(spec_from_hf_config(LLAMA, "t"), train, "cpu")
    assert differences(traced, analytic) == [
        "layer 1: the trace keeps -32,768 bytes; only traced: nothing; only analytic: 128x32 fp32 (x2)"]
    assert traced.saved_bytes == analytic.saved_bytes - 32_768 == 15_524_868


def test_under_full_checkpointing_the_trace_keeps_the_shared_tables_the_layers_read():
    train = TrainConfig(seq_len=128, micro_batch=2, precision="fp32", recompute=parse_policy("full"))
    traced, analytic = trace(LLAMA, "tiny", train, "cpu"), activation_ledger(spec_from_hf_config(LLAMA, "t"), train, "cpu")
    assert differences(traced, analytic) == [
        "embedding, head and loss: the trace keeps +33,792 bytes; only traced: 1x128x32 fp32 (x2), 128 int64; "
        "only analytic: nothing"]


def test_on_cuda_rules_transformers_rmsnorm_keeps_what_the_fused_kernel_does_not():
    """transformers' LlamaRMSNorm is a composite (an fp32 copy of its input, then the scaled product); the
    analytic ledger follows torch's fused RMSNorm on CUDA, which keeps the input and rstd only."""
    train = TrainConfig(seq_len=128, micro_batch=2, precision="fp32")
    traced, analytic = trace(LLAMA, "tiny", train, "cuda"), activation_ledger(spec_from_hf_config(LLAMA, "t"), train, "cuda")
    diff = differences(traced, analytic)
    assert diff[0] == "layer 0: the trace keeps +524,288 bytes; only traced: 2x128x256 fp32 (x2); only analytic: nothing"
    assert traced.saved_bytes > analytic.saved_bytes


def test_fused_attention_keeps_no_score_matrix():
    """Meta's SDPA falls back to the math path (b a s^2 probabilities); routed to the fused kernel the trace
    keeps none, as the device would."""
    train = TrainConfig(seq_len=128, micro_batch=2, precision="bf16-pure")
    scores = (2, 8, 128, 128)
    assert not [t for t in trace(LLAMA, "tiny", train, "cuda").tensors if t.shape == scores]
    assert [t for t in trace(LLAMA, "tiny", train, "meta").tensors if t.shape == scores]  # meta's own rules: math


@pytest.mark.parametrize(("model_type", "extra"), [
    ("qwen3", {"head_dim": 32}), ("gemma2", {"head_dim": 32}), ("phi3", {}), ("mistral", {}),
    ("gpt2", {"n_layer": 2, "n_embd": 128, "n_head": 4, "n_positions": 256}), ("gpt_neox", {}),
    ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
])
def test_architectures_the_analytic_ledger_need_not_know_are_traced_layer_by_layer(model_type, extra):
    # Gemma 2 has no SDPA attention: transformers' eager one
    train = TrainConfig(seq_len=64, micro_batch=2, precision="bf16-pure",
                        attention="standard" if model_type == "gemma2" else "flash")
    traced = trace({"model_type": model_type, **SMALL, **extra}, model_type, train, "cuda")
    per_layer = [traced.layer_bytes(n) for n in range(traced.n_layers)]
    assert traced.n_layers == 2 and all(per_layer)
    assert traced.saved_bytes == sum(per_layer) + traced.layer_bytes(None)


def test_what_cannot_be_traced_says_why():
    with pytest.raises(ConfigError, match="--precision amp-bf16 needs autocast"):
        trace(LLAMA, "tiny", TrainConfig(seq_len=64), "cuda")
    with pytest.raises(ConfigError, match="--recompute 'selective' cannot be traced; valid: none, full"):
        trace(LLAMA, "tiny", TrainConfig(seq_len=64, precision="fp32", recompute=parse_policy("selective")), "cuda")
    with pytest.raises(ConfigError, match="model_type 'no-such-model'"):
        trace({**LLAMA, "model_type": "no-such-model"}, "x", TrainConfig(seq_len=64, precision="fp32"), "cuda")


def test_a_model_deeper_than_a_trace_follows_is_refused_before_it_is_built(run_cli, tmp_path):
    """A 10,000-layer config (within the model's limits) ran 600 s at 2.3 GB under --trace."""
    from headroom.core.memory.trace_limits import MAX_TRACED_LAYERS

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "num_hidden_layers": 10_000}))
    result = run_cli("estimate", "--model", str(path), "--trace", "--precision", "fp32")
    assert result.returncode == 2
    assert result.stderr == (f"headroom: error: --trace builds and runs every layer of transformers' model in one "
                             f"process: tmp_path_name's 10,000 layers are more than the {MAX_TRACED_LAYERS:,} it "
                             "follows; leave out --trace (the analytic ledger has no such limit)\n"
                             .replace("tmp_path_name", tmp_path.name))


def test_estimate_trace_from_a_model_directory(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # the report's content, not its wrapping (tests/test_cli_wrap.py)
    (tmp_path / "tiny-llama").mkdir()
    (tmp_path / "tiny-llama" / "config.json").write_text(json.dumps({**LLAMA, "_name_or_path": "acme/tiny-llama"}))
    flags = ("estimate", "--model", str(tmp_path / "tiny-llama"), "--seq-len", "128", "--micro-batch", "2",
             "--precision", "fp32", "--device", "cpu", "--trace")
    result = run_cli(*flags, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["trace"]
    assert report["model"] == "acme/tiny-llama" and report["device"] == "cpu"
    assert report["saved_bytes"] == 15_524_868 == sum(t["bytes"] for t in report["ledger"] if t["kind"] != "parameter_copy")
    assert report["analytic_saved_bytes"] == 15_557_636
    assert set(report["ledger"][0]) == {"name", "shape", "dtype", "location", "kind", "layer", "bytes"}
    text = run_cli(*flags)
    assert "traced with transformers on meta (cpu attention kernels): 15.525 MB kept for backward, analytic " \
           "15.558 MB (-0.2%; MB = 1e6 bytes)" in text.stdout
    preset = run_cli("estimate", "--model", "llama3-8b", "--seq-len", "128", "--precision", "fp32", "--trace")
    assert preset.returncode != 0 and "--model 'llama3-8b' is a preset; give a config.json" in preset.stderr


FLASH_RNG = "the trace keeps +8 bytes; only traced: scalar uint64, 2 uint64; only analytic: scalar int64 (x2)"
"""The one part the hf stack leaves to the device rules: the trace routes 16-bit CUDA attention to the flash
kernel, whose meta outputs keep a (2,) uint64 RNG state and an unused uint64 scalar; the analytic ledger keeps
the two int64 scalars cuDNN and memory-efficient attention keep (measured on an H200, headroom.core.specs.devices)."""


@pytest.mark.parametrize("policy", ["none", "full"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-pure"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_hf_stack_is_the_trace_of_transformers_llama(device, precision, policy):
    """The analytic ledger under --stack hf keeps what transformers' own Llama keeps, tensor for tensor and layer
    by layer: its composite RMSNorm, cos and sin made once per forward, the checkpointed layers' shared inputs."""
    config = {**LLAMA, "num_hidden_layers": 4}  # later layers replayed from a template (headroom.core.memory.trace.Repeat)
    train = TrainConfig(seq_len=128, micro_batch=2, precision=precision, recompute=parse_policy(policy), stack="hf")
    traced = trace(config, "tiny", train, device)
    analytic = activation_ledger(spec_from_hf_config(config, "t"), train, device)
    flash = device == "cuda" and precision == "bf16-pure" and policy == "none"
    assert differences(traced, analytic) == ([f"layers 0-3: {FLASH_RNG}"] if flash else [])
    assert traced.saved_bytes - analytic.saved_bytes == (4 * 8 if flash else 0)


@pytest.mark.parametrize(("model_type", "extra"), [("qwen3", {"head_dim": 64}), ("qwen2", {}), ("mistral", {}),
                                                   ("gemma", {"head_dim": 32})])
def test_the_hf_stack_is_the_trace_of_the_llama_family(model_type, extra):
    """Qwen3's per-head q/k norms are transformers' Llama RMSNorm too; Qwen2's q/k/v biases keep nothing more.
    Gemma's RMSNorm scales by 1 + weight in fp32 and keeps its fp32 normalised tensor, and its embeddings are
    scaled by a kept scalar; its GeGLU keeps what SwiGLU keeps."""
    config = {**SMALL, "model_type": model_type, **extra}
    for device, precision, policy in (("cuda", "bf16-pure", "none"), ("cpu", "fp32", "full"),
                                      ("cpu", "bf16-pure", "none"), ("cuda", "fp32", "none")):
        train = TrainConfig(seq_len=64, micro_batch=2, precision=precision, recompute=parse_policy(policy),
                            stack="hf")
        traced = trace(config, model_type, train, device)
        analytic = activation_ledger(spec_from_hf_config(config, model_type), train, device)
        flash = device == "cuda" and precision == "bf16-pure" and policy == "none"
        assert differences(traced, analytic) == ([f"layers 0-1: {FLASH_RNG}"] if flash else [])


def test_outside_the_llama_family_the_hf_stack_says_to_trace():
    """Phi-3 (fused q/k/v and gate/up projections) is transformers' own module: traced, it parts from the hf
    stack, so a mixture of experts or, under Liger's kernels, Gemma, Gemma 2 and Gemma 3 are refused."""
    phi3 = {**SMALL, "model_type": "phi3"}
    train = TrainConfig(seq_len=64, micro_batch=2, precision="bf16-pure", recompute=parse_policy("none"), stack="hf")
    assert differences(trace(phi3, "phi3", train, "cpu"), activation_ledger(spec_from_hf_config(phi3, "p"), train, "cpu"))
    mixtral = spec_from_hf_config({**SMALL, "model_type": "mixtral", "num_local_experts": 4,
                                 "num_experts_per_tok": 2}, "mixtral")
    with pytest.raises(ConfigError, match="the hf stack accounts for transformers' Llama modules "
                                          r"\(llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3\); .* --trace"):
        activation_ledger(mixtral, train, "cuda")
    for model_type in ("gemma", "gemma2", "gemma3_text"):
        gemma = spec_from_hf_config({**SMALL, "model_type": model_type}, model_type)
        with pytest.raises(ConfigError, match=r"the hf-liger stack accounts for transformers' Llama modules "
                                              r"\(llama, mistral, qwen2, qwen3\);"):
            activation_ledger(gemma, replace(train, stack="hf-liger"), "cuda")


COMBINATIONS = (("cuda", "bf16-pure", "none"), ("cpu", "fp32", "full"), ("cpu", "bf16-pure", "none"),
                ("cuda", "fp32", "none"))


@pytest.mark.parametrize(("model_type", "kv_heads", "layers"), [("llama", 2, 3), ("llama", 1, 2), ("gemma2", 2, 5),
                                                                 ("gemma2", 1, 2)])
@pytest.mark.parametrize("micro_batch", [1, 2])
def test_the_hf_stacks_eager_attention_is_the_trace_of_transformers_eager_attention(model_type, kv_heads, layers,
                                                                                   micro_batch):
    """--attention standard under the hf stack is transformers' eager attention: no mask kept, the softmax in
    fp32 and its cast back both kept, Gemma 2's capped scores' tanh, and under checkpointing each kind of layer's
    mask (Gemma 2 alternates a sliding-window and a causal one). One shared k/v head (multi-query) of one
    sequence is read without a copy; one sequence's shifted labels are a view of the padded ones. Exact, on CPU
    and CUDA rules, with and without checkpointing: eager attention runs the same ops on every device."""
    config = {**SMALL, "model_type": model_type, "head_dim": 32, "num_key_value_heads": kv_heads,
              "num_hidden_layers": layers}
    for device, precision, policy in COMBINATIONS:
        train = TrainConfig(seq_len=64, micro_batch=micro_batch, precision=precision, recompute=parse_policy(policy),
                            stack="hf", attention="standard")
        traced = trace(config, model_type, train, device)
        analytic = activation_ledger(spec_from_hf_config(config, model_type), train, device)
        assert differences(traced, analytic) == []
        assert kept(traced) != kept(activation_ledger(spec_from_hf_config(config, model_type),
                                                      replace(train, stack="reference"), device))


@pytest.mark.parametrize(("model", "extra"), [("gemma3", {"num_hidden_layers": 13}),
                                            ("gemma3", {"num_key_value_heads": 1}), ("gemma3", {"sliding_window": 64}),
                                            ("gemma3", {"sliding_window": 65}), ("mistral", {}),
                                            ("mistral", {"num_key_value_heads": 1})])
@pytest.mark.parametrize("attention", ["standard", "flash"])
def test_the_hf_stack_is_the_trace_of_sliding_window_layers(model, extra, attention):
    """Gemma 3's sliding-window layers rotate by RoPE tables of their own. Under SDPA a window no longer than the
    sequence (16 or 64 tokens of 64) is an explicit mask, which the CPU's flash kernel keeps beside k and v
    repeated to every head (one shared head: a view); a longer window (65) is no mask. Exact on CPU rules, and
    on CUDA's where no mask is made; where one is, which CUDA kernel takes it has not been measured, and both
    ledgers refuse it by name. Thirteen layers: Gemma 3's layers 5 and 11 attend to the whole sequence."""
    config = {**SMALL, **SLIDING[model], **extra}
    spec = spec_from_hf_config(config, model)
    for device, precision, policy in COMBINATIONS:
        for micro_batch in (1, 2):
            train = TrainConfig(seq_len=64, micro_batch=micro_batch, precision=precision,
                                recompute=parse_policy(policy), stack="hf", attention=attention)
            if device == "cuda" and attention == "flash" and spec.sdpa_mask(64, 0):
                with pytest.raises(ConfigError, match=rf"^{model}: at seq-len 64, transformers hands the SDPA of "
                                                      rf"its sliding-window layers \({spec.sliding_window} tokens\) "
                                                      "an explicit mask; which CUDA kernel takes it"):
                    activation_ledger(spec, train, device)
                with pytest.raises(ConfigError, match="^transformers hands SDPA an explicit mask here"):
                    trace(config, model, train, device)
                continue
            flash = device == "cuda" and precision == "bf16-pure" and policy == "none" and attention == "flash"
            assert differences(trace(config, model, train, device), activation_ledger(spec, train, device)) == (
                [f"layers 0-{spec.n_layers - 1}: {FLASH_RNG}"] if flash else [])


def test_ring_attention_takes_no_sliding_window_mask():
    """Context parallelism's ring attention takes no explicit mask: refused under transformers' SDPA where one is
    made, planned where none is: a window longer than the sequence, or the reference stack, which has no window."""
    gemma3 = spec_from_hf_config({**SMALL, **SLIDING["gemma3"]}, "g")
    ring = TrainConfig(seq_len=64, precision="bf16-pure", stack="hf", layout=Layout(cp=2))
    with pytest.raises(ConfigError, match=r"^g: at seq-len 64 transformers hands the SDPA of its sliding-window "
                                          r"layers an explicit mask, which ring attention \(cp 2\) cannot take: use "
                                          r"cp 1, or a seq-len under 16$"):
        activation_ledger(gemma3, ring, "cpu")
    assert activation_ledger(replace(gemma3, sliding_window=65), ring, "cpu").saved_bytes > 0
    assert activation_ledger(gemma3, replace(ring, stack="reference"), "cpu").saved_bytes > 0
    single = replace(ring, layout=Layout())  # and a layout search tries no ring where a mask is made
    rings = {(model.sliding_window, train.stack): max(layout.cp for layout in candidate_layouts(
        model, train, global_batch=8, gpus=4, gpus_per_node=8, pinned=frozenset()))
        for model in (gemma3, replace(gemma3, sliding_window=65)) for train in (single, replace(single, stack="reference"))}
    assert rings == {(16, "hf"): 1, (16, "reference"): 4, (65, "hf"): 4, (65, "reference"): 4}


def test_an_explicit_sdpa_mask_costs_the_mask_and_repeated_heads():
    """Against the same Gemma 3 with a window one token longer than the sequence, each of the six sliding-window
    layers of seven keeps the (b, 1, s, s) mask in the inputs' dtype, and k and v repeated from 2 heads to 4
    in place of the rotated k and the projected v. Fully checkpointed, the boolean (s, s) mask alone."""
    b, s, heads, kv_heads, head_dim, dtype = 2, 64, 4, 2, 32, 2
    masked = spec_from_hf_config({**SMALL, **SLIDING["gemma3"], "sliding_window": s}, "g")
    unmasked = replace(masked, sliding_window=s + 1)
    per_layer = b * s * s * dtype + 2 * b * (heads - kv_heads) * s * head_dim * dtype
    for policy, extra in (("none", 6 * per_layer), ("full", s * s)):
        train = TrainConfig(seq_len=s, micro_batch=b, precision="bf16-pure", recompute=parse_policy(policy),
                            stack="hf")
        saved = [activation_ledger(spec, train, "cpu").saved_bytes for spec in (masked, unmasked)]
        assert saved[0] - saved[1] == extra


def test_gemma2s_eager_attention_keeps_what_its_caps_and_masks_cost():
    """Against the same model uncapped: each capped layer keeps a (b, a, s, s) tanh, the head a (b, s, V) one
    (checkpointed, the head's alone). Against it without sliding-window layers: fully checkpointed, a second
    (b, 1, s, s) mask, the one Gemma 2's sliding-window layers read."""
    gemma2 = spec_from_hf_config({**SMALL, "model_type": "gemma2", "head_dim": 32}, "g")
    uncapped = replace(gemma2, attention_softcap=0.0, logit_softcap=0.0)
    unwindowed = replace(gemma2, sliding_window_pattern=0)
    b, s, a, vocab, layers = 2, 64, 4, 512, 2
    for policy, capped, windowed in (("none", layers * b * a * s * s * 2 + b * s * vocab * 2, 0),
                                     ("full", b * s * vocab * 2, b * s * s * 2)):
        train = TrainConfig(seq_len=s, micro_batch=b, precision="bf16-pure", recompute=parse_policy(policy),
                            stack="hf", attention="standard")
        saved = {spec: activation_ledger(spec, train, "cuda").saved_bytes for spec in (gemma2, uncapped, unwindowed)}
        assert (saved[gemma2] - saved[uncapped], saved[gemma2] - saved[unwindowed]) == (capped, windowed)


def test_gemma2s_flash_attention_is_not_traced_on_meta():
    train = TrainConfig(seq_len=64, micro_batch=1, precision="bf16-pure", stack="hf")
    with pytest.raises(ConfigError, match=r"model_type 'gemma2': transformers cannot run its attention on SDPA, and "
                                          r"its flash attention \(FlashAttention 2\) needs CUDA, not the meta device: "
                                          "trace --attention standard"):
        trace({**SMALL, "model_type": "gemma2"}, "gemma2", train, "cuda")


def test_gemmas_norms_change_only_the_transformers_ledger():
    """The agent's decoder (the reference stack) normalises a Gemma as it does a Llama: only the hf stack's
    ledger keeps Gemma's fp32 normalised tensors, one (b, s, h) fp32 in place of a 16-bit one per norm."""
    config = {**SMALL, "model_type": "gemma", "head_dim": 32}
    gemma = spec_from_hf_config(config, "gemma")
    llama_norms = replace(gemma, norm_offset=False, scaled_embedding=False)
    train = TrainConfig(seq_len=64, micro_batch=2, precision="bf16-pure")
    assert kept(activation_ledger(gemma, train, "cuda")) == kept(activation_ledger(llama_norms, train, "cuda"))
    hf = replace(train, stack="hf")
    norms = 2 * 2 + 1  # two a block, and the final one
    extra = norms * (2 * 64 * 128 * 2 + 128 * 4) + 2  # fp32 over bf16, and 1 + weight; the embedding's scale
    assert activation_ledger(gemma, hf, "cuda").saved_bytes - activation_ledger(llama_norms, hf, "cuda").saved_bytes \
        == extra


def planned(tmp_path, budget: int, recompute: str | None = None, **train):
    """A plan for the tiny Llama from its model directory on an H100's datasheet (``recompute``: the policy
    pinned), and --trace's report on it."""
    from headroom.cli.trace import plan_trace_report
    from headroom.core.planning.planner import PlanRequest, plan
    from headroom.core.specs.hardware import get_hardware
    from headroom.core.timing.step import datasheet_profile

    (tmp_path / "tiny").mkdir(exist_ok=True)
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(LLAMA))
    request = PlanRequest(spec=spec_from_hf_config(LLAMA, "tiny"),
                          train=TrainConfig(seq_len=2048, precision="bf16-pure", **train),
                          global_batch=16, budget_bytes=budget,
                          recompute=None if recompute is None else parse_policy(recompute))
    result = plan(request, datasheet_profile(get_hardware("h100-sxm")))
    return result, plan_trace_report(str(tmp_path / "tiny"), result)


def test_plan_trace_checks_the_recommendation_with_the_traced_activations(tmp_path):
    """transformers' LlamaRMSNorm keeps fp32 copies the reference decoder's fused norm does not: traced, the
    recommendation needs more than planned, its margin added the planner's way; at a budget of exactly what
    was planned it no longer fits. Planned on the hf stack, the trace adds only the flash kernel's RNG bytes."""
    from headroom.cli.trace import render_plan_trace

    result, report = planned(tmp_path, 2 * 10**9)
    best = result.recommendation
    extra = report["saved_bytes"] - report["analytic_saved_bytes"]
    assert extra > 0 and report["candidate"] == f"{best.layout}: {best.label}"
    assert report["traced_required_bytes"] == round((best.estimate.peak_bytes + extra) * 1.10) + 10**9
    assert report["required_bytes"] == best.required_bytes and report["fits"]
    tight, report = planned(tmp_path, best.required_bytes)
    assert tight.recommendation == best and not report["fits"]
    assert report["traced_required_bytes"] > report["budget_bytes"] == report["required_bytes"]
    assert render_plan_trace(report).endswith(f"(planned {best.required_bytes / 1e9:,.2f} GB): does not fit")
    _, report = planned(tmp_path, 2 * 10**9, recompute="none", stack="hf")
    assert report["candidate"].endswith(", none")
    assert report["saved_bytes"] - report["analytic_saved_bytes"] == 2 * 8  # two layers' RNG state


def test_gemma2_is_traced_with_eager_attention_and_its_flash_attention_refused_before_planning(run_cli, tmp_path):
    (tmp_path / "gemma2").mkdir()
    (tmp_path / "gemma2" / "config.json").write_text(json.dumps({**SMALL, "model_type": "gemma2", "head_dim": 32}))
    common = ("--model", str(tmp_path / "gemma2"), "--seq-len", "64", "--precision", "bf16-pure", "--stack", "hf",
              "--trace")
    eager = run_cli("estimate", *common, "--attention", "standard", "--json")
    assert eager.returncode == 0, eager.stderr
    report = json.loads(eager.stdout)["trace"]
    assert report["saved_bytes"] == report["analytic_saved_bytes"] and report["differences"] == []
    refusal = ("--trace runs transformers' attention on the meta device: gemma2's soft-capped attention has no SDPA "
               "form, and its flash attention (FlashAttention 2) needs CUDA; trace --attention standard")
    for command in (("estimate",), ("plan", "--global-batch", "16")):
        flash = run_cli(*command, *common)
        assert flash.returncode == 2 and flash.stdout == "" and refusal in flash.stderr


def test_plan_trace_is_refused_before_planning_what_it_cannot_follow(run_cli, tmp_path):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(LLAMA))
    flags = ("plan", "--model", str(tmp_path / "tiny"), "--seq-len", "512", "--global-batch", "16", "--trace")
    amp = run_cli(*flags)
    assert amp.returncode == 2 and amp.stdout == ""
    assert "--trace runs the model in one dtype: --precision amp-bf16 needs autocast" in amp.stderr
    split = run_cli(*flags, "--precision", "bf16-pure", "--tp", "2")
    assert split.returncode == 2 and "--trace runs the whole model in one process: layout tp 2" in split.stderr


def test_an_estimate_says_whose_tensors_its_ledger_counts():
    """The hf stack's ledger is transformers' modules, checked against their trace; not the agent's decoder."""
    from headroom.core.memory.estimate import estimate

    spec = spec_from_hf_config({**SMALL, "model_type": "gemma"}, "gemma")
    notes = {stack: next(n for n in estimate(spec if stack == "hf" else spec_from_hf_config(LLAMA, "l"),
                                             TrainConfig(seq_len=64, precision="bf16-pure", stack=stack)).to_dict()["notes"]
                         if n.startswith("activations: "))
             for stack in ("hf", "hf-liger", "reference")}
    assert notes["hf"] == ("activations: per-tensor ledger of transformers' modules (the hf stack) on cuda (checked "
                           "against transformers' own model traced on meta, tensor for tensor)")
    assert notes["hf-liger"].startswith("activations: per-tensor ledger of transformers' modules with Liger's kernels")
    assert notes["reference"].startswith("activations: per-tensor ledger of the agent's decoder on cuda")
    gemma2 = spec_from_hf_config({**SMALL, "model_type": "gemma2"}, "gemma2")
    flash2 = {attention: estimate(gemma2, TrainConfig(seq_len=64, precision="bf16-pure", stack="hf",
                                                      attention=attention)).to_dict()["notes"]
              for attention in ("flash", "standard")}
    assert notes["hf"][:-1] + ", FlashAttention 2's tensors apart)" in flash2["flash"]
    assert notes["hf"] in flash2["standard"]
