"""Calibration: how far the core's predictions were from a device's measured training steps.

One convention everywhere: a ratio is measured / predicted (above 1, the step
took more than predicted) and an error is that ratio minus 1.

Each `Observation` pairs a prediction with a measurement of one training-step
configuration on one device. ``fit_ratio`` turns the pairs of one quantity into
a `Fit`:

- **Noisy measurements are left out**, and counted: a step whose timing the
  agent flagged (a busy host, samples that disagree; agent/host_load.py) or
  whose slowest step took more than ``STEP_RANGE_LIMIT`` over its median.
- **Outliers are left out**, and named: a ratio more than ``OUTLIER_RATIO``
  times away from the median ratio (a rerun on a box that was busy, a
  configuration the model gets badly wrong). One such step cannot move the
  factor, and nobody is left guessing why the worst error is 500%.
- **The factor** is the median ratio of what is left: robust to what the
  filters miss, and a scale error is what a missing term or a slow kernel
  produces. The error that remains after it (median and worst) is the
  confidence a plan quotes.
- **A factor far from 1 is not applied** (outside ``1/FAR_FACTOR`` to
  ``FAR_FACTOR``): a model that far off misses something on that device, and
  multiplying every prediction by it would hide that. The confidence says so,
  with the uncorrected error.

Memory has two fits that are never confused. ``memory`` pairs predicted and
measured *peak* allocated bytes, where the device reports them (CUDA): plans
apply it. ``activations`` pairs the ledger's saved-activation bytes with the
bytes autograd actually held (the agent's probe, on every device): a check of
the activation accounting, reported beside the calibration and never applied
to a peak. On a CPU, which has no allocator peak, it is the only memory check.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

STEP_RANGE_LIMIT = 1.0
"""A step whose slowest repetition took more than its median again (range over median above this) is
noisy. GPU training steps of the reference H200 run spread at most 0.17."""
OUTLIER_RATIO = 2.0
"""A ratio more than this factor above or below the median ratio is an outlier."""
FAR_FACTOR = 2.0
"""A factor beyond this (or below its inverse) is reported, not applied."""
OUTLIERS_SHOWN = 5
"""Distinct outliers a description names; the rest are counted."""


@dataclass(frozen=True, slots=True)
class Observation:
    """One measured configuration on one device, predicted again. None where one side is unknown."""

    predicted_bytes: float | None
    """Predicted peak allocated bytes."""
    measured_bytes: float | None
    """Measured peak allocated bytes (None on a device without allocator statistics)."""
    predicted_s: float | None
    measured_s: float | None
    label: str = ""
    """What was measured, e.g. 'micro 4, full'."""
    predicted_communication_s: float | None = None
    """A multi-rank step's exposed communication, predicted and measured (None on one device)."""
    measured_communication_s: float | None = None
    predicted_activation_bytes: float | None = None
    """The ledger's saved-activation bytes, and the bytes autograd held (the agent's probe)."""
    measured_activation_bytes: float | None = None
    noisy: str | None = None
    """Why the step's timing cannot be trusted (its time and communication are left out), or None."""


@dataclass(frozen=True, slots=True)
class Fit:
    """One quantity's correction factor and the error that remains after applying it."""

    samples: int
    """Observations the factor was fitted to (noisy ones and outliers left out)."""
    factor: float
    """Median measured / predicted; 1.0 without samples."""
    raw_error: float
    """Median |measured / predicted - 1| before correction."""
    error: float
    """Median |measured / (factor x predicted) - 1| after correction."""
    worst: float
    """Largest error after correction."""
    noisy: int = 0
    """Observations left out because their measurement was noisy."""
    outliers: tuple[str, ...] = ()
    """Observations left out as outliers: their labels with their ratios."""

    @property
    def applied(self) -> bool:
        """Whether plans multiply by the factor: it is fitted and not far from 1."""
        return self.samples > 0 and 1 / FAR_FACTOR <= self.factor <= FAR_FACTOR

    @property
    def correction(self) -> float:
        """What plans multiply their prediction by: the factor when applied, else 1."""
        return self.factor if self.applied else 1.0

    def describe(self, what: str) -> str:
        left_out = self._left_out()
        if not self.samples:
            return f"{what}: no measurements" + (f" ({left_out})" if left_out else "")
        fitted = f"measured/predicted x{self.factor:.3f} over {self.samples} steps"
        if self.applied:
            text = (f"{what}: {fitted}, then within {self.error:.1%} (worst {self.worst:.1%}; "
                    f"{self.raw_error:.1%} before)")
        else:
            text = (f"{what}: {fitted}, too far from 1 to apply (beyond {FAR_FACTOR:g}x): the model misses "
                    f"something on this device, so predictions stay uncorrected, off by {self.raw_error:.0%} "
                    "at the median")
        return text + (f"; left out: {left_out}" if left_out else "")

    def _left_out(self) -> str:
        parts = []
        if self.noisy:
            parts.append(f"{self.noisy} noisy (busy host or spread samples)")
        if self.outliers:
            parts.append(f"{len(self.outliers)} outlier{'s' if len(self.outliers) > 1 else ''} "
                         f"({_tally(self.outliers)})")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        return {"samples": self.samples, "factor": self.factor, "applied": self.applied,
                "raw_error": self.raw_error, "error": self.error, "worst": self.worst, "noisy": self.noisy,
                "outliers": list(self.outliers)}


def _tally(labels: tuple[str, ...], shown: int = OUTLIERS_SHOWN) -> str:
    """Labels in first-seen order, a repeated one once with its count (a fleet reruns the same steps), the
    first ``shown`` of them."""
    counts = Counter(labels)
    named = [f"{label} ({n} steps)" if n > 1 else label for label, n in counts.items()]
    more = f", and {len(named) - shown} more" if len(named) > shown else ""
    return ", ".join(named[:shown]) + more


NO_FIT = Fit(samples=0, factor=1.0, raw_error=0.0, error=0.0, worst=0.0)


def fit_ratio(pairs: Iterable[tuple[float | None, float | None, str, bool]]) -> Fit:
    """``pairs`` of (predicted, measured, label, noisy); pairs without two positive values are skipped."""
    usable = [(p, m, label, noisy) for p, m, label, noisy in pairs if p and m and p > 0 and m > 0]
    clean = [(p, m, label) for p, m, label, noisy in usable if not noisy]
    noisy = len(usable) - len(clean)
    if not clean:
        return Fit(0, 1.0, 0.0, 0.0, 0.0, noisy=noisy)
    centre = statistics.median(m / p for p, m, _ in clean)
    kept = [(p, m) for p, m, _ in clean if abs(math.log(m / p / centre)) <= math.log(OUTLIER_RATIO)]
    outliers = tuple(f"{label} x{m / p:.3g}" for p, m, label in clean
                     if abs(math.log(m / p / centre)) > math.log(OUTLIER_RATIO))
    factor = statistics.median(m / p for p, m in kept)
    raw = [abs(m / p - 1) for p, m in kept]
    corrected = [abs(m / (factor * p) - 1) for p, m in kept]
    return Fit(len(kept), factor, statistics.median(raw), statistics.median(corrected), max(corrected),
               noisy=noisy, outliers=outliers)


@dataclass(frozen=True, slots=True)
class Calibration:
    device: str
    memory: Fit
    """Peak allocated bytes: applied to plans."""
    time: Fit
    communication: Fit = NO_FIT
    """The exposed-communication term of multi-rank steps, on its own."""
    activations: Fit = NO_FIT
    """Saved-activation bytes: a check of the ledger, never applied to a peak."""
    unreadable: int = 0
    """Stored steps the current core cannot predict (an older core's configuration, a damaged row): left out."""

    @property
    def calibrated(self) -> bool:
        return bool(self.memory.applied or self.time.applied)

    def confidence(self) -> str:
        measured = self.memory.samples or self.time.samples or self.activations.samples
        if not measured and not self.time.noisy and not self.time.outliers:
            unread = f" ({self.unreadable} stored steps today's core cannot read)" if self.unreadable else ""
            return f"uncalibrated: no measured training steps on {self.device}{unread}"
        if self.memory.samples or self.memory.noisy or not self.activations.samples:
            parts = [self.memory.describe("peak memory")]
        else:
            parts = ["peak memory: not measured (no allocator statistics on this device)"]
        parts.append(self.time.describe("step time"))
        if self.communication.samples:
            parts.append(self.communication.describe("communication"))
        if self.activations.samples:
            check = self.activations
            left_out = check._left_out()
            parts.append(f"saved activations (a check of the ledger, not applied): measured/predicted "
                         f"x{check.factor:.3f} over {check.samples} steps, {check.raw_error:.1%} off at the median"
                         + (f"; left out: {left_out}" if left_out else ""))
        if self.unreadable:
            parts.append(f"{self.unreadable} stored steps left out: today's core cannot read their configuration")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {"device": self.device, "memory": self.memory.to_dict(), "time": self.time.to_dict(),
                "communication": self.communication.to_dict(), "activations": self.activations.to_dict(),
                "unreadable_steps": self.unreadable, "confidence": self.confidence()}


def calibrate(device: str, observations: Iterable[Observation]) -> Calibration:
    """The fits of ``observations``; a noisy step's memory still counts (bytes do not depend on the load)."""
    observations = list(observations)
    return Calibration(
        device=device,
        memory=fit_ratio((o.predicted_bytes, o.measured_bytes, o.label, False) for o in observations),
        time=fit_ratio((o.predicted_s, o.measured_s, o.label, o.noisy is not None) for o in observations),
        communication=fit_ratio((o.predicted_communication_s, o.measured_communication_s, o.label,
                                 o.noisy is not None) for o in observations),
        activations=fit_ratio((o.predicted_activation_bytes, o.measured_activation_bytes, o.label, False)
                              for o in observations),
    )


def uncalibrated(device: str) -> Calibration:
    return Calibration(device, NO_FIT, NO_FIT)
