"""Run a suite on one device and record every result as it finishes.

Each case's row is committed on its own (db.store), so a run killed at any
point keeps what finished. A case that raises is recorded, not fatal:
out-of-memory as ``oom``, anything else as ``error`` with its message, and
the suite goes on. Ctrl-C marks the run ``aborted`` and keeps its results.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TextIO

import torch

from agent.cases import Case
from agent.fingerprint import BENCHMARK_VERSION, fingerprint
from agent.progress import Progress
from agent.suites import KINDS, build_cases
from core.errors import ConfigError
from core.timing import HardwareProfile
from db.models import Result
from db.profiles import build_profile
from db.store import Store


@dataclass(slots=True)
class RunReport:
    run_id: str
    device_name: str
    hardware: str
    device_type: str
    rows: list[tuple[Case, Result]] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, status: str) -> int:
        return sum(row.status == status for _, row in self.rows)


def free_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def run_case(case: Case, device: torch.device) -> Result:
    """The case's row; a failure becomes a row too."""
    try:
        return case.measure(device)
    except torch.OutOfMemoryError as err:
        free_memory(device)
        return case.failed("oom", str(err).splitlines()[0][:500])
    except (RuntimeError, ValueError, TypeError, ArithmeticError, AssertionError) as err:
        free_memory(device)
        return case.failed("error", f"{type(err).__name__}: {str(err).splitlines()[0][:500] if str(err) else ''}")


def profile_from_store(store: Store, device_name: str):
    """The device's profile from what the store holds when the first training step runs (once)."""

    @functools.cache
    def provide() -> HardwareProfile | None:
        with store.session() as session:
            try:
                return build_profile(session, device_name)
            except ConfigError:  # nothing measured and no datasheet row: no time prediction
                return None

    return provide


def outcome(row: Result) -> str:
    if row.status != "ok":
        return f"{row.status}: {row.message}"
    for attr, unit in (("tflop_per_s", "TFLOP/s"), ("gb_per_s", "GB/s"), ("tokens_per_s", "tokens/s")):
        value = getattr(row, attr, None)
        if value is not None:
            return f"{value:,.4g} {unit}"
    median = getattr(row, "forward_median_s", None)
    return f"forward {median * 1e3:.3f} ms" if median else "ok"


def run_suite(
    store: Store,
    device: torch.device,
    suite: str,
    *,
    only: tuple[str, ...] = KINDS,
    labels: Mapping[str, str] | None = None,
    quiet: bool = False,
    stream: TextIO = sys.stderr,
    cases: list[Case] | None = None,
) -> RunReport:
    """Benchmark ``device`` with ``suite`` into ``store``; ``cases`` overrides the suite's list."""
    fp = fingerprint(device)
    cases = build_cases(suite, device, only, profile_from_store(store, fp.device_name)) if cases is None else cases
    progress = Progress([c.expected_s for c in cases], stream, quiet)
    started = time.perf_counter()
    with store.recording(fp, suite=suite, benchmark_version=BENCHMARK_VERSION, labels=labels) as run_id:
        report = RunReport(run_id, fp.device_name, fp.details.get("hardware", "unknown"), fp.device_type)
        for case in cases:
            progress.update(case.name)
            row = run_case(case, device)
            store.add_result(run_id, row)
            report.rows.append((case, row))
            progress.update(case.name, outcome(row))
        report.seconds = time.perf_counter() - started
    return report
