"""A benchmark case: one thing the suite measures and records as one result row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from headroom.db.models import Result


@dataclass(frozen=True, slots=True)
class Case:
    kind: str
    """``matmul``, ``elementwise``, ``attention`` or ``train``."""
    name: str
    """What a person reads in the progress bar and the summary, e.g. 'bf16 8192x8192x8192'."""
    expected_s: float
    """Rough wall time, for the ETA."""
    measure: Callable[[torch.device], Result]
    """Runs the benchmark and returns its result row (status ok, or skipped with the reason)."""
    failed: Callable[[str, str], Result]
    """Builds the row for a run that raised: (status 'oom' or 'error', message)."""


def skipped(result: Result, reason: str) -> Result:
    """Mark a row as not measured on purpose, with the reason (e.g. fp8 on a CPU)."""
    result.status = "skipped"
    result.message = reason
    return result
