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
  produces. The error that remains after it is *in-sample*: the factor is
  fitted on the same steps. It says how well one factor fits them, not how
  well it predicts a model, GPU count or policy that was never measured. The
  confidence quotes it as a range (smallest to largest signed error) with
  its median, and names what the steps ran (`MeasuredOn`).
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
    model: str = ""
    """The measured model's name, e.g. 'llama3.2-1b'; empty where not known."""
    gpus: int | None = None
    """Ranks the step ran on (its layout's world size: GPUs, or devices on a CPU); None where not known."""
    policy: str = ""
    """Its checkpoint policy as headroom.core.specs.recompute names it ('none', 'full', 'every-2', ...); empty
    where not known."""


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
    """Median |measured / (factor x predicted) - 1| after correction: in-sample, over the steps the factor is
    fitted on."""
    worst: float
    """Largest error after correction."""
    noisy: int = 0
    """Observations left out because their measurement was noisy."""
    outliers: tuple[str, ...] = ()
    """Observations left out as outliers: their labels with their ratios."""
    ratios: tuple[float, ...] = ()
    """measured / predicted of the ``samples`` observations, ascending: what the ranges are read from."""

    @property
    def applied(self) -> bool:
        """Whether plans multiply by the factor: it is fitted and not far from 1."""
        return self.samples > 0 and 1 / FAR_FACTOR <= self.factor <= FAR_FACTOR

    @property
    def correction(self) -> float:
        """What plans multiply their prediction by: the factor when applied, else 1."""
        return self.factor if self.applied else 1.0

    @property
    def raw_range(self) -> tuple[float, float] | None:
        """The smallest and largest signed error before correction (measured / predicted - 1); None without
        samples."""
        return (self.ratios[0] - 1, self.ratios[-1] - 1) if self.ratios else None

    @property
    def error_range(self) -> tuple[float, float] | None:
        """The smallest and largest signed error after correction (measured / (factor x predicted) - 1), in-sample;
        None without samples."""
        return (self.ratios[0] / self.factor - 1, self.ratios[-1] / self.factor - 1) if self.ratios else None

    def describe(self, what: str) -> str:
        """Short sentences on ``what`` (capitalised): the factor, whether plans apply it, the error after it
        (in-sample) as a range with its median, the error before it, and what was left out. "-" where no step
        was usable."""
        what = what[:1].upper() + what[1:]
        left_out = self._left_out()
        tail = f" Left out: {left_out}." if left_out else ""
        if not self.samples:
            return f"{what}: -.{tail}"
        head = f"{what}: measured/predicted x{self.factor:.3f} over {_count(self.samples, 'step')}"
        if not self.applied:
            return (f"{head}, not applied. It is beyond {FAR_FACTOR:g}x: the model misses something on this device. "
                    f"Uncorrected: {_span(self.raw_range)}, median |error| {self.raw_error:.1%}.{tail}")
        if self.samples == 1:
            after = "After it: 0% by construction (one step, fitted on itself)."
        else:
            after = (f"After it, on the same steps (in-sample): {_span(self.error_range)}, "
                     f"median |error| {self.error:.1%}.")
        return f"{head}, applied. {after} Before it: median |error| {self.raw_error:.1%}.{tail}"

    def _left_out(self) -> str:
        parts = []
        if self.noisy:
            parts.append(f"{self.noisy} noisy (busy host or spread samples)")
        if self.outliers:
            parts.append(f"{len(self.outliers)} outlier{'s' if len(self.outliers) > 1 else ''} "
                         f"({_tally(self.outliers)})")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        """The fit's figures; ``raw_range`` and ``error_range`` are [smallest, largest] signed error before and
        after correction (None without samples). ``error``, ``worst`` and ``error_range`` are in-sample."""
        return {"samples": self.samples, "factor": self.factor, "applied": self.applied,
                "raw_error": self.raw_error, "error": self.error, "worst": self.worst, "noisy": self.noisy,
                "outliers": list(self.outliers),
                "raw_range": list(self.raw_range) if self.raw_range else None,
                "error_range": list(self.error_range) if self.error_range else None}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _span(bounds: tuple[float, float] | None) -> str:
    """A signed range of errors, "-9.1% to +10.8%"; one figure where both ends round alike."""
    if bounds is None:
        return "-"
    low, high = (f"{b:+.1%}" for b in bounds)
    return low if low == high else f"{low} to {high}"


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
    return _fit(pairs)[0]


def _fit(pairs: Iterable[tuple[float | None, float | None, str, bool]]) -> tuple[Fit, frozenset[int]]:
    """`fit_ratio`, and the positions in ``pairs`` of the pairs the factor is fitted on."""
    usable = [(i, p, m, label, noisy) for i, (p, m, label, noisy) in enumerate(pairs)
              if p and m and p > 0 and m > 0]
    clean = [(i, p, m, label) for i, p, m, label, noisy in usable if not noisy]
    noisy = len(usable) - len(clean)
    if not clean:
        return Fit(0, 1.0, 0.0, 0.0, 0.0, noisy=noisy), frozenset()
    centre = statistics.median(m / p for _, p, m, _ in clean)
    kept = [(i, p, m) for i, p, m, _ in clean if abs(math.log(m / p / centre)) <= math.log(OUTLIER_RATIO)]
    outliers = tuple(f"{label} x{m / p:.3g}" for _, p, m, label in clean
                     if abs(math.log(m / p / centre)) > math.log(OUTLIER_RATIO))
    factor = statistics.median(m / p for _, p, m in kept)
    raw = [abs(m / p - 1) for _, p, m in kept]
    corrected = [abs(m / (factor * p) - 1) for _, p, m in kept]
    fit = Fit(len(kept), factor, statistics.median(raw), statistics.median(corrected), max(corrected),
              noisy=noisy, outliers=outliers, ratios=tuple(sorted(m / p for _, p, m in kept)))
    return fit, frozenset(i for i, _, _ in kept)


@dataclass(frozen=True, slots=True)
class MeasuredOn:
    """What a calibration's steps ran: each sorted, each empty where no step said.

    The steps are the ones at least one fit kept (`Calibration`: noisy steps still count for memory,
    outliers for nothing)."""

    steps: int = 0
    models: tuple[str, ...] = ()
    """Model names, e.g. ('llama3.2-1b',)."""
    gpus: tuple[int, ...] = ()
    """Ranks a step ran on (its layout's world size), e.g. (1, 8)."""
    policies: tuple[str, ...] = ()
    """Checkpoint policies as headroom.core.specs.recompute names them."""
    unit: str = "GPU"
    """What one rank is: ``GPU``, or ``device`` on a CPU."""

    @classmethod
    def of(cls, observations: Iterable[Observation], unit: str = "GPU") -> MeasuredOn:
        """What ``observations`` ran, counted and named."""
        observations = list(observations)
        return cls(len(observations), tuple(sorted({o.model for o in observations if o.model})),
                   tuple(sorted({o.gpus for o in observations if o.gpus})),
                   tuple(sorted({o.policy for o in observations if o.policy})), unit)

    def describe(self, device: str) -> str:
        """Short sentences: the device and the step count, then the models, GPU counts and policies ("-" where no
        step said)."""
        return (f"Measured on {device}: {_count(self.steps, 'step')}. Models: {_listed(self.models)}. "
                f"{self.unit[:1].upper() + self.unit[1:]}s: {_listed(self.gpus)}. Policies: {_listed(self.policies)}.")

    def outside(self, model: str | None, gpus: int | None, policy: str | None = None) -> tuple[str, ...]:
        """What of a plan (its model name, GPU count, checkpoint policy; None: not asked) no kept step ran."""
        checks = (("model", model, self.models), (f"{self.unit} count", gpus, self.gpus),
                  ("policy", policy, self.policies))
        return tuple(name for name, value, measured in checks if value is not None and value not in measured)

    def to_dict(self) -> dict:
        return {"steps": self.steps, "models": list(self.models), "gpus": list(self.gpus),
                "policies": list(self.policies), "unit": self.unit}


def _listed(values: tuple) -> str:
    return ", ".join(map(str, values)) if values else "-"


@dataclass(frozen=True, slots=True)
class Calibration:
    """A device's fits, what their steps ran, and the confidence a plan quotes from them."""

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
    measured_on: MeasuredOn = MeasuredOn()
    """The models, GPU counts and policies of the steps the fits kept."""

    @property
    def calibrated(self) -> bool:
        return bool(self.memory.applied or self.time.applied)

    def confidence_lines(self, model: str | None = None, gpus: int | None = None,
                         policy: str | None = None) -> tuple[str, ...]:
        """The confidence, one topic a line, each line short sentences: what was measured; with a plan's
        ``model``, ``gpus`` and ``policy``, whether it lies inside that; peak memory, step time and
        communication, each with its factor, its in-sample error range and what was left out ("-" where nothing
        was usable); the ledger check where probed; steps the core cannot read."""
        measured = self.memory.samples or self.time.samples or self.activations.samples
        if not measured and not self.time.noisy and not self.time.outliers:
            unread = f" ({self.unreadable} stored steps today's core cannot read)" if self.unreadable else ""
            return (f"Uncalibrated: no measured training steps on {self.device}{unread}.",)
        lines = [self.measured_on.describe(self.device)]
        if model is not None or gpus is not None:
            lines.append(self._plan_scope(model, gpus, policy))
        if self.memory.samples or self.memory.noisy or not self.activations.samples:
            lines.append(self.memory.describe("peak memory"))
        else:
            lines.append("Peak memory: - (no allocator statistics on this device).")
        lines.append(self.time.describe("step time"))
        lines.append(self.communication.describe("communication"))
        if self.activations.samples:
            check = self.activations
            left_out = check._left_out()
            lines.append(f"Saved activations (a check of the ledger, not applied): measured/predicted "
                         f"x{check.factor:.3f} over {_count(check.samples, 'step')}. Off by {_span(check.raw_range)}, "
                         f"median |error| {check.raw_error:.1%}." + (f" Left out: {left_out}." if left_out else ""))
        if self.unreadable:
            lines.append(f"{self.unreadable} stored steps left out: today's core cannot read their configuration.")
        return tuple(lines)

    def _plan_scope(self, model: str | None, gpus: int | None, policy: str | None) -> str:
        unit = self.measured_on.unit
        what = ", ".join(part for part in (model, _count(gpus, unit) if gpus is not None else None,
                                           f"policy {policy}" if policy else None) if part)
        outside = self.measured_on.outside(model, gpus, policy)
        return f"This plan: {what}: " + (f"outside what was measured ({', '.join(outside)})." if outside
                                         else "inside what was measured.")

    def confidence(self) -> str:
        """`confidence_lines` without a plan, as one text."""
        return " ".join(self.confidence_lines())

    def to_dict(self) -> dict:
        return {"device": self.device, "memory": self.memory.to_dict(), "time": self.time.to_dict(),
                "communication": self.communication.to_dict(), "activations": self.activations.to_dict(),
                "unreadable_steps": self.unreadable, "measured_on": self.measured_on.to_dict(),
                "confidence": self.confidence()}


def calibrate(device: str, observations: Iterable[Observation], unit: str = "GPU") -> Calibration:
    """The fits of ``observations``; a noisy step's memory still counts (bytes do not depend on the load).
    ``unit`` names one rank of ``device`` (``GPU``, or ``device`` on a CPU)."""
    observations = list(observations)
    memory, memory_kept = _fit((o.predicted_bytes, o.measured_bytes, o.label, False) for o in observations)
    time, time_kept = _fit((o.predicted_s, o.measured_s, o.label, o.noisy is not None) for o in observations)
    communication, communication_kept = _fit((o.predicted_communication_s, o.measured_communication_s, o.label,
                                              o.noisy is not None) for o in observations)
    activations, activations_kept = _fit((o.predicted_activation_bytes, o.measured_activation_bytes, o.label, False)
                                         for o in observations)
    kept = memory_kept | time_kept | communication_kept | activations_kept
    return Calibration(device=device, memory=memory, time=time, communication=communication,
                       activations=activations,
                       measured_on=MeasuredOn.of((o for i, o in enumerate(observations) if i in kept), unit))


def uncalibrated(device: str) -> Calibration:
    return Calibration(device, NO_FIT, NO_FIT)
