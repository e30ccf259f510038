"""The core against what a real GPU measured: tests/data/reference (benchmarks/gpu_check.py output).

nvidia-h200-2026-11-30: one NVIDIA H200 (141 GB HBM3e, driver 580.159.04), torch 2.11.0+cu130,
cuDNN 9.19. The core is recomputed here, now, for every configuration the GPU measured, so a
change to a CUDA rule that the measurements contradict fails on a CPU.
"""

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from headroom.core.memory.estimate import estimate
from headroom.core.memory.ledger import activation_ledger
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.devices import device_rules
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.units import MiB

REFERENCE = Path(__file__).parent / "data" / "reference"
H200 = "nvidia-h200-2026-11-30"


def _load(name: str):
    with gzip.open(REFERENCE / name, "rt") as f:
        return json.load(f)


def _train_steps() -> list[dict]:
    return [r for run in _load(f"{H200}.json.gz")["runs"] for r in run["results"].get("train_step", [])]


def _estimate(row: dict):
    config = TrainConfig(seq_len=row["seq_len"], micro_batch=row["micro_batch"], precision=row["precision"],
                         optimizer=row["optimizer"], attention=row["attention"], recompute=parse_policy(row["recompute"]))
    return estimate(ModelSpec(**row["model_spec"]), config, "cuda", row["accumulation_steps"])


def test_the_reference_sweep_is_complete():
    rows = _train_steps()
    policies = {(r["micro_batch"], r["recompute"]) for r in rows}
    assert len(rows) == 22 and all(r["status"] == "ok" for r in rows)
    assert {p for _, p in policies} == {"none", "full", "every-2", "selective", "op-selective", "offload"}


@pytest.mark.parametrize("row", _train_steps(), ids=lambda r: f"micro{r['micro_batch']}-{r['recompute']}")
def test_saved_activations_equal_the_ledger_on_cuda(row):
    """What autograd kept (probe), byte for byte, for a 1B llama at s=2048 under amp-bf16."""
    assert row["activation_bytes"] == _estimate(row).ledger.saved_bytes


@pytest.mark.parametrize("row", _train_steps(), ids=lambda r: f"micro{r['micro_batch']}-{r['recompute']}")
def test_peak_allocated_is_the_predicted_peak_plus_library_workspaces(row):
    """torch.cuda.max_memory_allocated over the timed steps against the core's peak.

    The allocator holds a constant 64 MiB more than the tensors the core
    accounts for, and at most 2.5 MB besides, in every configuration: the
    size of two 32 MiB cuBLAS workspaces on Hopper, allocated on first use
    (the planner's 1 GB context reserve covers them). Peak forward, peak
    backward and the fused AdamW step's peak (the whole static state) are each
    predicted too (``details.phase_peak_bytes``).
    """
    predicted = _estimate(row)
    extra = row["peak_allocated_bytes"] - predicted.peak_bytes
    assert 64 * MiB <= extra <= 64 * MiB + 2_500_000
    phases = row["details"]["phase_peak_bytes"]
    assert 64 * MiB <= phases["forward"] - predicted.forward_peak_bytes <= 64 * MiB + 2_500_000
    assert 64 * MiB <= phases["backward"] - predicted.backward_peak_bytes <= 64 * MiB + 2_500_000
    assert 64 * MiB <= phases["optimizer"] - predicted.optimizer_peak_bytes <= 64 * MiB + 2_500_000


def _ledger_checks() -> list[dict]:
    return [c for c in _load(f"{H200}.checks.json.gz")["ledger"]["result"]["checks"] if c["status"] == "ok"]


def test_every_ledger_check_that_ran_on_the_gpu_was_compared():
    checks = _load(f"{H200}.checks.json.gz")["ledger"]["result"]["checks"]
    statuses = [c["status"] for c in checks]
    assert statuses.count("ok") == 288 and set(statuses) == {"ok", "unsupported"}
    # Forced backends that declined: flash and cuDNN refuse fp32, efficient refuses grouped heads.
    assert all(c["case"]["backend"] != "default" for c in checks if c["status"] == "unsupported")


@pytest.mark.parametrize("check", _ledger_checks(), ids=lambda c: c["label"])
def test_the_cuda_ledger_matches_the_probe_to_the_rng_state(check):
    """Full-size layers and the small-model matrix, each SDPA backend forced in turn.

    Exact but for the dropout generator's state, 16 bytes a layer that the
    ledger books on the device: memory-efficient attention keeps it on the
    host, flash keeps 8 bytes more (which kernel SDPA picks is not modelled).
    """
    case = check["case"]
    spec = dataclasses.replace(get_preset(case["model"]), n_layers=case["n_layers"])
    config = TrainConfig(seq_len=case["seq_len"], micro_batch=case["micro_batch"], attention=case["attention"],
                         dropout=case["dropout"], recompute=parse_policy(case["policy"]), precision=case["precision"])
    rules = device_rules("cuda")
    if case["backend"] == "math":
        rules = dataclasses.replace(rules, fused_attention=False)
    ledger = activation_ledger(spec, config, "cuda", rules)
    measured = {name: part["measured"] for name, part in check["parts"].items()}
    slack = 16 * case["n_layers"]
    assert abs(ledger.device_activation_bytes - measured["device activations"]) <= slack
    assert abs(ledger.host_bytes - measured["host"]) <= slack
    assert ledger.parameter_copy_bytes == measured["weight copies"]


def test_causal_attention_measured_on_the_h200_runs_under_its_peak_only_counted_as_flashattention_counts_it():
    """cuDNN's causal attention, b4 s2048 a32 d128 in 0.269 ms: 1,022 TFLOP/s with the masked half counted,
    above the H200's 989.4 TFLOP/s dense bf16 peak (NVIDIA H200 datasheet); 511 with it skipped, as the
    kernel does."""
    from headroom.core.memory.flops import (
        attention_forward_flops,
        attention_kernel_flops,
    )
    from headroom.core.specs.hardware import get_hardware

    peak = get_hardware("h200").peak_flop_per_s["bf16"]
    rows = [r for run in _load(f"{H200}.json.gz")["runs"] for r in run["results"].get("attention", [])
            if r["status"] == "ok"]
    assert rows and all(r["causal"] for r in rows)
    shape = ("batch", "seq_len", "n_heads", "head_dim")
    full = max(attention_forward_flops(*(r[k] for k in shape)) / r["forward_median_s"] for r in rows)
    kernel = max(attention_kernel_flops(*(r[k] for k in shape), r["causal"]) / r["forward_median_s"] for r in rows)
    assert full > peak > kernel and kernel == full / 2
    assert attention_kernel_flops(4, 2048, 32, 128, causal=False) == 4 * 4 * 2048**2 * 32 * 128
