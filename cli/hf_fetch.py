"""``--model org/name``: what the local hub cache lacks, fetched from the HuggingFace Hub (config.json only).

headroom.core.specs.hf_cache reads the cache; this fetches into it with huggingface_hub (``pip install huggingface_hub``, an
optional dependency transformers brings too), which reads the token a gated or private model needs from
``HF_TOKEN`` (or what ``huggingface-cli login`` saved) and stays offline under ``HF_HUB_OFFLINE=1``. Each
failure is one line saying what would work.
"""

from __future__ import annotations

import os
from pathlib import Path

from headroom.core.errors import ConfigError
from headroom.core.specs.hf_cache import (
    NotCached,
    cached_config,
    hub_cache,
    parse_model_id,
)
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.presets import hf_config_path, hub_model, resolve_model

TOKEN_HINT = "huggingface_hub reads the token from HF_TOKEN, or from `huggingface-cli login`"


def resolve(model: str) -> ModelSpec:
    """``--model`` as headroom.core.specs.presets.resolve_model reads it, a hub id the cache lacks fetched first."""
    try:
        return resolve_model(model)
    except NotCached as missing:
        return hub_model(missing.model, fetch_config(missing))


def config_file(model: str) -> Path | None:
    """The config.json ``--model`` names: a path, or a hub id's (cached, else fetched); None for a preset."""
    if (path := hf_config_path(model)) is not None:
        return path
    if (hub_id := parse_model_id(model)) is None:
        return None
    return cached_config(hub_id) or fetch_config(NotCached(hub_id))


def fetch_config(missing: NotCached) -> Path:
    """Download the config.json of a hub id the cache lacks; ConfigError saying why not."""
    model = missing.model
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "true", "yes"):
        raise ConfigError(f"{missing} (HF_HUB_OFFLINE is set, so it is not fetched)")
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise ConfigError(f"{missing}; or `pip install huggingface_hub` and headroom fetches it") from None
    try:
        return Path(hf_hub_download(model.repo, "config.json", revision=model.revision, cache_dir=hub_cache()))
    except GatedRepoError:
        raise ConfigError(f"{model.repo} is gated: accept its terms on https://huggingface.co/{model.repo} with "
                          f"an account whose token this machine gives ({TOKEN_HINT})") from None
    except RepositoryNotFoundError:
        raise ConfigError(f"no model {model.repo} on the HuggingFace Hub (a private one needs a token: "
                          f"{TOKEN_HINT})") from None
    except RevisionNotFoundError:
        raise ConfigError(f"{model.repo} has no revision {model.revision!r} on the HuggingFace Hub") from None
    except LocalEntryNotFoundError:  # no network, and nothing cached
        raise ConfigError(f"{missing} (the Hub could not be reached)") from None
    except (HfHubHTTPError, OSError) as err:
        raise ConfigError(f"cannot fetch {model}'s config.json from the HuggingFace Hub: "
                          f"{' '.join(str(err).split())[:300]}") from None
