"""headroom.core.measured.measurements: plain measurement records -> HardwareProfile and Calibration, numbers worked by hand."""

from __future__ import annotations

import pytest

from headroom.core.errors import ConfigError
from headroom.core.measured.calibration import MeasuredOn, Observation
from headroom.core.measured.measurements import (
    UNMEASURED_BANDWIDTH_BYTES_PER_S,
    AttentionRecord,
    DeviceRecord,
    ElementwiseRecord,
    MatmulRecord,
    StepPrediction,
    TrainStepRecord,
    allocator_fragmentation,
    attention_throughput,
    calibration_from_steps,
    copy_bandwidth,
    fragmentation_by_policy,
    matmul_curve,
    predict_step,
    profile_from_measurements,
    step_observations,
)
from headroom.core.memory.estimate import estimate
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.timing.op_time import anchor_efficiency
from headroom.core.timing.step import (
    ATTENTION_BACKWARD_RATIO,
    DEFAULT_FRAGMENTATION,
    MatmulPoint,
    datasheet_profile,
    step_time,
)

SPEC = get_preset("bench-llama-small").to_dict()
CPU = DeviceRecord("Some Host CPU", "cpu", None)
H100 = DeviceRecord("NVIDIA H100 80GB HBM3", "cuda", None)


def step(**fields) -> TrainStepRecord:
    base = dict(model_name="bench-llama-small", model_spec=SPEC, seq_len=128, micro_batch=2, accumulation_steps=1,
                precision="fp32", optimizer="adamw", attention="flash", recompute="none", median_s=0.5)
    return TrainStepRecord(**base | fields)


# ---- the pieces ------------------------------------------------------------------------------


def test_matmul_curve_takes_the_median_per_size_and_never_decreases():
    records = [
        MatmulRecord("fp32", 400, 4.0), MatmulRecord("fp32", 100, 1.0), MatmulRecord("fp32", 100, 3.0),
        MatmulRecord("fp32", 100, 2.0), MatmulRecord("bf16", 100, 10.0), MatmulRecord("fp32", 200, 1.5),
        MatmulRecord("fp32", 400, 5.0),
    ]
    # fp32: 100 -> median(1, 3, 2) = 2; 200 -> 1.5 dips below 2, so 2 is carried; 400 -> median(4, 5) = 4.5.
    assert matmul_curve(records) == {
        "fp32": (MatmulPoint(100.0, 2.0), MatmulPoint(200.0, 2.0), MatmulPoint(400.0, 4.5)),
        "bf16": (MatmulPoint(100.0, 10.0),),
    }
    assert matmul_curve(reversed(records)) == matmul_curve(records)
    assert matmul_curve([]) == {}
    # Rows no measurement can produce (a damaged store, a forged import) are not rates.
    damaged = [MatmulRecord("fp32", 100, -5.0), MatmulRecord("fp32", 100, float("nan")), MatmulRecord("bf16", 0, 1.0)]
    assert matmul_curve([*records, *damaged]) == matmul_curve(records)


def test_attention_is_the_fastest_backend_at_the_largest_shape():
    # forward FLOPs 4 b s^2 a d: b=1, s=4, a=2, d=8 -> 1024; b=2 -> 2048.
    records = [
        AttentionRecord(1, 4, 2, 8, forward_s=0.1, backward_s=0.2),  # fastest, but not the largest shape
        AttentionRecord(2, 4, 2, 8, forward_s=2.0, backward_s=5.0),
        AttentionRecord(2, 4, 2, 8, forward_s=1.0, backward_s=2.5),
        AttentionRecord(4, 4, 2, 8, forward_s=None),  # larger, but no forward time: ignored
    ]
    assert records[1].forward_flops == 2048
    assert attention_throughput(records) == (2048.0, 2.5)
    assert attention_throughput([AttentionRecord(1, 4, 2, 8, forward_s=0.5)]) == (2048.0, None)
    assert attention_throughput([AttentionRecord(1, 4, 2, 8, forward_s=None)]) is None


def test_bandwidth_is_the_best_copy_and_fragmentation_the_median_ratio():
    assert copy_bandwidth([ElementwiseRecord("copy", 5e9), ElementwiseRecord("add", 9e9),
                           ElementwiseRecord("copy", 7e9)]) == 7e9
    assert copy_bandwidth([ElementwiseRecord("relu", 9e9)]) is None
    steps = [step(peak_allocated_bytes=100, peak_reserved_bytes=r) for r in (150, 110, 120)]
    steps.append(step(peak_reserved_bytes=999))  # a CPU step: no allocator statistics
    assert allocator_fragmentation(steps) == 1.2  # median(1.5, 1.1, 1.2)
    assert allocator_fragmentation([step()]) is None


# ---- the profile ------------------------------------------------------------------------------


def test_a_device_without_a_datasheet_row_states_every_guess():
    profile = profile_from_measurements(CPU, matmul=[MatmulRecord("fp32", 100, 2e9)], host_memory_bytes=64 * 10**9)
    assert profile.source == "measured" and profile.device == "cpu" and profile.name == "Some Host CPU"
    assert profile.memory_bytes == 64 * 10**9  # the host's: the fingerprint has none
    assert profile.peak_flop_per_s == {}
    assert profile.matmul == {"fp32": (MatmulPoint(100.0, 2e9),)}
    assert profile.attention_flop_per_s == 1e9  # half the best matmul rate
    assert profile.attention_backward_ratio == ATTENTION_BACKWARD_RATIO
    assert profile.hbm_bytes_per_s == UNMEASURED_BANDWIDTH_BYTES_PER_S == 10e9
    assert profile.fragmentation == DEFAULT_FRAGMENTATION
    assert profile.assumptions == (
        "attention at half the matmul rate (not measured)",
        "bandwidth not measured",
        "allocator fragmentation 1.10x (no CUDA allocator statistics stored)",
        "host dispatch not measured: fitted to the H200 reference run (tests/data/reference)",
    )


def test_a_cuda_device_fills_gaps_from_its_datasheet_row():
    profile = profile_from_measurements(
        H100,
        attention=[AttentionRecord(2, 4, 2, 8, forward_s=1e-12, backward_s=3e-12)],
        elementwise=[ElementwiseRecord("copy", 3e12)],
        train_steps=[step(peak_allocated_bytes=100, peak_reserved_bytes=r) for r in (105, 110)],
    )
    assert profile.device == "cuda" and profile.memory_bytes == 80 * 10**9  # the H100 SXM row's
    assert profile.peak_flop_per_s["bf16"] == 989.4e12
    # No matmul measured: the datasheet row's point per dtype and its shape model's anchor (headroom.core.timing.device_curves).
    datasheet = datasheet_profile(get_hardware("h100-sxm"))
    assert profile.matmul["bf16"] == datasheet.matmul["bf16"]
    assert (profile.matmul_efficiency, profile.sms) == (datasheet.matmul_efficiency, 132)
    assert profile.attention_flop_per_s == 2048 / 1e-12
    assert profile.attention_backward_ratio == 3e-12 / 1e-12
    assert profile.hbm_bytes_per_s == 3e12
    assert profile.fragmentation == pytest.approx(1.075)  # median(1.05, 1.10)
    assert profile.assumptions == (datasheet.assumptions[0], "GEMMs by shape from the datasheet row's cited GEMM "
                                   "(no bf16 GEMM of 1.37e+11 FLOPs or more measured)",
                                   "host dispatch not measured: fitted to the H200 reference run (tests/data/reference)")


def test_datasheet_fallbacks_for_attention_and_bandwidth_and_stored_memory():
    device = DeviceRecord("NVIDIA H100 80GB HBM3", "cuda", 85_520_809_984)
    profile = profile_from_measurements(device, matmul=[MatmulRecord("bf16", 10**12, 700e12)])
    assert profile.memory_bytes == 85_520_809_984  # the fingerprint's, before the datasheet's
    assert profile.matmul == {"bf16": (MatmulPoint(1e12, 700e12),)}
    # The box's own large GEMM anchors the shape model: a cube of its FLOPs, 7,937 on a side, at 700 TFLOP/s.
    assert profile.matmul_efficiency == anchor_efficiency(700e12, 989.4e12, 7937, 7937, 7937, 132)
    datasheet = datasheet_profile(get_hardware("h100-sxm"))
    assert profile.attention_flop_per_s == datasheet.attention_flop_per_s == 2 * 989.4e12 * 0.56
    assert profile.hbm_bytes_per_s == datasheet.hbm_bytes_per_s == 3.35e12 * 0.85
    assert profile.assumptions == ("attention at half the matmul rate (not measured)", "bandwidth not measured",
                                   "allocator fragmentation 1.10x (no CUDA allocator statistics stored)",
                                   "host dispatch not measured: fitted to the H200 reference run (tests/data/reference)")


def test_a_cpu_never_takes_a_datasheet_row_and_nothing_to_go_on_is_an_error():
    # A CPU's name is never matched to a GPU row, even when it would match.
    named_like_a_gpu = DeviceRecord("NVIDIA H100 80GB HBM3", "cpu", 10**9)
    assert profile_from_measurements(named_like_a_gpu, matmul=[MatmulRecord("fp32", 1, 1.0)]).peak_flop_per_s == {}
    with pytest.raises(ConfigError, match="Mystery GPU has no matmul measurements in the store and no datasheet row"):
        profile_from_measurements(DeviceRecord("Mystery GPU", "cuda", 10**9))
    with pytest.raises(ConfigError, match="memory size unknown"):
        profile_from_measurements(CPU, matmul=[MatmulRecord("fp32", 1, 1.0)])


# ---- the calibration --------------------------------------------------------------------------

PROFILE = profile_from_measurements(CPU, matmul=[MatmulRecord("fp32", 100, 2e9)], host_memory_bytes=64 * 10**9)


def test_predict_step_is_the_current_core_on_the_steps_configuration():
    record = step(recompute="full", accumulation_steps=2, micro_batch=1)
    config = TrainConfig(seq_len=128, micro_batch=1, precision="fp32", optimizer="adamw", attention="flash",
                         recompute=parse_policy("full"))
    expected = estimate(get_preset("bench-llama-small"), config, "cpu", 2)
    assert predict_step(record, PROFILE) == StepPrediction(
        expected.peak_bytes, expected.ledger.saved_bytes, step_time(expected, PROFILE, 2).total_s)
    # A step an older core recorded that today's no longer reads is left out, not guessed.
    assert predict_step(step(model_spec={"n_layers": 2, "colour": "red"}), PROFILE) is None
    assert predict_step(step(recompute="every-x"), PROFILE) is None
    assert predict_step(step(precision="fp4"), PROFILE) is None


def test_observations_pair_peaks_where_measured_and_saved_activations_wherever_probed():
    cpu_step = step(activation_bytes=1000)
    cuda_step = step(peak_allocated_bytes=5000, activation_bytes=900, median_s=0.25)
    predicted = predict_step(cpu_step, PROFILE)
    observations = step_observations([cpu_step, step(model_spec={"bogus": 1}), cuda_step], PROFILE)
    label = "bench-llama-small micro 2 x1 none"
    ran = {"model": "bench-llama-small", "gpus": 1, "policy": "none"}
    assert observations == [
        Observation(None, None, predicted.step_time_s, 0.5, label, predicted_activation_bytes=predicted.saved_bytes,
                    measured_activation_bytes=1000, **ran),
        Observation(predicted.peak_bytes, 5000, predicted.step_time_s, 0.25, label,
                    predicted_activation_bytes=predicted.saved_bytes, measured_activation_bytes=900, **ran),
    ]


@pytest.mark.parametrize("fields, noisy", [
    (dict(min_s=0.45, max_s=0.6), None),
    (dict(min_s=0.45, max_s=1.0), "its steps spread 110% of their median"),
    (dict(min_s=0.45, max_s=0.5, busy=True), "the agent found the host busy"),
    (dict(), None),  # no range stored: nothing to judge by
])
def test_a_step_is_noisy_when_the_agent_flagged_its_host_or_its_steps_disagree(fields, noisy):
    assert step(**fields).noisy == noisy
    assert step_observations([step(**fields)], PROFILE)[0].noisy == noisy


def test_each_configuration_is_predicted_once(monkeypatch):
    import headroom.core.measured.measurements

    calls = []
    monkeypatch.setattr(headroom.core.measured.measurements, "predict_step", lambda s, p: calls.append(s) or StepPrediction(1, 1, 1.0))
    steps = [step(), step(median_s=0.7), step(dropout=0.1), step(recompute="full")]
    assert len(step_observations(steps, PROFILE)) == 4
    assert calls == [steps[0], steps[2], steps[3]]  # the second reran the first's configuration


def test_calibration_factor_and_errors_by_hand():
    base = [step(micro_batch=b) for b in (1, 2, 4)]
    predicted = [predict_step(s, PROFILE) for s in base]
    # Measured = 1x, 2x and 4x the prediction (memory and time alike).
    steps = [step(micro_batch=s.micro_batch, activation_bytes=p.saved_bytes * k, median_s=p.step_time_s * k)
             for s, p, k in zip(base, predicted, (1, 2, 4), strict=True)]
    calibration = calibration_from_steps("Some Host CPU", steps, PROFILE)
    assert calibration.device == "Some Host CPU"
    for fit in (calibration.activations, calibration.time):
        assert fit.samples == 3 and not fit.outliers and not fit.noisy
        assert fit.factor == 2.0  # median(1, 2, 4)
        assert fit.raw_error == 1.0  # median |m/p - 1| of (0, 1, 3)
        assert fit.error == 0.5  # median |m/2p - 1| of (0.5, 0, 1)
        assert fit.worst == 1.0
    assert calibration.memory.samples == 0  # no allocator peak on a CPU: nothing to calibrate a peak with
    assert calibration.time.applied and calibration.time.correction == 2.0
    assert not calibration_from_steps("Some Host CPU", [], PROFILE).calibrated
    # What the steps ran, named as a CPU's ranks are: devices.
    assert calibration.measured_on == MeasuredOn(3, ("bench-llama-small",), (1,), ("none",), unit="device")
    assert calibration.confidence_lines("llama3-70b", 64)[:2] == (
        "Measured on Some Host CPU: 3 steps. Models: bench-llama-small. Devices: 1. Policies: none.",
        "This plan: llama3-70b, 64 devices: outside what was measured (model, device count).")


def test_what_a_multi_rank_step_ran_is_its_layouts_world_size():
    pair = step(layout={"tp": 2, "sp": True}, rank=1, communication_s=0.1)
    assert pair.world == 2 and step().world == 1
    (observation,) = step_observations([pair], PROFILE)
    assert (observation.model, observation.gpus, observation.policy) == ("bench-llama-small", 2, "none")


def test_stored_steps_the_core_cannot_read_are_left_out_and_counted():
    poisoned = [step(model_spec=SPEC | {"n_layers": 10**12}), step(model_spec=SPEC | {"hidden": "wide"})]
    calibration = calibration_from_steps("cpu", [step(activation_bytes=1000), *poisoned], PROFILE)
    assert calibration.time.samples == 1 and calibration.unreadable == 2
    assert calibration.confidence_lines()[-1] == ("2 stored steps left out: today's core cannot read their "
                                                  "configuration.")
    assert calibration.to_dict()["unreadable_steps"] == 2


def test_fragmentation_is_also_read_by_policy_kind():
    """Each policy kind's median reserved / allocated (every-K together); steps without allocator statistics or
    with a policy that no longer reads are left out."""
    steps = [step(recompute=policy, peak_allocated_bytes=100, peak_reserved_bytes=reserved)
             for policy, reserved in (("none", 102), ("none", 104), ("full", 108), ("every-2", 106), ("every-4", 110))]
    steps += [step(recompute="full", peak_allocated_bytes=None, peak_reserved_bytes=None),
              step(recompute="sometimes", peak_allocated_bytes=100, peak_reserved_bytes=150)]
    assert fragmentation_by_policy(steps) == pytest.approx({"every": 1.08, "full": 1.08, "none": 1.03})
    profile = profile_from_measurements(H100, train_steps=steps)
    assert profile.fragmentation == pytest.approx(1.07)  # every step's median, the unreadable policy's too
    assert profile.fragmentation_for(parse_policy("every-8")) == pytest.approx(1.08)
    assert profile.fragmentation_for(parse_policy("offload")) == profile.fragmentation  # not measured: the median
    assert profile.fragmentation_text() == "1.07 (by checkpoint policy: every-K 1.08, full 1.08, none 1.03)"
