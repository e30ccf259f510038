"""A HuggingFace model id (``meta-llama/Llama-3.1-8B``, ``Qwen/Qwen3-8B@main``) as the local hub cache holds it.

A planner who has used transformers already has the configs of the models they use: the hub client keeps
each download under ``HF_HUB_CACHE`` (default ``HF_HOME/hub``, ``HF_HOME`` defaulting to
``XDG_CACHE_HOME/huggingface`` or ``~/.cache/huggingface``), laid out as

    models--{org}--{name}/refs/{branch or tag}     the commit it points at
    models--{org}--{name}/snapshots/{commit}/config.json

`cached_config` finds the config.json of an id at a revision without the network: a 40-character commit
names its snapshot, a branch or tag its ref; with no revision given, ``main``'s ref, else the snapshot most
recently written that holds a config.json. Fetching what is not cached is the CLI's (cli/hf_fetch.py), with
huggingface_hub, an optional dependency.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from headroom.core.errors import ConfigError

_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96})(?:@(?P<revision>[\w./-]{1,200}))?$")
"""An org or user, a slash, a model name (the hub's characters and lengths), and an optional ``@revision``."""
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True, slots=True)
class ModelId:
    repo: str
    """``org/name``."""
    revision: str | None = None
    """A branch, tag or commit; None: ``main``, else the newest snapshot cached."""

    def __str__(self) -> str:
        return self.repo + (f"@{self.revision}" if self.revision else "")


def parse_model_id(text: str) -> ModelId | None:
    """``text`` as a hub id, or None when it is not one (a preset name has no slash; a path is not an id)."""
    match = _ID.match(text)
    if match is None or ".." in match["repo"] or match["repo"].startswith(("./", ".")):
        return None
    return ModelId(match["repo"], match["revision"])


def hub_cache() -> Path:
    """Where the hub client keeps downloads, by the variables huggingface_hub reads."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return Path(home).expanduser() / "hub"


def cached_config(model: ModelId) -> Path | None:
    """The cached config.json of ``model`` at its revision, or None when the cache has none."""
    root = hub_cache() / f"models--{model.repo.replace('/', '--')}"
    snapshots = root / "snapshots"
    revision = model.revision
    if revision is not None and _COMMIT.match(revision):
        return _config_in(snapshots / revision)
    ref = root / "refs" / (revision or "main")
    try:
        commit = ref.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        commit = None
    if commit is not None and _COMMIT.match(commit):
        return _config_in(snapshots / commit)
    if revision is not None:
        return None
    try:
        held = [p / "config.json" for p in snapshots.iterdir() if (p / "config.json").is_file()]
    except OSError:
        return None
    return max(held, key=lambda p: p.stat().st_mtime, default=None)


def _config_in(snapshot: Path) -> Path | None:
    config = snapshot / "config.json"
    return config if config.is_file() else None


class NotCached(ConfigError):
    """A hub id whose config.json the local cache does not hold: the CLI fetches it (cli/hf_fetch.py)."""

    def __init__(self, model: ModelId) -> None:
        self.model = model
        at = f" at revision {model.revision}" if model.revision else ""
        super().__init__(f"{model.repo}{at} is not in the local HuggingFace cache ({hub_cache()}) and no file or "
                         f"directory {str(model)!r} exists; fetch its config with `huggingface-cli download "
                         f"{model.repo} config.json`, or give a config.json or a preset")
