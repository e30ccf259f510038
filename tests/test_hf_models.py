"""HuggingFace architectures beyond Llama: exact parameter counts against transformers' own models and the
published figures.

transformers builds each model from the same config on the meta device (no weights, no memory): its
parameter count is an independent number for every supported ``model_type``. Model cards round; where they
give a figure, the count rounds to it.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from headroom.core.errors import ConfigError
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hf_config import (
    DEEPSEEK_V3_DEFAULTS,
    GEMMA3_TEXT_DEFAULTS,
    LLAMA_LIKE,
    MIXTURES,
    load_hf_config,
    spec_from_hf_config,
)
from headroom.core.specs.presets import get_preset, resolve_model
from tests.conftest import FIXTURES

HF = FIXTURES / "hf"


@pytest.mark.parametrize(
    ("file", "count", "published"),
    [
        # Qwen/Qwen3-0.6B model card: 0.6B parameters, 0.44B non-embedding (tied, 128-wide heads over hidden 1,024).
        ("qwen3-0.6b.json", 596_049_920, (0.6, 0.44)),
        # Qwen/Qwen3-8B model card: 8.2B parameters, 6.95B non-embedding.
        ("qwen3-8b.json", 8_190_735_360, (8.2, 6.95)),
        # google/gemma-7b: "7B" by name, 8.54B by count; 256-wide heads over hidden 3,072.
        ("gemma-7b.json", 8_537_680_896, (8.54, None)),
        # google/gemma-2-9b: 9.24B on the hub.
        ("gemma-2-9b.json", 9_241_705_984, (9.24, None)),
        # google/gemma-3-1b-it: 1B (1,000M on the hub).
        ("gemma-3-1b-it.json", 999_885_952, (1.0, None)),
    ],
)
def test_published_configs_count_exactly(file, count, published):
    spec = resolve_model(str(HF / file))
    assert spec.parameters == count
    total, non_embedding = published
    digits = len(str(total).split(".")[1])
    assert round(spec.parameters / 1e9, digits) == total
    if non_embedding is not None:
        embedding = spec.vocab_size * spec.hidden * (1 if spec.tied_embeddings else 2)
        assert round((spec.parameters - embedding) / 1e9, 2) == non_embedding


def test_pythia_counts_what_its_paper_publishes():
    """Biderman et al. 2023 (Pythia), Table 1: Pythia-160M has 162,322,944 parameters, 85,056,000 of them
    outside the (untied) embedding and head."""
    spec = resolve_model(str(HF / "pythia-160m.json"))
    assert spec.parameters == 162_322_944
    assert spec.parameters - 2 * spec.vocab_size * spec.hidden == 85_056_000
    assert (spec.block, spec.rotary, spec.rotary_dim, spec.parallel_residual, spec.bias) == ("gpt", True, 16, True, "all")


@pytest.mark.parametrize(
    ("file", "total", "active", "published"),
    [
        # mistralai/Mixtral-8x7B: 46.7B parameters, 12.9B used per token (Mistral AI's announcement).
        ("mixtral-8x7b-v0.1.json", 46_702_792_704, 12_879_925_248, (46.7, 12.9)),
        # Qwen/Qwen3-30B-A3B model card: 30.5B parameters, 3.3B activated (3.35: the card truncates).
        ("qwen3-30b-a3b.json", 30_532_122_624, 3_353_032_704, (30.5, 3.3)),
        # Qwen/Qwen1.5-MoE-A2.7B model card: 14.3B parameters, 2.7B activated (a gated shared expert).
        ("qwen1.5-moe-a2.7b.json", 14_315_784_192, 2_689_173_504, (14.3, 2.7)),
    ],
)
def test_mixtures_of_experts_count_total_and_active_parameters(file, total, active, published):
    """Totals are transformers' own (test_every_config_counts_what_transformers_builds); active is the total
    less the experts a token skips, every block: Qwen3-30B-A3B 30,532,122,624 - 48 x 120 x 3 x 2,048 x 768."""
    spec = resolve_model(str(HF / file))
    skipped = spec.moe_layers * (spec.n_experts - spec.experts_per_token) * 3 * spec.hidden * (
        spec.expert_ffn_hidden or spec.ffn_hidden)
    assert total - skipped == active
    assert (spec.parameters, spec.active_parameters) == (total, active)
    for count, figure in zip((total, active), published, strict=True):  # cards round, or cut, to 0.1B
        assert figure in (round(count / 1e9, 1), math.floor(count / 1e8) / 10)


def test_deepseek_v3_counts_its_published_671b_and_37b_activated():
    """DeepSeek-V3 Technical Report (2024), abstract: "671B total parameters with 37B activated for each token"
    (the multi-token-prediction module's 14B come on top, and are not part of transformers' model). Latent
    attention per block: q_a 7,168 x 1,536 and its norm, q_b 1,536 x 128 x 192, kv_a 7,168 x 576 and its norm
    of 512, kv_b 512 x 128 x 256, o 128 x 128 x 7,168; 3 dense blocks of 18,432, then 58 of 256 routed experts
    (8 used) and one shared, each 2,048 wide."""
    spec = resolve_model(str(HF / "deepseek-v3.json"))
    attention = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    expert, norms = 3 * 7168 * 2048, 2 * 7168
    dense = attention + norms + 3 * 7168 * 18432
    routed = attention + norms + 256 * 7168  # and the experts
    outside = 2 * 129280 * 7168 + 7168
    assert spec.parameters == 3 * dense + 58 * (routed + 257 * expert) + outside == 671_026_404_352
    assert spec.active_parameters == 3 * dense + 58 * (routed + 9 * expert) + outside == 37_552_282_624
    assert (math.floor(spec.parameters / 1e9), math.floor(spec.active_parameters / 1e9)) == (671, 37)
    assert (spec.is_mla, spec.expert_scoring, spec.dense_layers, spec.head_dim, spec.v_head_size) == (
        True, "sigmoid", 3, 192, 128)


def test_deepseek_v3_is_estimated_on_data_parallelism_and_refuses_tensor_parallelism_by_name():
    from headroom.core.memory.estimate import estimate
    from headroom.core.specs.config import TrainConfig
    from headroom.core.specs.layout import Layout

    spec = resolve_model(str(HF / "deepseek-v3.json"))
    sharded = estimate(spec, TrainConfig(seq_len=4096, layout=Layout(dp=256, zero=3)))
    # FSDP2 gives the first of 256 ranks a row-chunk of every parameter: a 256th of the fp32 weights, and a
    # little more where a matrix's rows do not divide (kv_a's 576: 3 rows of each of 7,168).
    even = 4 * 671_026_404_352 // 256
    assert even < sharded.static.parameters < 1.001 * even
    with pytest.raises(ConfigError) as caught:
        estimate(spec, TrainConfig(seq_len=4096, layout=Layout(tp=8, sp=True)))
    assert str(caught.value) == (
        "deepseek-ai/DeepSeek-V3: latent attention is planned on data and context parallelism with sharding; tp 8 "
        "is not modelled for it yet: use tp 1 and pp 1")
    with pytest.raises(ConfigError, match="with sharding; tp 2 and pp 2 are not modelled for it yet"):
        estimate(spec, TrainConfig(seq_len=4096, layout=Layout(tp=2, pp=2)))


def test_mixture_presets_are_their_published_configs():
    """The presets equal what their hub configs load to; Qwen renormalises top-k weights only when the config
    says norm_topk_prob (Qwen3-30B-A3B: true; Qwen1.5-MoE-A2.7B: false), Mixtral always."""
    for preset, file in (("mixtral-8x7b", "mixtral-8x7b-v0.1.json"), ("qwen3-30b-a3b", "qwen3-30b-a3b.json")):
        assert dataclasses.replace(resolve_model(str(HF / file)), name=preset) == get_preset(preset)
        assert get_preset(preset).normalize_expert_weights
    assert not resolve_model(str(HF / "qwen1.5-moe-a2.7b.json")).normalize_expert_weights


def test_a_qwen_mixture_with_dense_blocks_is_refused_by_name():
    config = json.loads((HF / "qwen3-30b-a3b.json").read_text()) | {"mlp_only_layers": [0, 1]}
    with pytest.raises(ConfigError, match=r"decoder_sparse_step 1 and mlp_only_layers \[0, 1\]: only models "
                                          "whose every block routes its MLP through experts are supported yet"):
        spec_from_hf_config(config, "q")


def test_each_gemma_and_qwen3_has_its_own_block():
    qwen3 = load_hf_config(HF / "qwen3-0.6b.json")
    assert (qwen3.head_dim, qwen3.q_dim, qwen3.hidden, qwen3.qk_norm, qwen3.post_norms) == (128, 2048, 1024, True, False)
    assert load_hf_config(HF / "qwen3-8b.json").head_size is None  # 4,096 / 32 = 128: no override needed
    gemma = load_hf_config(HF / "gemma-7b.json")
    assert (gemma.head_dim, gemma.q_dim, gemma.tied_embeddings, gemma.qk_norm, gemma.post_norms) == (256, 4096, True, False, False)
    gemma2 = load_hf_config(HF / "gemma-2-9b.json")
    assert (gemma2.norms_per_block, gemma2.qk_norm) == (4, False)
    gemma3 = load_hf_config(HF / "gemma-3-1b-it.json")
    assert (gemma3.norms_per_block, gemma3.qk_norm, gemma3.n_kv_heads) == (4, True, 1)


def test_an_image_and_text_gemma3_is_planned_as_its_language_model(tmp_path):
    """google/gemma-3-4b-it's config gives only what differs from transformers' text defaults."""
    config = {"_name_or_path": "google/gemma-3-4b-it", "model_type": "gemma3",
              "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                              "num_hidden_layers": 34, "sliding_window": 1024},
              "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = resolve_model(str(tmp_path))
    assert spec.name == "google/gemma-3-4b-it"
    assert (spec.n_layers, spec.hidden, spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.vocab_size) == (
        34, 2560, 8, 4, 256, 262_208)
    with pytest.raises(ConfigError, match="a gemma3 config needs its language model's fields as an object "
                                          "'text_config', got NoneType"):
        spec_from_hf_config({"model_type": "gemma3"}, "g")


@pytest.mark.parametrize(("value", "message"), [
    ("128", "head_dim must be a positive integer, got '128'"),
    (0, "head_dim must be a positive integer, got 0"),
    (True, "head_dim must be a positive integer, got True"),
])
def test_a_bad_head_dim_is_refused_by_name(value, message):
    config = json.loads((HF / "qwen3-8b.json").read_text()) | {"head_dim": value}
    with pytest.raises(ConfigError, match=message):
        spec_from_hf_config(config, "q")


def test_a_head_dim_other_than_hidden_over_heads_sizes_the_attention():
    """Mistral-Nemo's shape: 32 heads of 128 over hidden 5,120, so q is 4,096 wide."""
    config = json.loads((HF / "mistral-7b-v0.1.json").read_text()) | {"hidden_size": 5120, "head_dim": 128}
    spec = spec_from_hf_config(config, "nemo-like")
    assert (spec.head_dim, spec.q_dim, spec.kv_dim) == (128, 4096, 1024)


# ---- against transformers' own implementation -----------------------------------------------------

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _transformers_count(config: dict) -> int:
    """Parameters of transformers' causal LM built from ``config`` on the meta device, tied weights once."""
    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied matrix once


TINY = {"num_hidden_layers": 2, "hidden_size": 96, "intermediate_size": 160, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 40, "vocab_size": 300, "max_position_embeddings": 64,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
"""Odd sizes, and heads wider than hidden / n_heads (4 x 40 = 160 over 96): every type sizes its heads by head_dim."""


@pytest.mark.parametrize("file", sorted(p.name for p in HF.glob("*.json") if p.name != "gpt2.json"))
def test_every_config_counts_what_transformers_builds(file):
    config = json.loads((HF / file).read_text())
    assert load_hf_config(HF / file).parameters == _transformers_count(config)


@pytest.mark.parametrize("model_type", LLAMA_LIKE)
@pytest.mark.parametrize("tied", [False, True])
def test_every_llama_like_type_counts_what_transformers_builds(model_type, tied):
    config = TINY | {"model_type": model_type, "tie_word_embeddings": tied}
    if model_type in MIXTURES:
        config |= {"num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
                   "shared_expert_intermediate_size": 64 if model_type == "qwen2_moe" else 0}
    assert spec_from_hf_config(config, model_type).parameters == _transformers_count(config)


@pytest.mark.parametrize(("fraction", "parallel"), [(0.25, True), (0.5, False)])
def test_gpt_neox_counts_what_transformers_builds(fraction, parallel):
    config = {"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 96, "intermediate_size": 160,
              "num_attention_heads": 4, "vocab_size": 300, "max_position_embeddings": 64,
              "rotary_pct": fraction, "use_parallel_residual": parallel}
    spec = spec_from_hf_config(config, "neox")
    assert (spec.rotary_dim, spec.parallel_residual) == (int(24 * fraction), parallel)
    assert spec.parameters == _transformers_count(config)


def test_deepseek_v3_defaults_are_transformers_own():
    defaults = transformers.DeepseekV3Config()
    assert {key: getattr(defaults, key) for key in DEEPSEEK_V3_DEFAULTS} == DEEPSEEK_V3_DEFAULTS


@pytest.mark.parametrize("q_lora_rank", [24, None])
def test_deepseek_v3_counts_what_transformers_builds(q_lora_rank):
    """Odd sizes, a leading dense block, and queries projected directly when q_lora_rank is null
    (DeepSeek-V2-Lite's design)."""
    config = {"model_type": "deepseek_v3", "num_hidden_layers": 3, "hidden_size": 96, "intermediate_size": 160,
              "moe_intermediate_size": 40, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 300,
              "max_position_embeddings": 64, "q_lora_rank": q_lora_rank, "kv_lora_rank": 20, "qk_nope_head_dim": 12,
              "qk_rope_head_dim": 8, "v_head_dim": 10, "n_routed_experts": 6, "num_experts_per_tok": 2,
              "n_shared_experts": 2, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1}
    spec = spec_from_hf_config(config, "deepseek-like")
    assert (spec.q_lora_rank, spec.shared_expert_ffn_hidden, spec.moe_layers) == (q_lora_rank or 0, 80, 2)
    assert spec.parameters == _transformers_count(config)


def test_gemma3_text_defaults_are_transformers_own():
    defaults = transformers.Gemma3TextConfig()
    assert {key: getattr(defaults, key) for key in GEMMA3_TEXT_DEFAULTS} == GEMMA3_TEXT_DEFAULTS


def test_gemma2s_soft_capping_and_sliding_windows_are_read_with_transformers_defaults():
    """Gemma 2 caps attention scores at 50 and final logits at 30 and alternates sliding-window and full layers
    (transformers' Gemma2Config defaults, the caps also in google/gemma-2-9b's config.json); Gemma 3 caps nothing
    and attends to the whole sequence every sixth layer. Where a config lists ``layer_types``, they are read."""
    transformers = pytest.importorskip("transformers")
    from headroom.core.specs.hf_config import SOFTCAP_DEFAULTS

    defaults = transformers.Gemma2Config()
    assert SOFTCAP_DEFAULTS["gemma2"] == {"attn_logit_softcapping": defaults.attn_logit_softcapping,
                                          "final_logit_softcapping": defaults.final_logit_softcapping}
    gemma2 = load_hf_config(HF / "gemma-2-9b.json")
    assert (gemma2.attention_softcap, gemma2.logit_softcap, gemma2.sliding_window_pattern) == (50.0, 30.0, 2)
    gemma3 = load_hf_config(HF / "gemma-3-1b-it.json")
    assert (gemma3.attention_softcap, gemma3.logit_softcap, gemma3.sliding_window_pattern) == (0.0, 0.0, 6)
    llama = load_hf_config(HF / "llama-2-7b.json")
    assert (llama.attention_softcap, llama.logit_softcap, llama.sliding_window_pattern) == (0.0, 0.0, 0)
    config = json.loads((HF / "gemma-2-9b.json").read_text())
    for key in SOFTCAP_DEFAULTS["gemma2"]:
        del config[key]  # absent: transformers' defaults
    assert spec_from_hf_config(config, "gemma-2-9b") == dataclasses.replace(gemma2, name="gemma-2-9b")
    uncapped = spec_from_hf_config(config | {"attn_logit_softcapping": None, "final_logit_softcapping": None}, "x")
    assert (uncapped.attention_softcap, uncapped.logit_softcap) == (0.0, 0.0)
    with pytest.raises(ConfigError, match=r"^g: attn_logit_softcapping must be a positive number or null, got '50'$"):
        spec_from_hf_config(config | {"attn_logit_softcapping": "50"}, "g")
    for model_type, layers, pattern in (("gemma2", 42, 2), ("gemma3_text", 26, 6), ("gemma3_text", 26, 4)):
        listed = transformers.AutoConfig.for_model(model_type, num_hidden_layers=layers,
                                                   sliding_window_pattern=pattern).layer_types
        read = spec_from_hf_config(config | {"model_type": model_type, "num_hidden_layers": layers,
                                             "layer_types": listed}, "g")
        assert read.sliding_window_pattern == pattern
    with pytest.raises(ConfigError, match=r"^g: layer_types must give each of the num_hidden_layers layers a kind, "
                                          "every n-th full_attention and the rest sliding_attention"):
        spec_from_hf_config(config | {"layer_types": ["full_attention", "sliding_attention"] * 21}, "g")
    with pytest.raises(ConfigError, match=r"^g: layer_types must be a list of 'sliding_attention' or "
                                          r"'full_attention', got \['local'\]$"):
        spec_from_hf_config(config | {"layer_types": ["local"]}, "g")


def test_sliding_window_widths_are_read_with_transformers_defaults():
    """The window's width in tokens: as the config gives it, transformers' default where it names none (4,096
    for Mistral, Gemma 2 and Gemma 3), none where it is null (Mistral 7B v0.2 on) or the type has no window.
    Mistral's every layer is a sliding-window one; Gemma's every n-th attends to the whole sequence, and Gemma
    3's sliding-window layers rotate by RoPE tables of their own."""
    transformers = pytest.importorskip("transformers")
    from headroom.core.specs.hf_config import SLIDING_WINDOWS

    assert SLIDING_WINDOWS == {model_type: transformers.AutoConfig.for_model(model_type).sliding_window
                               for model_type in SLIDING_WINDOWS}
    read = {file: load_hf_config(HF / file) for file in ("mistral-7b-v0.1.json", "gemma-2-9b.json",
                                                           "gemma-3-1b-it.json", "qwen2-0.5b.json", "llama-2-7b.json")}
    assert {file: (spec.sliding_window, spec.sliding_window_pattern, spec.local_rope) for file, spec in read.items()} == {
        "mistral-7b-v0.1.json": (4096, 0, False), "gemma-2-9b.json": (4096, 2, False),
        "gemma-3-1b-it.json": (512, 6, True), "qwen2-0.5b.json": (0, 0, False), "llama-2-7b.json": (0, 0, False)}
    mistral, gemma3 = read["mistral-7b-v0.1.json"], read["gemma-3-1b-it.json"]
    assert [mistral.sliding(n) for n in range(3)] == [True] * 3
    assert [gemma3.sliding(n) for n in range(13)] == [True] * 5 + [False] + [True] * 5 + [False, True]
    assert [gemma3.sdpa_mask(seq_len, 0) for seq_len in (511, 512)] == [False, True]
    assert not any(gemma3.sdpa_mask(4096, n) for n in (5, 11)) and not read["llama-2-7b.json"].sliding(0)
    config = json.loads((HF / "mistral-7b-v0.1.json").read_text())
    assert spec_from_hf_config(config | {"sliding_window": None}, "m").sliding_window == 0
    assert spec_from_hf_config({k: v for k, v in config.items() if k != "sliding_window"}, "m").sliding_window == 4096
    with pytest.raises(ConfigError, match=r"^m: sliding_window must be a positive number of tokens or null, "
                                          r"got '4096'$"):
        spec_from_hf_config(config | {"sliding_window": "4096"}, "m")
    with pytest.raises(ConfigError, match=r"^m: sliding_window must be a width in tokens from 1 to 16,777,216, or 0 "
                                          r"for none; got -1$"):
        dataclasses.replace(mistral, name="m", sliding_window=-1)


def test_qwens_sliding_window_is_said_not_counted():
    """Qwen's use_sliding_window (false in every published config) makes layers from max_window_layers on attend
    within the window: a layout the spec does not hold, so every estimate of such a config says so."""
    config = json.loads((HF / "qwen2-0.5b.json").read_text())
    assert spec_from_hf_config(config, "q").caveats == ()
    spec = spec_from_hf_config(config | {"use_sliding_window": True}, "q")
    assert spec.caveats == ("use_sliding_window: its layers from max_window_layers (24) on attend within "
                            "sliding_window (131072) tokens, which is not modelled: counted as full attention "
                            "everywhere, and under --stack hf without the explicit mask transformers hands SDPA once "
                            "a sequence is as long as the window",)
    assert spec.sliding_window == 0 and f"q: {spec.caveats[0]}" in TrainConfig(seq_len=64).model_notes(spec)
    with pytest.raises(ConfigError, match=r"^q: use_sliding_window must be true or false \(a JSON boolean\), "
                                          r"got 'yes'$"):
        spec_from_hf_config(config | {"use_sliding_window": "yes"}, "q")


def test_what_each_stack_says_of_gemma2s_soft_capping():
    """Transformers' modules count the caps (eager attention), or say FlashAttention 2 caps inside its kernel,
    which fp32 cannot run; the other stacks do not cap, and say so."""
    gemma2 = load_hf_config(HF / "gemma-2-9b.json")
    notes = {(stack, attention): [n.split(" (")[0] + (" (hf)" if "--stack hf counts" in n else "")
                                  for n in TrainConfig(seq_len=4096, precision="bf16-pure", stack=stack,
                                                       attention=attention).model_notes(gemma2)]
             for stack in ("reference", "hf") for attention in ("flash", "standard")}
    uncounted = ["google/gemma-2-9b: attention scores soft-capped at 50 (hf)",
                 "google/gemma-2-9b: final logits soft-capped at 30 (hf)"]
    assert notes == {("reference", "flash"): uncounted, ("reference", "standard"): uncounted,
                     ("hf", "flash"): ["google/gemma-2-9b: attention scores soft-capped at 50"],
                     ("hf", "standard"): []}
    flash = TrainConfig(seq_len=4096, precision="bf16-pure", stack="hf").model_notes(gemma2)[0]
    assert "transformers' flash attention for it is FlashAttention 2's (flash_attention_2, 16-bit on CUDA)" in flash
    with pytest.raises(ConfigError, match=r"google/gemma-2-9b: its soft-capped attention runs on FlashAttention 2 "
                                          r"under transformers, which takes 16-bit inputs only, not --precision "
                                          r"fp32's fp32: use --attention standard"):
        TrainConfig(seq_len=4096, precision="fp32", stack="hf").check_model(gemma2)
    TrainConfig(seq_len=4096, precision="fp32", stack="hf", attention="standard").check_model(gemma2)
    TrainConfig(seq_len=4096, precision="fp32").check_model(gemma2)  # the reference stack does not cap


def test_the_final_caps_tanh_keeps_one_tensor_over_the_vocabulary_traced_and_counted():
    """SDPA is refused for capped attention; the final cap's tanh keeps exactly one 16-bit tensor over the
    vocabulary more (b x s x V x 2 bytes), traced on meta and in the hf stack's ledger alike."""
    transformers = pytest.importorskip("transformers")
    from headroom.agent.hf_trace import trace
    from headroom.core.memory.ledger import activation_ledger

    tiny = {"model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 1000,
            "max_position_embeddings": 64}
    with pytest.raises(ValueError, match="does not support an attention implementation through "
                                         "torch.nn.functional.scaled_dot_product_attention"):
        transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**tiny), attn_implementation="sdpa")
    train = TrainConfig(seq_len=16, micro_batch=1, precision="bf16-pure", attention="standard", stack="hf")
    plain = tiny | {"attn_logit_softcapping": None}
    capped, uncapped = plain | {"final_logit_softcapping": 30.0}, plain | {"final_logit_softcapping": None}
    traced = {name: trace(config, name, train, "cpu").saved_bytes for name, config in (("capped", capped),
                                                                                       ("uncapped", uncapped))}
    counted = {name: activation_ledger(spec_from_hf_config(config, name), train, "cpu").saved_bytes
               for name, config in (("capped", capped), ("uncapped", uncapped))}
    assert traced["capped"] - traced["uncapped"] == 1 * 16 * 1000 * 2
    assert counted == traced


def test_a_models_caveats_survive_a_round_trip_through_json():
    """A training step stores its model_spec as JSON (ModelSpec.to_dict, JSON's own types): it reads back field for
    field, and as the same model."""
    gemma2 = dataclasses.replace(load_hf_config(HF / "gemma-2-9b.json"), caveats=("a sentence",))
    stored = json.loads(json.dumps(gemma2.to_dict()))
    assert stored == gemma2.to_dict() and stored["caveats"] == ["a sentence"] and stored["attention_softcap"] == 50
    assert type(gemma2)(**stored) == gemma2
