"""Read a HuggingFace ``config.json`` from disk into a ModelSpec (no network).

The model is named by its config (``_name_or_path``, as the hub saves it,
e.g. ``meta-llama/Llama-3.1-8B``, or ``name``), else by the directory that
holds ``config.json``, else by the file's stem; never the full path
(`hf_model_name`).

Supported ``model_type`` values and the field names each uses:

- ``llama``, ``mistral``, ``qwen2``, ``phi3``: num_hidden_layers, hidden_size,
  num_attention_heads, num_key_value_heads (defaults to the head count),
  head_dim (defaults to hidden_size / num_attention_heads), intermediate_size,
  vocab_size, max_position_embeddings (optional, see below), tie_word_embeddings (default false). Qwen2 has
  biases on q, k and v. Phi-3 fuses q, k, v into
  one projection and gate and up into another: the same weights as Llama's
  separate ones (transformers' Phi3Attention and Phi3MLP).
- ``qwen3``: Llama's fields, and head_dim (default hidden_size /
  num_attention_heads) and an RMSNorm over each head of q and k
  (transformers' Qwen3Attention); attention_bias (default false).
- ``gemma``, ``gemma2``, ``gemma3_text``: Llama's fields, head_dim (default
  256), tie_word_embeddings (default true). The MLP is GeGLU: the same three
  matrices as SwiGLU. Their RMSNorm scales by 1 + weight in fp32 and the
  embeddings by sqrt(hidden_size) (``norm_offset``, ``scaled_embedding``).
  Gemma 2 and 3 add norms after attention and after the MLP; Gemma 3 also normalises each head of q and k (transformers'
  Gemma2DecoderLayer, Gemma3Attention). ``gemma3`` (the image-and-text
  model) is planned as its language model, from its ``text_config``: the
  vision encoder's weights (about 0.4B) are not counted.
- ``mixtral``, ``qwen2_moe``, ``qwen3_moe`` (mixtures of experts): their
  dense relatives' fields, and num_local_experts or num_experts,
  num_experts_per_tok, moe_intermediate_size (Qwen; Mixtral's experts are
  intermediate_size wide), shared_expert_intermediate_size (Qwen2-MoE's
  gated shared expert), norm_topk_prob (Qwen; Mixtral always renormalises).
  They are estimated and planned on data and context parallelism with
  sharding; tensor, pipeline and expert parallelism wait to be modelled for
  them, and say so.
- ``deepseek_v3`` (DeepSeek-V3, R1): Llama's fields with latent attention
  (q_lora_rank, null for queries projected directly; kv_lora_rank,
  qk_nope_head_dim, qk_rope_head_dim, v_head_dim) and experts after
  first_k_dense_replace dense blocks (n_routed_experts, num_experts_per_tok,
  moe_intermediate_size, n_shared_experts, norm_topk_prob, scoring_func),
  every missing field at transformers' default (DEEPSEEK_V3_DEFAULTS).
  Planned, like the other mixtures, on data and context parallelism with
  sharding; its group-limited expert choice and routed_scaling_factor keep
  nothing for backward and are not modelled.
- ``gpt2``: n_layer, n_embd, n_head, n_inner (null means 4 x n_embd),
  vocab_size, n_positions (required: the learned position table, n_positions x n_embd parameters),
  tie_word_embeddings (default true).
- ``gpt_neox`` (Pythia, GPT-NeoX-20B): GPT-2's block (LayerNorm, GELU,
  biases) with q, k, v fused into one projection (the same weights), rotary
  positions on ``rotary_pct`` of each head (``partial_rotary_factor``, also
  under ``rope_parameters``; default 0.25) and, with use_parallel_residual
  (default true), attention and MLP side by side; num_hidden_layers,
  hidden_size, num_attention_heads, intermediate_size, vocab_size,
  max_position_embeddings (optional, see below), tie_word_embeddings (default false)
  (transformers' GPTNeoXLayer).

``max_position_embeddings`` of a model with rotary positions (every type but
``gpt2``) sizes no weight: the sequence length is the user's ``--seq-len``,
and the context window only decides whether a note says that training there
extends the context (headroom.core.specs.config.TrainConfig.context_note). A config without
it is read with no window (`NO_CONTEXT_WINDOW`: the model's ``max_seq_len``
is the longest sequence Headroom plans, so no note). ``gpt2``'s
``n_positions`` rows are parameters, and a longer sequence has no position to
read, so it stays required.

Gemma 2's soft-capping (``attn_logit_softcapping``, ``final_logit_softcapping``;
transformers' Gemma2Config caps by default, at 50 and 30) and the sliding-window
layers of Gemma 2 and 3 (``layer_types``, or every second and every sixth layer
attending to the whole sequence) and of Mistral 7B v0.1 (every layer) are read
into the spec (``attention_softcap``, ``logit_softcap``,
``sliding_window_pattern``, ``sliding_window``, and Gemma 3's ``local_rope``):
they change no weight, and transformers' modules (``--stack hf``) keep tensors
for them that the ledger counts: the tanh of the capped scores and logits,
under checkpointing each kind of layer's mask, under SDPA a sliding-window
layer's explicit mask once the sequence is as long as the window, and Gemma 3's
second pair of RoPE tables. Other stacks do not cap, and say so (a note of
every estimate and plan, headroom.core.specs.config.TrainConfig.model_notes).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from headroom.core.errors import ConfigError
from headroom.core.specs.model import SIZE_LIMITS, ModelSpec

LLAMA_LIKE = ("llama", "mistral", "qwen2", "phi3", "qwen3", "gemma", "gemma2", "gemma3_text", "mixtral", "qwen2_moe",
              "qwen3_moe")
MIXTURES = ("mixtral", "qwen2_moe", "qwen3_moe")
SUPPORTED = (*LLAMA_LIKE, "deepseek_v3", "gemma3", "gpt2", "gpt_neox")
GEMMAS = ("gemma", "gemma2", "gemma3_text")
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2_304, "intermediate_size": 9_216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
}
"""transformers' Gemma3TextConfig defaults: a gemma3 checkpoint's ``text_config`` names only what differs
from them (google/gemma-3-4b-it gives no vocabulary size or head count). tests/test_hf_models.py checks
them against transformers' own."""
NO_CONTEXT_WINDOW = SIZE_LIMITS["max_seq_len"]
"""``max_seq_len`` of a rotary model whose config gives no max_position_embeddings: the longest sequence
Headroom plans (2**24 tokens), so no sequence is beyond the window and no context-extension note is made."""
QK_NORM = ("qwen3", "gemma3_text", "qwen3_moe")
POST_NORMS = ("gemma2", "gemma3_text")
SOFTCAP_DEFAULTS = {"gemma2": {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}}
"""transformers' defaults for a config that names no cap (Gemma2Config); other types cap only when told to."""


def load_hf_config(path: str | Path) -> ModelSpec:
    path = Path(path)
    return spec_from_config_file(read_hf_config(path), path)


MAX_CONFIG_BYTES = 16 << 20
"""The largest config.json read: a model's is a few kilobytes (one with a label map for every class of a large
classifier, a megabyte or two). Beyond it the file is something else (a model's weights, a device), refused
after reading this much rather than read whole."""


def read_hf_config(path: str | Path) -> Any:
    """The parsed JSON of a ``config.json``; errors name the path."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except OSError as err:
        raise ConfigError(f"cannot read config file {str(path)!r}: {err}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {str(path)!r} holds more than {MAX_CONFIG_BYTES >> 20} MiB, which no "
                          "config.json does (a model's weights, or a device?); give the model's config.json")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"cannot read config file {str(path)!r}: {err}") from None
    return parse_hf_config(text, path)


def parse_hf_config(text: str | bytes, path: Path) -> Any:
    """The parsed JSON of a ``config.json``'s text (read from ``path``, or uploaded under that name)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text, as a config.json is") from None
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested too deeply to be a model config") from None
    except ValueError:  # an integer of more digits than Python converts (4,300)
        raise ConfigError(f"{path}: holds an integer of thousands of digits, which no model size is") from None


def spec_from_config_file(config: Any, path: Path) -> ModelSpec:
    """The model of a parsed ``config.json`` read from ``path`` (or uploaded under that name), named by
    `hf_model_name`; errors name the path."""
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object with model fields, got {type(config).__name__}")
    return replace(spec_from_hf_config(config, name=str(path)), name=hf_model_name(config, path))


_UNSAFE = re.compile(r"[^\w.+@:/-]")
"""What a model name may not hold: it lands in logs, tables and the comment line of an exported script, so
whitespace, quotes, control and formatting characters become ``_``."""


def hf_model_name(config: dict[str, Any], path: Path) -> str:
    """The model's own name: ``_name_or_path`` or ``name`` from the config (a local path there is cut to its
    last part), else the directory holding ``config.json``, else the file's stem; unsafe characters as ``_``."""
    given = next((config[k] for k in ("_name_or_path", "name") if isinstance(config.get(k), str) and config[k].strip()),
                 None)
    if given is not None:
        text = given.strip()
        if text.startswith(("/", ".", "~")) or "\\" in text:  # a checkpoint saved from a local directory
            text = Path(text.replace("\\", "/")).name
    else:
        text = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return _UNSAFE.sub("_", text)[:200] or "model"


def spec_from_hf_config(config: dict[str, Any], name: str) -> ModelSpec:
    model_type = config.get("model_type")
    if model_type is None:
        raise ConfigError(
            f"{name}: no 'model_type' field; a config.json names its architecture there, one of "
            f"{', '.join(SUPPORTED)} (e.g. \"model_type\": \"llama\")"
        )
    if model_type == "gemma3":  # image and text: its language model
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise ConfigError(f"{name}: a gemma3 config needs its language model's fields as an object "
                              f"'text_config', got {type(text).__name__}")
        return _llama_like(GEMMA3_TEXT_DEFAULTS | text, name, "gemma3_text")
    if model_type == "gpt2":
        return _gpt2(config, name)
    if model_type == "gpt_neox":
        return _gpt_neox(config, name)
    if model_type in LLAMA_LIKE:
        return _llama_like(config, name, model_type)
    if model_type == "deepseek_v3":
        return _deepseek_v3(config, name)
    raise ConfigError(
        f"{name}: model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED)}. A decoder-only "
        "model close to one of them can be planned approximately from a copy of its config with that model_type "
        "(weights the copy does not describe are not counted)"
    )


def _field(config: dict[str, Any], key: str, name: str, default: Any = ...) -> Any:
    if key in config and config[key] is not None:
        return config[key]
    if default is ...:
        raise ConfigError(f"{name}: required field {key!r} is missing")
    return default


def _flag(config: dict[str, Any], key: str, name: str, default: bool) -> bool:
    """A JSON boolean: ``"false"`` (a string) is refused, not read as true."""
    value = _field(config, key, name, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{name}: {key} must be true or false (a JSON boolean), got {value!r}")
    return value


def _positive(config: dict[str, Any], key: str, name: str) -> int:
    """A required positive JSON integer: 0 would silently mean "not set" downstream."""
    value = _field(config, key, name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name}: {key} must be a positive integer, got {value!r}")
    return value


def _count(config: dict[str, Any], key: str, name: str) -> int:
    """An optional non-negative JSON integer (absent: 0), checked before arithmetic: a string times a width
    would repeat the string."""
    value = _field(config, key, name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name}: {key} must be a non-negative integer, got {value!r}")
    return value


def _llama_like(config: dict[str, Any], name: str, model_type: str) -> ModelSpec:
    heads = _field(config, "num_attention_heads", name)
    hidden = _field(config, "hidden_size", name)
    head_dim = _field(config, "head_dim", name, 256 if model_type in GEMMAS else None)
    if head_dim is not None and (isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0):
        raise ConfigError(f"{name}: head_dim must be a positive integer, got {head_dim!r}")
    # transformers sizes every one of these types' heads by head_dim when the config gives it (Mistral-Nemo:
    # 32 heads of 128 over hidden 5,120).
    natural = isinstance(heads, int) and isinstance(hidden, int) and heads > 0 and head_dim == hidden // heads \
        and hidden % heads == 0
    for flag in ("attention_bias", "mlp_bias"):
        if _flag(config, flag, name, False):
            raise ConfigError(f"{name}: {flag}=true is not supported yet (only Qwen2's q/k/v biases are)")
    return ModelSpec(
        name=name,
        block="llama",
        n_layers=_field(config, "num_hidden_layers", name),
        hidden=hidden,
        n_heads=heads,
        n_kv_heads=_field(config, "num_key_value_heads", name, heads),
        ffn_hidden=_field(config, "intermediate_size", name),
        vocab_size=_field(config, "vocab_size", name),
        max_seq_len=_field(config, "max_position_embeddings", name, NO_CONTEXT_WINDOW),  # rotary: a note's limit
        tied_embeddings=_flag(config, "tie_word_embeddings", name, model_type in GEMMAS),
        bias="qkv" if model_type in ("qwen2", "qwen2_moe") else "none",
        head_size=None if natural else head_dim,
        qk_norm=model_type in QK_NORM,
        post_norms=model_type in POST_NORMS,
        norm_offset=model_type in GEMMAS,
        scaled_embedding=model_type in GEMMAS,
        **_softcaps(config, name, model_type),
        sliding_window_pattern=_sliding_window_pattern(config, name, model_type),
        sliding_window=_sliding_window(config, name, model_type),
        local_rope=model_type == "gemma3_text",
        **(_experts(config, name, model_type) if model_type in MIXTURES else {}),
        caveats=_qwen_window_caveat(config, name, model_type),
    )


def _qwen_window_caveat(config: dict[str, Any], name: str, model_type: str) -> tuple[str, ...]:
    """Qwen's ``use_sliding_window`` (off in every published config): its layers from ``max_window_layers`` on
    attend within the window, a layout the spec does not hold; said, not counted."""
    if not model_type.startswith("qwen") or not _flag(config, "use_sliding_window", name, False):
        return ()
    window, first = config.get("sliding_window"), config.get("max_window_layers")
    return (f"use_sliding_window: its layers from max_window_layers ({first}) on attend within sliding_window "
            f"({window}) tokens, which is not modelled: counted as full attention everywhere, and under --stack hf "
            "without the explicit mask transformers hands SDPA once a sequence is as long as the window",)


def _softcaps(config: dict[str, Any], name: str, model_type: str) -> dict[str, float]:
    """Soft-capping (``cap x tanh(x / cap)``) of the attention scores and of the final logits: null or absent
    is no cap, except where transformers' config caps by default (SOFTCAP_DEFAULTS)."""
    defaults = SOFTCAP_DEFAULTS.get(model_type, {})
    caps = {}
    for key, field in (("attn_logit_softcapping", "attention_softcap"), ("final_logit_softcapping", "logit_softcap")):
        cap = config[key] if key in config else defaults.get(key)  # null: no cap, as transformers reads it
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0):
            raise ConfigError(f"{name}: {key} must be a positive number or null, got {cap!r}")
        caps[field] = cap or 0.0
    return caps


SLIDING_WINDOW_PATTERNS = {"gemma2": 2, "gemma3_text": 6}
"""Every n-th layer of these attends to the whole sequence, the others within a sliding window, when the config
gives no ``layer_types`` (transformers' Gemma2Config and Gemma3TextConfig, whose ``sliding_window_pattern``
may say otherwise)."""


def _sliding_window_pattern(config: dict[str, Any], name: str, model_type: str) -> int:
    """The period of full-attention layers among sliding-window ones (ModelSpec.sliding_window_pattern): from
    ``layer_types`` where the config lists them, else transformers' default for the type."""
    if model_type not in SLIDING_WINDOW_PATTERNS:
        return 0
    layer_types = config.get("layer_types")
    if layer_types is None:
        return _field(config, "sliding_window_pattern", name, SLIDING_WINDOW_PATTERNS[model_type])
    kinds = ("sliding_attention", "full_attention")
    if not isinstance(layer_types, list) or not all(kind in kinds for kind in layer_types):
        raise ConfigError(f"{name}: layer_types must be a list of {' or '.join(map(repr, kinds))}, "
                          f"got {layer_types!r}")
    full = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    period = full[0] + 1 if full else 0
    if len(layer_types) != config.get("num_hidden_layers") or not period or any(
            (kind == "full_attention") != ((i + 1) % period == 0) for i, kind in enumerate(layer_types)):
        raise ConfigError(f"{name}: layer_types must give each of the num_hidden_layers layers a kind, every n-th "
                          "full_attention and the rest sliding_attention (as Gemma 2 and 3 do); got "
                          f"{layer_types!r}")
    return period


SLIDING_WINDOWS = {"mistral": 4_096, "gemma2": 4_096, "gemma3_text": 4_096}
"""The types whose layers (or some of them) attend within a sliding window of ``sliding_window`` tokens, and
transformers' default width for a config that names none (MistralConfig, Gemma2Config, Gemma3TextConfig); null
is none (Mistral 7B v0.2 and later)."""


def _sliding_window(config: dict[str, Any], name: str, model_type: str) -> int:
    """The window's width in tokens (ModelSpec.sliding_window): 0 for a type without one, or a null width."""
    if model_type not in SLIDING_WINDOWS:
        return 0
    window = config["sliding_window"] if "sliding_window" in config else SLIDING_WINDOWS[model_type]
    if window is None:
        return 0
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ConfigError(f"{name}: sliding_window must be a positive number of tokens or null, got {window!r}")
    return window


def _experts(config: dict[str, Any], name: str, model_type: str) -> dict[str, Any]:
    """A mixture of experts' fields: every block's MLP routed (Qwen's decoder_sparse_step 1, no
    mlp_only_layers), through experts of intermediate_size (Mixtral) or moe_intermediate_size (Qwen), with
    Qwen2-MoE's gated shared expert."""
    if model_type != "mixtral":
        step, dense = _field(config, "decoder_sparse_step", name, 1), _field(config, "mlp_only_layers", name, [])
        if step != 1 or dense:
            raise ConfigError(f"{name}: decoder_sparse_step {step!r} and mlp_only_layers {dense!r}: only models "
                              "whose every block routes its MLP through experts are supported yet")
    experts_key = next((k for k in ("num_local_experts", "num_experts") if config.get(k) is not None),
                       "num_local_experts" if model_type == "mixtral" else "num_experts")
    shared = _field(config, "shared_expert_intermediate_size", name) if model_type == "qwen2_moe" else 0
    return {
        "n_experts": _field(config, experts_key, name),
        "experts_per_token": _field(config, "num_experts_per_tok", name),
        "expert_ffn_hidden": 0 if model_type == "mixtral" else _positive(config, "moe_intermediate_size", name),
        "shared_expert_ffn_hidden": shared,
        "shared_expert_gate": bool(shared),
        # Mixtral always renormalises its top-k weights (transformers' MixtralTopKRouter); Qwen when asked.
        "normalize_expert_weights": model_type == "mixtral" or _flag(config, "norm_topk_prob", name, False),
    }


DEEPSEEK_V3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "qk_nope_head_dim": 128, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
}
"""transformers' DeepseekV3Config defaults (DeepSeek-V3's own sizes), which a deepseek_v3 config.json may leave
out; tests/test_hf_models.py holds them to transformers'."""


def _deepseek_v3(config: dict[str, Any], name: str) -> ModelSpec:
    """DeepSeek-V3 (and R1): latent attention (q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
    v_head_dim) and a mixture of experts after first_k_dense_replace dense blocks: n_routed_experts of
    moe_intermediate_size, num_experts_per_tok, n_shared_experts of the same width (ungated), sigmoid scores
    (scoring_func) renormalised with norm_topk_prob. The multi-token-prediction block
    (num_nextn_predict_layers) is not part of transformers' model and is not counted, nor is the router's
    score-correction bias (a buffer, not a parameter)."""
    config = DEEPSEEK_V3_DEFAULTS | {k: v for k, v in config.items() if v is not None or k == "q_lora_rank"}
    base = {**config, "model_type": "llama", "head_dim": None}
    for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank", "moe_intermediate_size",
                "n_routed_experts", "num_experts_per_tok"):
        value = _field(config, key, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{name}: {key} must be a positive integer, got {value!r}")
    if _field(config, "moe_layer_freq", name, 1) != 1:
        raise ConfigError(f"{name}: moe_layer_freq {config['moe_layer_freq']!r}: only every block past "
                          "first_k_dense_replace routing through experts is supported")
    scoring = _field(config, "scoring_func", name, "sigmoid")
    if scoring not in ("softmax", "sigmoid"):
        raise ConfigError(f"{name}: scoring_func {scoring!r} is not softmax or sigmoid")
    shared = _count(config, "n_shared_experts", name)
    width = config["moe_intermediate_size"]
    spec = _llama_like(base, name, "llama")
    return replace(
        spec, head_size=config["qk_nope_head_dim"] + config["qk_rope_head_dim"],
        kv_lora_rank=config["kv_lora_rank"], q_lora_rank=config["q_lora_rank"] or 0,  # null: q projected directly
        rope_head_size=config["qk_rope_head_dim"], v_head_size=config["v_head_dim"],
        n_experts=config["n_routed_experts"], experts_per_token=config["num_experts_per_tok"],
        expert_ffn_hidden=width, shared_expert_ffn_hidden=shared * width,
        dense_layers=_field(config, "first_k_dense_replace", name, 0),
        normalize_expert_weights=_flag(config, "norm_topk_prob", name, True), expert_scoring=scoring)


def _gpt2(config: dict[str, Any], name: str) -> ModelSpec:
    hidden = _field(config, "n_embd", name)
    heads = _field(config, "n_head", name)
    return ModelSpec(
        name=name,
        block="gpt",
        n_layers=_field(config, "n_layer", name),
        hidden=hidden,
        n_heads=heads,
        n_kv_heads=heads,
        ffn_hidden=_field(config, "n_inner", name, 4 * hidden if isinstance(hidden, int) else hidden),
        vocab_size=_field(config, "vocab_size", name),
        max_seq_len=_positions(config, name),
        tied_embeddings=_flag(config, "tie_word_embeddings", name, True),
        bias="all",
    )


def _positions(config: dict[str, Any], name: str) -> int:
    """GPT-2's ``n_positions``: the rows of its learned position table, which are parameters."""
    if config.get("n_positions") is None:
        raise ConfigError(f"{name}: required field 'n_positions' is missing: a gpt2 model learns a position "
                          "table of n_positions x n_embd parameters (GPT-2's is 1024)")
    return config["n_positions"]


def _gpt_neox(config: dict[str, Any], name: str) -> ModelSpec:
    if not _flag(config, "attention_bias", name, True):
        raise ConfigError(f"{name}: attention_bias=false is not supported yet (GPT-NeoX has biases on every linear)")
    rope = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
    fraction = next((v for v in (config.get("rotary_pct"), config.get("partial_rotary_factor"),
                                 rope.get("partial_rotary_factor")) if v is not None), 0.25)
    heads = _field(config, "num_attention_heads", name)
    return ModelSpec(
        name=name,
        block="gpt",
        n_layers=_field(config, "num_hidden_layers", name),
        hidden=_field(config, "hidden_size", name),
        n_heads=heads,
        n_kv_heads=heads,
        ffn_hidden=_field(config, "intermediate_size", name),
        vocab_size=_field(config, "vocab_size", name),
        max_seq_len=_field(config, "max_position_embeddings", name, NO_CONTEXT_WINDOW),  # rotary: a note's limit
        tied_embeddings=_flag(config, "tie_word_embeddings", name, False),
        bias="all",
        positions="rotary",
        rotary_fraction=fraction,
        parallel_residual=_flag(config, "use_parallel_residual", name, True),
    )
