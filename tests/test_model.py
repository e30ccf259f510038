"""ModelSpec: exact parameter counts against published numbers, validation, config.json loading."""

import json

import pytest

from headroom.core.errors import ConfigError
from headroom.core.specs.hf_config import load_hf_config
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.presets import PRESETS, get_preset, resolve_model
from tests.conftest import FIXTURES

# Published counts: HF model cards / the models' own parameter totals.
PUBLISHED = {
    "llama2-7b": 6_738_415_616,
    "llama3-8b": 8_030_261_248,
    "gpt2-small": 124_439_808,
    "mistral-7b": 7_241_732_096,  # Mistral-7B-v0.1, as HF transformers counts it
    "llama3.2-1b": 1_235_814_400,  # Llama-3.2-1B (tied embeddings), as HF transformers counts it
}


@pytest.mark.parametrize(("name", "count"), PUBLISHED.items())
def test_parameter_counts_equal_published(name, count):
    assert get_preset(name).parameters == count


def test_large_presets_are_near_their_nominal_size():
    nominal = {"gpt2-xl": 1.5e9, "gpt3-175b": 175e9, "llama2-13b": 13e9, "llama2-70b": 70e9, "llama3-70b": 70e9}
    for name, size in nominal.items():
        assert get_preset(name).parameters == pytest.approx(size, rel=0.04), name


def test_every_preset_is_valid_and_named_after_its_key():
    for key, spec in PRESETS.items():
        assert spec.name == key
        assert spec.hidden % spec.n_heads == 0


def _spec(**overrides):
    fields = dict(
        name="custom", block="llama", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2,
        ffn_hidden=128, vocab_size=100, max_seq_len=64, tied_embeddings=False,
    )
    return ModelSpec(**(fields | overrides))


def test_hidden_not_divisible_by_heads_names_both_and_suggests():
    with pytest.raises(ConfigError, match=r"hidden 64 is not divisible by n_heads 5; choose n_heads among .*4"):
        _spec(n_heads=5)


def test_heads_not_divisible_by_kv_heads():
    with pytest.raises(ConfigError, match=r"n_heads 4 is not divisible by n_kv_heads 3"):
        _spec(n_kv_heads=3)


@pytest.mark.parametrize("field", ["n_layers", "hidden", "n_heads", "ffn_hidden", "vocab_size"])
@pytest.mark.parametrize("value", [0, -8, 2.5, True])
def test_non_positive_or_non_integer_sizes_are_rejected(field, value):
    with pytest.raises(ConfigError, match=f"{field} must be a positive integer"):
        _spec(**{field: value})


MLA = dict(n_heads=4, n_kv_heads=4, head_size=24, kv_lora_rank=16, rope_head_size=8, v_head_size=12)


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(q_lora_rank=8), "q_lora_rank, rope_head_size and v_head_size describe latent attention, which needs "
                          "kv_lora_rank"),
    (MLA | dict(n_kv_heads=2), "latent attention is a llama block's, without biases or q/k norms, with as many "
                               "key/value heads as query heads"),
    (MLA | dict(bias="qkv"), "latent attention is a llama block's"),
    (MLA | dict(rope_head_size=7), r"an even rope_head_size below it and v_head_size; got 24, 7, 12"),
    (MLA | dict(rope_head_size=24), r"got 24, 24, 12"),
    (MLA | dict(v_head_size=0), r"got 24, 8, 0"),
    (MLA | dict(kv_lora_rank=-1), "kv_lora_rank must be an integer from 0"),
    (MLA | dict(expert_scoring="relu"), "expert_scoring 'relu' is not softmax or sigmoid"),
])
def test_latent_attention_needs_consistent_sizes(overrides, message):
    assert _spec(**MLA).is_mla
    with pytest.raises(ConfigError, match=message):
        _spec(**overrides)


def test_unknown_block_and_bias():
    with pytest.raises(ConfigError, match="block 'bert' is not one of gpt, llama"):
        _spec(block="bert")
    with pytest.raises(ConfigError, match="bias 'some'"):
        _spec(bias="some")


def test_unknown_preset_suggests_closest():
    with pytest.raises(ConfigError, match=r"unknown model preset 'lama2-7b'; did you mean llama2-7b"):
        get_preset("lama2-7b")
    with pytest.raises(ConfigError, match="known presets"):
        get_preset("zzzzzz")


@pytest.mark.parametrize(
    ("file", "block", "count"),
    [
        ("llama-2-7b.json", "llama", 6_738_415_616),
        ("mistral-7b-v0.1.json", "llama", 7_241_732_096),
        ("qwen2-0.5b.json", "llama", 494_032_768),  # HF Qwen/Qwen2-0.5B: 494,032,768 (q/k/v biases, tied)
        ("gpt2.json", "gpt", 124_439_808),
        # microsoft/Phi-3-mini-4k-instruct: 3.82B on its model card; 32 x (4 x 3072^2 + 3 x 3072 x 8192 + 2 x 3072)
        # + 2 x 32064 x 3072 (untied) + 3072
        ("phi-3-mini-4k-instruct.json", "llama", 3_821_079_552),
    ],
)
def test_hf_config_files_load_to_exact_counts(file, block, count):
    spec = resolve_model(str(FIXTURES / "hf" / file))
    assert spec.block == block
    assert spec.parameters == count


def test_hf_config_gqa_and_bias_fields():
    mistral = load_hf_config(FIXTURES / "hf" / "mistral-7b-v0.1.json")
    assert (mistral.n_heads, mistral.n_kv_heads, mistral.ffn_hidden) == (32, 8, 14336)
    assert load_hf_config(FIXTURES / "hf" / "qwen2-0.5b.json").bias == "qkv"
    assert load_hf_config(FIXTURES / "hf" / "gpt2.json").tied_embeddings


def test_hf_config_errors_are_clear(tmp_path):
    broken = tmp_path / "config.json"
    broken.write_text('{"model_type": "llama", "hidden_size": 4096,')
    with pytest.raises(ConfigError, match=r"not valid JSON .* line 1"):
        load_hf_config(broken)
    broken.write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(ConfigError, match="model_type 't5' is not supported; supported: llama, mistral, qwen2, "
                                          "phi3, qwen3, gemma, gemma2, gemma3_text, mixtral, qwen2_moe, qwen3_moe, "
                                          "deepseek_v3, gemma3, gpt2, gpt_neox"):
        load_hf_config(broken)
    broken.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    with pytest.raises(ConfigError, match="required field 'num_attention_heads' is missing"):
        load_hf_config(broken)
    with pytest.raises(ConfigError, match="does not exist"):
        load_hf_config(tmp_path / "missing.json")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("moe_intermediate_size", 0, "moe_intermediate_size must be a positive integer, got 0"),
    ("moe_intermediate_size", "768", "moe_intermediate_size must be a positive integer, got '768'"),
    ("norm_topk_prob", "false", "norm_topk_prob must be true or false \\(a JSON boolean\\), got 'false'"),
])
def test_a_mixture_of_experts_config_field_of_the_wrong_kind_is_refused_not_misread(tmp_path, field, value, message):
    """0 experts' width once sized them by intermediate_size; the string "false" read as true."""
    qwen = json.loads((FIXTURES / "hf" / "qwen3-30b-a3b.json").read_text())
    qwen[field] = value
    path = tmp_path / "qwen.json"
    path.write_text(json.dumps(qwen))
    with pytest.raises(ConfigError, match=message):
        load_hf_config(path)


def test_a_model_is_named_by_its_config_or_its_directory_never_the_full_path(tmp_path):
    llama = json.loads((FIXTURES / "hf" / "llama-2-7b.json").read_text())
    llama.pop("_name_or_path", None)
    folder = tmp_path / "downloads" / "Llama-2-7b-hf"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(llama))
    assert resolve_model(str(folder)).name == "Llama-2-7b-hf"  # a model directory, as a hub download holds it
    assert resolve_model(str(folder / "config.json")).name == "Llama-2-7b-hf"
    (tmp_path / "my-llama.json").write_text(json.dumps(llama))
    assert resolve_model(str(tmp_path / "my-llama.json")).name == "my-llama"
    named = {"meta-llama/Llama-2-7b-hf": "meta-llama/Llama-2-7b-hf", "/checkpoints/run-7/step-1000": "step-1000",
             "evil\nrm -rf / #": "evil_rm_-rf_/__"}  # a name reaches an exported script's comment line
    for given, name in named.items():
        (folder / "config.json").write_text(json.dumps(llama | {"_name_or_path": given}))
        assert resolve_model(str(folder)).name == name
    assert resolve_model(str(folder)).parameters == 6_738_415_616
    with pytest.raises(ConfigError, match="directory '.*empty' holds no config.json"):
        (tmp_path / "empty").mkdir()
        resolve_model(str(tmp_path / "empty"))
