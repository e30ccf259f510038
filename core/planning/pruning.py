"""What a layout search may leave out: a candidate whose step cannot come within a near tie of the fastest.

Every candidate's step time has a floor that costs no ledger and no collective
(headroom.core.timing.step.step_floor_s: each pipeline stage's forward, backward and recompute through the
schedule; every other term is never negative). A search keeps the fastest fitting step it has found (`Bar`) and
does not evaluate a candidate whose floor is slower than that by more than ``NEAR``: such a candidate cannot be
the recommendation, nor tie with it. A layout is floored by its lightest-computing candidates (no recompute, at
each micro-batch and recipe it tries: headroom.core.planning.planner), so a whole layout goes before its ledgers
are built; the search tries layouts from the lowest floor up, so that the bar falls early.

What the plan shows of the left-out (`PrunedLayout`): the layout, the floor no candidate of it beats, and whether
its lightest candidate fitted where the search got as far as screening it. The recommendation and every candidate
within a near tie of it are the same as without pruning (tests/test_pruning.py checks it against full searches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headroom.core.specs.layout import Layout
from headroom.core.specs.recompute import RecomputePolicy
from headroom.core.timing.step import HardwareProfile, step_floor_s

if TYPE_CHECKING:
    from headroom.core.measured.calibration import Calibration
    from headroom.core.planning.planner import Candidate, PlanRequest

FLOAT_SLACK = 1e-9
"""Relative margin before a floor counts as beyond the bar: the floor and the step add the same terms in
different orders."""
NO_RECOMPUTE = RecomputePolicy("none")


@dataclass(slots=True)
class Bar:
    """The fastest fitting step a search has found, in calibrated seconds, and the near tie around it."""

    near: float
    """The relative tokens/s within which two candidates tie (headroom.core.planning.planner.NEAR)."""
    fastest_s: float = math.inf

    @property
    def limit_s(self) -> float:
        """The slowest step that still ties with the fastest."""
        return self.fastest_s / (1 - self.near)

    def beyond(self, floor_s: float) -> bool:
        """A step of at least ``floor_s`` cannot tie with the fastest found."""
        return floor_s > self.limit_s * (1 + FLOAT_SLACK)

    def saw(self, candidate: Candidate) -> None:
        if candidate.rejection is None:
            self.fastest_s = min(self.fastest_s, candidate.step_time_s)


@dataclass(frozen=True, slots=True)
class PrunedLayout:
    """A layout the search left out because no candidate of it can tie with the recommendation."""

    layout: Layout
    floor_s: float
    """Calibrated seconds a step of this layout takes at least: the lowest floor of its candidates, or where the
    search evaluated some (its lightest fitted), the faster of its fastest fitting one and the lowest floor of
    the rest."""
    fits: bool | None
    """Its lightest candidate (the smallest micro-batch, full recompute) fits; None: not screened."""

    def max_tokens_per_s(self, tokens_per_step: int) -> float:
        """The most tokens a second any candidate of it could train, ``tokens_per_step`` a step."""
        return tokens_per_step / self.floor_s

    def why_left_out(self, tokens_per_step: int, fastest_tokens_per_s: float) -> str:
        """Why the search did not evaluate it: its floor against the fastest fitting candidate's speed."""
        at_most = self.max_tokens_per_s(tokens_per_step)
        fits = {None: "", True: "; its lightest candidate fits"}.get(self.fits, "")
        return (f"left out: a step takes at least {self.floor_s:.3g} s (at most {at_most:,.0f} tokens/s, "
                f"{_percent(1 - at_most / fastest_tokens_per_s)} below the fastest){fits}")


def _percent(fraction: float) -> str:
    """"1.02%" near the near tie, where a rounder figure would read as within it; "12%" beyond."""
    return f"{fraction:.2%}" if fraction < 0.1 else f"{fraction:.0%}"


def candidate_floor_s(request: PlanRequest, profile: HardwareProfile, calibration: Calibration, micro_batch: int,
                      policy: RecomputePolicy) -> float:
    """Calibrated seconds a step of this candidate takes at least (headroom.core.timing.step.step_floor_s)."""
    seconds = step_floor_s(request.spec, request.base_config(micro_batch, policy), profile,
                           request.per_rank_batch // micro_batch)
    return seconds * calibration.time.correction

