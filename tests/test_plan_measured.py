"""`headroom plan` on a device the smoke suite measured: measured numbers and calibration."""

import json

import pytest

torch = pytest.importorskip("torch")



@pytest.fixture(scope="module")
def measured_cpu(smoke_store):
    return smoke_store.url, smoke_store.device_name


def test_plan_uses_the_cpus_measurements_and_reports_calibration(run_cli, measured_cpu):
    url, cpu = measured_cpu
    result = run_cli("plan", "--model", "bench-llama-small", "--seq-len", "128", "--global-batch", "8",
                      "--hardware", cpu, "--db", url, "--budget", "4GB", "--precision", "fp32", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["hardware"]["source"] == "measured" and plan["hardware"]["name"] == cpu
    calibration = plan["calibration"]
    time = calibration["time"]
    assert time["samples"] + time["noisy"] + len(time["outliers"]) == 10 and time["factor"] > 0
    # A CPU has no allocator peak: no memory calibration, only the ledger's saved activations checked
    # against the bytes autograd held, which it predicts exactly.
    assert calibration["memory"]["samples"] == 0 and calibration["activations"]["samples"] == 10
    assert calibration["activations"]["raw_error"] < 0.02
    assert "Saved activations (a check of the ledger, not applied)" in calibration["confidence"]
    # What the smoke suite ran (agent/suites.py: SMOKE_TRAIN), named: every step counts through its ledger check.
    assert calibration["measured_on"] == {"steps": 10, "models": ["bench-llama-small"], "gpus": [1],
                                          "policies": ["every-2", "full", "none", "op-selective", "selective"],
                                          "unit": "device"}
    assert calibration["confidence"].startswith(f"Measured on {cpu}: 10 steps. Models: bench-llama-small. Devices: 1. "
                                                "Policies: every-2, full, none, op-selective, selective. ")
    best = plan["recommendation"]
    assert best["micro_batch"] * best["accumulation_steps"] == 8


def test_plan_falls_back_to_the_datasheet_and_says_so(run_cli, measured_cpu):
    url, _ = measured_cpu
    result = run_cli("plan", "--model", "llama2-7b", "--seq-len", "4096", "--global-batch", "64", "--dp", "8",
                      "--zero", "3", "--hardware", "h100-sxm", "--db", url, "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["hardware"]["source"] == "datasheet"
    assert any(a.startswith("GEMMs by shape from one large bf16 GEMM") for a in plan["hardware"]["assumptions"])
    assert plan["calibration"]["confidence"] == "Uncalibrated: no measured training steps on h100-sxm."


def test_impossible_plan_explains_itself(run_cli):
    args = ("plan", "--model", "llama2-70b", "--seq-len", "4096", "--global-batch", "32", "--hardware", "h100-sxm")
    result = run_cli(*args)
    assert result.returncode == 3, result.stderr  # nothing fits: its own exit status
    assert "nothing fits" in result.stdout and "smallest change that fits: --gpus 16 (" in result.stdout
    as_json = run_cli(*args, "--json")
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["recommendation"] is None
    export = run_cli(*args, "--export", "deepspeed")
    assert export.returncode == 3 and export.stdout == ""
    assert export.stderr.startswith("headroom: nothing fits, so there is nothing to export; smallest change")


def test_plan_export_and_bad_input(run_cli):
    out = run_cli("plan", "--model", "llama2-7b", "--global-tokens", "262144", "--seq-len", "4096", "--dp", "8",
                   "--zero", "3", "--export", "deepspeed")
    assert out.returncode == 0, out.stderr
    assert '"train_batch_size": 64' in out.stdout
    bad = run_cli("plan", "--model", "llama2-7b", "--global-tokens", "1000", "--seq-len", "4096")
    assert bad.returncode == 2 and "is not a multiple of --seq-len 4096" in bad.stderr
    budget = run_cli("plan", "--model", "llama2-7b", "--global-batch", "8", "--budget", "80XB")
    assert budget.returncode == 2 and "unknown unit 'XB'" in budget.stderr
