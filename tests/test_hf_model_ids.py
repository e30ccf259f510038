"""``--model org/name[@revision]``: a HuggingFace model id read from the local hub cache (the layout the hub
client writes, built here in a temporary directory), fetched when missing, or refused in one line saying how to
get it. No test reaches the network: the fetches go to a stand-in for huggingface_hub's download."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from headroom.core.specs.hf_cache import (
    ModelId,
    cached_config,
    hub_cache,
    parse_model_id,
)

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
MAIN, OLD = "a" * 40, "b" * 40


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A hub cache holding meta-llama/Llama-2-7b-hf at main (7B) and at tag v0 (Mistral's config, to tell them
    apart), as huggingface_hub lays it out."""
    root = tmp_path / "hub"
    repo = root / "models--meta-llama--Llama-2-7b-hf"
    for commit, fixture in ((MAIN, "llama-2-7b.json"), (OLD, "mistral-7b-v0.1.json")):
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text((FIXTURES / fixture).read_text())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "v0").write_text(OLD)
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return root


def test_an_id_is_org_slash_name_and_an_optional_revision():
    assert parse_model_id("meta-llama/Llama-3.1-8B") == ModelId("meta-llama/Llama-3.1-8B")
    assert parse_model_id("Qwen/Qwen3-8B@v1.0") == ModelId("Qwen/Qwen3-8B", "v1.0")
    for not_an_id in ("llama3-8b", "./x/y", "../x/y", "/abs/path", "a/b/c", "a/", "/b", "a b/c"):
        assert parse_model_id(not_an_id) is None, not_an_id


def test_the_cache_is_where_huggingface_hub_keeps_it(monkeypatch, tmp_path):
    for name in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    assert hub_cache() == Path("~/.cache/huggingface/hub").expanduser()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert hub_cache() == tmp_path / "cache"


def test_a_revision_picks_its_snapshot(cache):
    snapshots = cache / "models--meta-llama--Llama-2-7b-hf" / "snapshots"
    assert cached_config(ModelId("meta-llama/Llama-2-7b-hf")) == snapshots / MAIN / "config.json"
    assert cached_config(ModelId("meta-llama/Llama-2-7b-hf", "v0")) == snapshots / OLD / "config.json"
    assert cached_config(ModelId("meta-llama/Llama-2-7b-hf", OLD)) == snapshots / OLD / "config.json"
    assert cached_config(ModelId("meta-llama/Llama-2-7b-hf", "v9")) is None
    assert cached_config(ModelId("meta-llama/Llama-2-13b-hf")) is None


def test_without_a_main_ref_the_newest_snapshot_is_read(cache):
    repo = cache / "models--meta-llama--Llama-2-7b-hf"
    (repo / "refs" / "main").unlink()
    os.utime(repo / "snapshots" / OLD / "config.json", (2_000_000_000, 2_000_000_000))
    assert cached_config(ModelId("meta-llama/Llama-2-7b-hf")) == repo / "snapshots" / OLD / "config.json"


def test_plan_reads_a_cached_model_by_its_id(cache, run_cli):
    result = run_cli("estimate", "--model", "meta-llama/Llama-2-7b-hf")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("meta-llama/Llama-2-7b-hf: 6,738,415,616 parameters (llama, 32 layers")
    tagged = run_cli("estimate", "--model", "meta-llama/Llama-2-7b-hf@v0")
    assert tagged.stdout.startswith("meta-llama/Llama-2-7b-hf@v0: 7,241,732,096 parameters")  # Mistral 7B's


def test_offline_and_uncached_is_one_line_saying_how_to_get_it(cache, run_cli, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = run_cli("plan", "--model", "meta-llama/Llama-3.1-8B", "--global-batch", "8")
    assert result.returncode == 2
    assert result.stderr == (f"headroom: error: meta-llama/Llama-3.1-8B is not in the local HuggingFace cache "
                             f"({cache}) and no file or directory 'meta-llama/Llama-3.1-8B' exists; fetch its config "
                             "with `huggingface-cli download meta-llama/Llama-3.1-8B config.json`, or give a "
                             "config.json or a preset (HF_HUB_OFFLINE is set, so it is not fetched)\n")


def _download(behaviour):
    def download(repo_id, filename, revision=None, cache_dir=None):
        return behaviour(repo_id, filename, revision, cache_dir)
    return download


def test_online_a_missing_config_is_fetched_alone_into_the_cache(cache, run_cli, monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    asked = []

    def fetch(repo_id, filename, revision, cache_dir):
        asked.append((repo_id, filename, revision, Path(cache_dir)))
        target = Path(cache_dir) / "models--Qwen--Qwen3-8B" / "snapshots" / ("c" * 40) / "config.json"
        target.parent.mkdir(parents=True)
        target.write_text((FIXTURES / "qwen3-8b.json").read_text())
        return str(target)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _download(fetch))
    result = run_cli("estimate", "--model", "Qwen/Qwen3-8B")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Qwen/Qwen3-8B: ") and asked == [("Qwen/Qwen3-8B", "config.json", None, cache)]


@pytest.mark.parametrize(("error", "message"), [
    ("GatedRepoError", "meta-llama/Llama-3.1-8B is gated: accept its terms on https://huggingface.co/meta-llama/"
                       "Llama-3.1-8B with an account whose token this machine gives (huggingface_hub reads the token "
                       "from HF_TOKEN, or from `huggingface-cli login`)"),
    ("RepositoryNotFoundError", "no model meta-llama/Llama-3.1-8B on the HuggingFace Hub (a private one needs a "
                                "token: huggingface_hub reads the token from HF_TOKEN, or from `huggingface-cli "
                                "login`)"),
])
def test_a_gated_or_missing_model_says_which_token_is_read(cache, run_cli, monkeypatch, error, message):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    import huggingface_hub.errors

    kind = getattr(huggingface_hub.errors, error)
    exception = kind.__new__(kind)  # as the hub client raises it, without a response its version's type wants
    Exception.__init__(exception, "refused")

    def refuse(*_args):
        raise exception

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _download(refuse))
    result = run_cli("estimate", "--model", "meta-llama/Llama-3.1-8B")
    assert result.returncode == 2 and result.stderr == f"headroom: error: {message}\n"


def test_a_preset_and_a_path_still_win(cache, run_cli, tmp_path, monkeypatch):
    assert run_cli("estimate", "--model", "llama2-7b").stdout.startswith("llama2-7b: ")
    local = tmp_path / "meta-llama" / "Llama-2-7b-hf"
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps(json.loads((FIXTURES / "gpt2.json").read_text())))
    monkeypatch.chdir(tmp_path)
    result = run_cli("estimate", "--model", "meta-llama/Llama-2-7b-hf", "--seq-len", "512")
    assert result.stdout.startswith("Llama-2-7b-hf: 124,439,808 parameters (gpt, 12 layers"), result.stderr  # the directory
