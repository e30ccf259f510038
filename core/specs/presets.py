"""Named model presets, and resolving a ``--model`` argument to a ModelSpec.

Sizes come from each model's published config.json (HuggingFace hub) or paper.
Published parameter counts (tests/test_model.py checks them exactly):
llama2-7b 6,738,415,616; llama3-8b 8,030,261,248; gpt2-small 124,439,808;
mixtral-8x7b 46,702,792,704 (12,879,925,248 active per token).

The ``bench-*`` presets are small enough that a 2-core CPU trains a step in
well under a second; the agent and the tests use them.
"""

from __future__ import annotations

import difflib
from dataclasses import replace
from pathlib import Path

from headroom.core.errors import ConfigError
from headroom.core.specs.hf_cache import (
    ModelId,
    NotCached,
    cached_config,
    parse_model_id,
)
from headroom.core.specs.model import ModelSpec


def _gpt(name: str, layers: int, hidden: int, heads: int, positions: int, vocab: int = 50257) -> ModelSpec:
    return ModelSpec(
        name=name, block="gpt", n_layers=layers, hidden=hidden, n_heads=heads, n_kv_heads=heads,
        ffn_hidden=4 * hidden, vocab_size=vocab, max_seq_len=positions, tied_embeddings=True, bias="all",
    )


def _llama(
    name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, context: int,
    tied: bool = False,
) -> ModelSpec:
    return ModelSpec(
        name=name, block="llama", n_layers=layers, hidden=hidden, n_heads=heads, n_kv_heads=kv_heads,
        ffn_hidden=ffn, vocab_size=vocab, max_seq_len=context, tied_embeddings=tied, bias="none",
    )


PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # GPT-2 (Radford et al. 2019; HF openai-community/gpt2, gpt2-xl config.json)
        _gpt("gpt2-small", 12, 768, 12, 1024),
        _gpt("gpt2-xl", 48, 1600, 25, 1024),
        # GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, d_model 12288, 96 heads, context 2048
        _gpt("gpt3-175b", 96, 12288, 96, 2048),
        # LLaMA 2 (Touvron et al. 2023; HF meta-llama/Llama-2-*-hf config.json)
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        # LLaMA 3 (HF meta-llama/Meta-Llama-3-*, Llama-3.2-1B config.json)
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("llama3.2-1b", 16, 2048, 32, 8, 8192, 128256, 131072, tied=True),
        # Llama 3.1 405B (HF meta-llama/Llama-3.1-405B config.json)
        _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 131072),
        # Mistral 7B v0.1 (HF mistralai/Mistral-7B-v0.1 config.json)
        _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768),
        # Mixtral 8x7B v0.1 (HF mistralai/Mixtral-8x7B-v0.1 config.json): 8 experts, 2 per token
        replace(_llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768), n_experts=8, experts_per_token=2,
                normalize_expert_weights=True),
        # Qwen3-30B-A3B (HF Qwen/Qwen3-30B-A3B config.json): 128 experts of 768, 8 per token, 128-wide heads
        replace(_llama("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, 40960), head_size=128, qk_norm=True,
                n_experts=128, experts_per_token=8, expert_ffn_hidden=768, normalize_expert_weights=True),
        # Small shapes for CPU benchmarks and tests.
        _gpt("bench-gpt-tiny", 2, 64, 4, 256, vocab=512),
        _gpt("bench-gpt-small", 4, 256, 8, 512, vocab=4096),
        _llama("bench-llama-tiny", 2, 64, 4, 2, 176, 512, 256),
        _llama("bench-llama-small", 4, 256, 8, 4, 704, 4096, 512),
    )
}


def get_preset(name: str) -> ModelSpec:
    """Look a preset up by name; an unknown name suggests the closest ones."""
    key = name.strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    close = difflib.get_close_matches(key, PRESETS, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"known presets: {', '.join(PRESETS)}"
    raise ConfigError(f"unknown model preset {name!r}; {hint} (or give a config.json or a model directory holding one)")


def _is_file(name: str) -> bool:
    try:
        return Path(name).is_file()
    except (OSError, ValueError):  # a name too long to be a path, or one with a NUL: not a file, so a preset name
        return False


def _is_dir(name: str) -> bool:
    try:
        return Path(name).is_dir()
    except (OSError, ValueError):
        return False


def resolve_model(name_or_path: str) -> ModelSpec:
    """A path to a HuggingFace-style config.json, or a model directory holding one (as downloaded from a
    model hub); a hub id (``org/name[@revision]``) the local hub cache holds (headroom.core.specs.hf_cache: else `NotCached`);
    or a preset name."""
    from headroom.core.specs.hf_config import load_hf_config

    path = hf_config_path(name_or_path)
    if path is not None:
        return load_hf_config(path)
    if (model := parse_model_id(name_or_path)) is not None:
        if (cached := cached_config(model)) is None:
            raise NotCached(model)
        return hub_model(model, cached)
    return get_preset(name_or_path)


def hub_model(model: ModelId, config: Path) -> ModelSpec:
    """The model of a hub id's config.json, named by the id."""
    from headroom.core.specs.hf_config import load_hf_config

    return replace(load_hf_config(config), name=str(model))


def hf_config_path(name_or_path: str) -> Path | None:
    """The config.json ``--model`` names (itself, or the one in a model directory); None for a preset."""
    if name_or_path.lower().endswith(".json") or _is_file(name_or_path):
        return Path(name_or_path)
    if _is_dir(name_or_path):
        config = Path(name_or_path) / "config.json"
        if not config.is_file():
            raise ConfigError(f"directory {name_or_path!r} holds no config.json; give a model directory as "
                              "downloaded from a model hub, a config.json or a preset")
        return config
    return None
