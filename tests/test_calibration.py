"""Calibration is robust and says what it did: noisy steps and outliers left out and named, factors far
from 1 reported but not applied, a comparison of saved activations never passed off as a peak."""

from __future__ import annotations

import pytest

from headroom.core.measured.calibration import (
    FAR_FACTOR,
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
    assert "left out: 1 outlier (rerun on a busy box x13)" in fit.describe("step time")


def test_a_step_the_agent_flagged_is_left_out_and_counted():
    clean = calibrate("gpu", CLEAN).time
    flagged = Observation(None, None, 1.0, 3.0, "busy", noisy="the agent found the host busy")
    fit = calibrate("gpu", [*CLEAN, flagged]).time
    assert (fit.factor, fit.samples, fit.noisy, fit.outliers) == (clean.factor, 14, 1, ())
    assert "left out: 1 noisy (busy host or spread samples)" in fit.describe("step time")
    # Its memory still counts: bytes do not depend on the host's load.
    assert calibrate("gpu", [Observation(100.0, 110.0, 1.0, 3.0, "busy", noisy="busy")]).memory.samples == 1


def test_a_factor_far_from_one_is_reported_not_applied():
    far = [Observation(None, None, p, p * 3.0, f"step {p}") for p in (1.0, 2.0, 3.0)]
    fit = calibrate("cpu", far).time
    assert fit.factor == pytest.approx(3.0) and not fit.applied and fit.correction == 1.0
    assert "too far from 1 to apply (beyond 2x)" in fit.describe("step time")
    assert "off by 200% at the median" in fit.describe("step time")
    near = calibrate("cpu", [Observation(None, None, 1.0, FAR_FACTOR, "at the limit")]).time
    assert near.applied and near.correction == FAR_FACTOR


def test_ratios_and_errors_are_measured_over_predicted():
    fit = fit_ratio([(2.0, 3.0, "a", False), (4.0, 6.0, "b", False), (1.0, 2.0, "c", False)])
    assert fit.factor == 1.5 and fit.raw_error == 0.5  # median of m/p - 1: 0.5, 0.5, 1.0
    assert fit.worst == pytest.approx(2.0 / 1.5 - 1)
    assert "measured/predicted x1.500 over 3 steps" in fit.describe("step time")


def test_a_cpu_has_no_memory_calibration_only_a_check_of_the_ledger():
    cpu = [Observation(None, None, 1.0, 1.1, "s1", predicted_activation_bytes=1000.0, measured_activation_bytes=1000.0),
           Observation(None, None, 2.0, 2.1, "s2", predicted_activation_bytes=2000.0, measured_activation_bytes=2000.0)]
    calibration = calibrate("Some CPU", cpu)
    assert calibration.memory.samples == 0 and calibration.memory.correction == 1.0
    text = calibration.confidence()
    assert text.startswith("peak memory: not measured (no allocator statistics on this device); step time:")
    assert "saved activations (a check of the ledger, not applied): measured/predicted x1.000 over 2 steps" in text
    assert "memory within" not in text and calibration.to_dict()["activations"]["samples"] == 2


def test_nothing_measured_is_uncalibrated():
    assert calibrate("gpu", []).confidence() == "uncalibrated: no measured training steps on gpu"
    assert not calibrate("gpu", []).calibrated


def test_a_rerun_outlier_is_named_once_with_its_count():
    clean = [(1.0, 1.0 + i / 100, f"step {i}", False) for i in range(10)]
    reruns = [(1.0, 5.0, "llama micro 1 offload", False)] * 3 + [(1.0, 0.2, f"odd {i}", False) for i in range(6)]
    text = fit_ratio(clean + reruns).describe("step time")
    assert text.endswith("left out: 9 outliers (llama micro 1 offload x5 (3 steps), odd 0 x0.2, odd 1 x0.2, "
                         "odd 2 x0.2, odd 3 x0.2, and 2 more)")
