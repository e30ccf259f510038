"""Calibration: how far the core's predictions were from a device's measured training steps.

Each `Observation` pairs a prediction with a measurement of one training-step
configuration on one device. ``fit`` takes the median ratio measured /
predicted as a correction factor (one for memory, one for time: robust to the
odd outlier, and a scale error is what a missing term or a slow kernel
produces), then reports the error that remains after correcting: median and
worst absolute relative error. Plans multiply their predictions by the
factors and quote the remaining error as their confidence.

Memory observations use peak allocated bytes where the device reports them
(CUDA) and the saved-activation bytes otherwise (CPU, where torch has no
allocator statistics).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Observation:
    predicted_bytes: float | None
    measured_bytes: float | None
    predicted_s: float | None
    measured_s: float | None
    label: str = ""
    predicted_communication_s: float | None = None
    """A multi-rank step's exposed communication, predicted and measured (None on one device)."""
    measured_communication_s: float | None = None
    """What was measured, e.g. 'micro 4, full'."""


@dataclass(frozen=True, slots=True)
class Fit:
    """One quantity's correction factor and the error that remains after applying it."""

    samples: int
    factor: float
    """Median measured / predicted; 1.0 without samples."""
    raw_error: float
    """Median |predicted / measured - 1| before correction."""
    error: float
    """Median |factor x predicted / measured - 1| after correction."""
    worst: float
    """Largest error after correction."""

    def describe(self, what: str) -> str:
        if not self.samples:
            return f"{what}: no measurements"
        return (
            f"{what}: x{self.factor:.3f} from {self.samples} measured steps, "
            f"then within {self.error:.1%} (worst {self.worst:.1%}; {self.raw_error:.1%} before)"
        )


NO_FIT = Fit(samples=0, factor=1.0, raw_error=0.0, error=0.0, worst=0.0)


def fit_ratio(pairs: Iterable[tuple[float, float]]) -> Fit:
    """pairs of (predicted, measured), both positive."""
    pairs = [(p, m) for p, m in pairs if p and m and p > 0 and m > 0]
    if not pairs:
        return NO_FIT
    factor = statistics.median(m / p for p, m in pairs)
    raw = [abs(p / m - 1) for p, m in pairs]
    corrected = [abs(factor * p / m - 1) for p, m in pairs]
    return Fit(len(pairs), factor, statistics.median(raw), statistics.median(corrected), max(corrected))


@dataclass(frozen=True, slots=True)
class Calibration:
    device: str
    memory: Fit
    time: Fit
    communication: Fit = NO_FIT
    """The exposed-communication term of multi-rank steps, on its own."""

    @property
    def calibrated(self) -> bool:
        return bool(self.memory.samples or self.time.samples)

    def confidence(self) -> str:
        if not self.calibrated:
            return f"uncalibrated: no measured training steps on {self.device}"
        text = f"{self.memory.describe('memory')}; {self.time.describe('step time')}"
        if self.communication.samples:
            text += f"; {self.communication.describe('communication')}"
        return text

    def to_dict(self) -> dict:
        def fit(f: Fit) -> dict:
            return {"samples": f.samples, "factor": f.factor, "raw_error": f.raw_error, "error": f.error, "worst": f.worst}

        return {"device": self.device, "memory": fit(self.memory), "time": fit(self.time),
                "communication": fit(self.communication), "confidence": self.confidence()}


def calibrate(device: str, observations: Iterable[Observation]) -> Calibration:
    observations = list(observations)
    return Calibration(
        device=device,
        memory=fit_ratio((o.predicted_bytes, o.measured_bytes) for o in observations),
        time=fit_ratio((o.predicted_s, o.measured_s) for o in observations),
        communication=fit_ratio((o.predicted_communication_s, o.measured_communication_s) for o in observations),
    )


def uncalibrated(device: str) -> Calibration:
    return Calibration(device, NO_FIT, NO_FIT)
