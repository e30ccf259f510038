"""`headroom plan` prints the confidence one topic a line: what the calibration's steps ran, whether this plan
lies inside it, and each quantity's in-sample error (headroom.core.measured.calibration)."""

from __future__ import annotations

import json

import pytest

from headroom.db.models import TrainStepResult
from headroom.db.store import open_store
from tests.db_support import LLAMA2_7B, fingerprint, results

DEVICE = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def store_url(tmp_path_factory) -> str:
    """Two quiet llama2-7b steps on one H100 (policy none), beside one result of each other kind."""
    url = f"sqlite:///{tmp_path_factory.mktemp('confidence') / 'results.db'}"
    with open_store(url, mode="write") as store:
        with store.recording(fingerprint(), suite="standard", benchmark_version="1") as run_id:
            for result in results(0):
                store.add_result(run_id, result)
            for micro in (1, 2):
                store.add_result(run_id, TrainStepResult(
                    model_name="llama2-7b", model_spec=LLAMA2_7B, seq_len=4096, micro_batch=micro,
                    samples_s=[1.0 * micro] * 3, median_s=1.0 * micro, min_s=1.0 * micro, max_s=1.0 * micro,
                    tokens_per_s=4096 / 1.0, peak_allocated_bytes=30_000_000_000 * micro,
                    predicted_peak_bytes=30_000_000_000 * micro, predicted_step_time_s=1.0 * micro))
    return url


def confidence(stdout: str) -> list[str]:
    """The lines under ``confidence:``, up to the blank line that ends the header."""
    lines = stdout.splitlines()
    at = lines.index("confidence:")
    return lines[at + 1:lines.index("", at)]


def test_a_plan_outside_what_was_measured_says_so_one_topic_a_line(run_cli, store_url, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # unwrapped (headroom.cli.wrap)
    # 20 GB a GPU holds no llama3-70b layout of 16 GPUs: nothing fits, so no policy is judged.
    result = run_cli("plan", "--model", "llama3-70b", "--seq-len", "4096", "--global-batch", "64", "--gpus", "16",
                     "--budget", "20GB", "--hardware", DEVICE, "--db", store_url)
    assert result.returncode == 3, result.stderr
    lines = confidence(result.stdout)
    assert lines[:2] == [f"  Measured on {DEVICE}: 2 steps. Models: llama2-7b. GPUs: 1. Policies: none.",
                         "  This plan: llama3-70b, 16 GPUs: outside what was measured (model, GPU count)."]
    assert lines[2].startswith("  Peak memory: measured/predicted x") and lines[2].endswith("%.")
    assert lines[3].startswith("  Step time: measured/predicted x") and lines[3].endswith("%.")
    assert lines[4:] == ["  Communication: -."]


def test_a_plan_on_the_measured_gpu_count_names_its_policy(run_cli, store_url, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    result = run_cli("plan", "--model", "llama3.2-1b", "--seq-len", "2048", "--global-batch", "8",
                     "--hardware", DEVICE, "--db", store_url)
    assert result.returncode == 0, result.stderr
    scope = confidence(result.stdout)[1]
    policy = result.stdout.split("recompute ", 1)[1].split()[0]  # the recommendation's
    outside = "model" if policy == "none" else "model, policy"
    assert scope == f"  This plan: llama3.2-1b, 1 GPU, policy {policy}: outside what was measured ({outside})."


def test_the_json_keeps_the_confidence_text_and_adds_its_provenance(run_cli, store_url):
    result = run_cli("plan", "--model", "llama3.2-1b", "--seq-len", "2048", "--global-batch", "8",
                     "--hardware", DEVICE, "--db", store_url, "--json")
    assert result.returncode == 0, result.stderr
    calibration = json.loads(result.stdout)["calibration"]
    assert calibration["measured_on"] == {"steps": 2, "models": ["llama2-7b"], "gpus": [1], "policies": ["none"],
                                          "unit": "GPU"}
    assert calibration["confidence"].startswith(
        f"Measured on {DEVICE}: 2 steps. Models: llama2-7b. GPUs: 1. Policies: none. Peak memory: ")
    assert calibration["confidence"].endswith(" Communication: -.")
    assert calibration["communication"]["error_range"] is None
