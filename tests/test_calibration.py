"""Calibration is robust and says what it did: noisy steps and outliers left out and named, factors far
from 1 reported but not applied, a comparison of saved activations never passed off as a peak, and a confidence
that names what was measured, calls its error in-sample and gives it as a range."""

from __future__ import annotations

import pytest

from headroom.core.measured.calibration import (
    FAR_FACTOR,
    MeasuredOn,
    Observation,
    calibrate,
    fit_ratio,
)

# Fourteen steps measured 1.2-1.4x their predictions, as a quiet box's steps scatter.
CLEAN = [Observation(None, None, 1.0 + i / 10, (1.0 + i / 10) * (1.2 + (i % 5) / 20), f"step {i}") for i in range(14)]


def test_one_ten_times_slower_step_neither_moves_the_factor_nor_hides():
    clean = calibrate("gpu", CLEAN).time
    slow = Observation(None, None, 1.0, 10 * clean.factor, "rerun on a busy box")
    fit = calibrate("gpu", [*CLEAN, slow]).time
    assert fit.factor == pytest.approx(clean.factor, rel=0.05)
    assert fit.samples == 14 and fit.outliers == (f"rerun on a busy box x{10 * clean.factor:.3g}",)
    assert fit.worst == clean.worst  # the outlier's 900% is not the confidence
    assert fit.describe("step time").endswith(" Left out: 1 outlier (rerun on a busy box x13).")


def test_a_step_the_agent_flagged_is_left_out_and_counted():
    clean = calibrate("gpu", CLEAN).time
    flagged = Observation(None, None, 1.0, 3.0, "busy", noisy="the agent found the host busy")
    fit = calibrate("gpu", [*CLEAN, flagged]).time
    assert (fit.factor, fit.samples, fit.noisy, fit.outliers) == (clean.factor, 14, 1, ())
    assert fit.describe("step time").endswith(" Left out: 1 noisy (busy host or spread samples).")
    # Its memory still counts: bytes do not depend on the host's load.
    assert calibrate("gpu", [Observation(100.0, 110.0, 1.0, 3.0, "busy", noisy="busy")]).memory.samples == 1


def test_a_factor_far_from_one_is_reported_not_applied():
    far = [Observation(None, None, p, p * 3.0, f"step {p}") for p in (1.0, 2.0, 3.0)]
    fit = calibrate("cpu", far).time
    assert fit.factor == pytest.approx(3.0) and not fit.applied and fit.correction == 1.0
    assert fit.describe("step time") == (
        "Step time: measured/predicted x3.000 over 3 steps, not applied. It is beyond 2x: the model misses something "
        "on this device. Uncorrected: +200.0%, median |error| 200.0%.")
    near = calibrate("cpu", [Observation(None, None, 1.0, FAR_FACTOR, "at the limit")]).time
    assert near.applied and near.correction == FAR_FACTOR


def test_ratios_and_errors_are_measured_over_predicted():
    fit = fit_ratio([(2.0, 3.0, "a", False), (4.0, 6.0, "b", False), (1.0, 2.0, "c", False)])
    assert fit.factor == 1.5 and fit.raw_error == 0.5  # median of m/p - 1: 0.5, 0.5, 1.0
    assert fit.worst == pytest.approx(2.0 / 1.5 - 1)
    assert fit.ratios == (1.5, 1.5, 2.0) and fit.raw_range == (0.5, 1.0)
    assert fit.error_range == (0.0, pytest.approx(2.0 / 1.5 - 1))
    assert fit.describe("step time") == (
        "Step time: measured/predicted x1.500 over 3 steps, applied. After it, on the same steps (in-sample): "
        "+0.0% to +33.3%, median |error| 0.0%. Before it: median |error| 50.0%.")


def test_a_cpu_has_no_memory_calibration_only_a_check_of_the_ledger():
    cpu = [Observation(None, None, 1.0, 1.1, "s1", predicted_activation_bytes=1000.0, measured_activation_bytes=1000.0),
           Observation(None, None, 2.0, 2.1, "s2", predicted_activation_bytes=2000.0, measured_activation_bytes=2000.0)]
    calibration = calibrate("Some CPU", cpu)
    assert calibration.memory.samples == 0 and calibration.memory.correction == 1.0
    lines = calibration.confidence_lines()
    assert lines[1] == "Peak memory: - (no allocator statistics on this device)."
    assert lines[-1] == ("Saved activations (a check of the ledger, not applied): measured/predicted x1.000 over 2 "
                         "steps. Off by +0.0%, median |error| 0.0%.")
    assert calibration.to_dict()["activations"]["samples"] == 2


def test_nothing_measured_is_uncalibrated():
    assert calibrate("gpu", []).confidence() == "Uncalibrated: no measured training steps on gpu."
    assert calibrate("gpu", []).confidence_lines("llama3-70b", 64) == (
        "Uncalibrated: no measured training steps on gpu.",)
    assert not calibrate("gpu", []).calibrated


def test_a_rerun_outlier_is_named_once_with_its_count():
    clean = [(1.0, 1.0 + i / 100, f"step {i}", False) for i in range(10)]
    reruns = [(1.0, 5.0, "llama micro 1 offload", False)] * 3 + [(1.0, 0.2, f"odd {i}", False) for i in range(6)]
    text = fit_ratio(clean + reruns).describe("step time")
    assert text.endswith("Left out: 9 outliers (llama micro 1 offload x5 (3 steps), odd 0 x0.2, odd 1 x0.2, "
                         "odd 2 x0.2, odd 3 x0.2, and 2 more).")


# Eight llama3.2-1b steps on one GPU (none and full), and one of a tensor-parallel pair, as a store hands them over.
MEASURED = [Observation(100.0, 100.0 * r, 1.0, r, f"step {i}", model="llama3.2-1b", gpus=1,
                        policy="none" if i % 2 else "full")
            for i, r in enumerate((1.10, 1.20, 1.25, 1.30, 1.30, 1.35, 1.40, 1.50))]
PAIR = Observation(None, None, 2.0, 2.6, "rank 0/2", model="llama2-7b", gpus=2, policy="every-2")


def test_the_confidence_names_what_was_measured_and_quotes_an_in_sample_range():
    calibration = calibrate("NVIDIA H200", [*MEASURED, PAIR])
    assert calibration.measured_on == MeasuredOn(9, ("llama2-7b", "llama3.2-1b"), (1, 2), ("every-2", "full", "none"))
    assert calibration.time.factor == calibration.memory.factor == 1.3  # the median ratio, of 9 and of 8
    assert calibration.confidence_lines() == (
        "Measured on NVIDIA H200: 9 steps. Models: llama2-7b, llama3.2-1b. GPUs: 1, 2. Policies: every-2, full, none.",
        # |1.1 / 1.3 - 1| = 15.4%; the middle two of 0, 0, 3.8, 3.8, 7.7, 7.7, 15.4, 15.4 (%) average 5.8%.
        ("Peak memory: measured/predicted x1.300 over 8 steps, applied. After it, on the same steps (in-sample): "
         "-15.4% to +15.4%, median |error| 5.8%. Before it: median |error| 30.0%."),
        ("Step time: measured/predicted x1.300 over 9 steps, applied. After it, on the same steps (in-sample): "
         "-15.4% to +15.4%, median |error| 3.8%. Before it: median |error| 30.0%."),
        "Communication: -.",
    )
    assert calibration.confidence() == " ".join(calibration.confidence_lines())
    report = calibration.to_dict()
    assert report["measured_on"] == {"steps": 9, "models": ["llama2-7b", "llama3.2-1b"], "gpus": [1, 2],
                                     "policies": ["every-2", "full", "none"], "unit": "GPU"}
    assert report["time"]["error_range"] == [pytest.approx(1.1 / 1.3 - 1), pytest.approx(1.5 / 1.3 - 1)]
    assert report["time"]["raw_range"] == [pytest.approx(0.1), pytest.approx(0.5)]
    assert report["communication"]["error_range"] is None and report["confidence"] == calibration.confidence()


def test_a_plan_outside_what_was_measured_says_so():
    calibration = calibrate("NVIDIA H200", MEASURED)
    assert calibration.confidence_lines("llama3-70b", 64, "every-2")[1] == (
        "This plan: llama3-70b, 64 GPUs, policy every-2: outside what was measured (model, GPU count, policy).")
    assert calibration.confidence_lines("llama3.2-1b", 1, "full")[1] == (
        "This plan: llama3.2-1b, 1 GPU, policy full: inside what was measured.")
    assert calibration.confidence_lines("llama3.2-1b", 8)[1] == (  # nothing fits: no policy to judge
        "This plan: llama3.2-1b, 8 GPUs: outside what was measured (GPU count).")
    cpu = calibrate("Some CPU", MEASURED, unit="device")
    assert cpu.confidence_lines("llama3.2-1b", 2, "none")[:2] == (
        "Measured on Some CPU: 8 steps. Models: llama3.2-1b. Devices: 1. Policies: full, none.",
        "This plan: llama3.2-1b, 2 devices, policy none: outside what was measured (device count).")


def test_what_was_measured_counts_only_the_steps_a_fit_kept():
    busy = Observation(None, None, 1.0, 1.3, "busy", model="gpt2", gpus=8, policy="offload", noisy="busy host")
    far = Observation(None, None, 1.0, 13.0, "odd", model="gpt2", gpus=4, policy="selective")
    unknown = Observation(None, None, 1.0, 1.3, "no provenance")
    assert calibrate("gpu", [*MEASURED, busy, far, unknown]).measured_on == MeasuredOn(
        9, ("llama3.2-1b",), (1,), ("full", "none"))
    # A noisy step's memory still counts, and with it what it ran.
    busy_memory = Observation(10.0, 12.0, 1.0, 1.3, "busy", model="gpt2", gpus=8, policy="offload", noisy="busy host")
    assert calibrate("gpu", [busy_memory]).measured_on == MeasuredOn(1, ("gpt2",), (8,), ("offload",))
    assert calibrate("gpu", [unknown]).confidence_lines()[0] == (
        "Measured on gpu: 1 step. Models: -. GPUs: -. Policies: -.")


def test_nothing_usable_reads_a_dash_and_one_step_claims_no_accuracy():
    noisy = [Observation(None, None, 1.0, 1.2, f"s{i}", noisy="busy host") for i in range(3)]
    assert calibrate("gpu", noisy).time.describe("step time") == (
        "Step time: -. Left out: 3 noisy (busy host or spread samples).")
    assert calibrate("gpu", MEASURED[:1]).time.describe("step time") == (
        "Step time: measured/predicted x1.100 over 1 step, applied. After it: 0% by construction (one step, fitted "
        "on itself). Before it: median |error| 10.0%.")
