"""Run a suite on one device and record every result as it finishes.

Each case's row is committed on its own (headroom.db.store), so a run killed at any
point keeps what finished. A case that raises is recorded, not fatal:
out-of-memory as ``oom``, anything else as ``error`` with its message, and
the suite goes on. Ctrl-C marks the run ``aborted`` and keeps its results.

Every case runs with its device current (so ``cuda:1`` is timed on cuda:1's
stream) and starts clean: after each case, once its traceback (and the
tensors it held) is gone, the allocator's cache is emptied and its peak
statistics reset, so one case's leftovers never inflate the next one's
reserved memory. A CUDA error that poisons the context (an illegal address,
say) makes every later case meaningless: the remaining cases are recorded as
``error`` naming the case that broke it, the run is marked ``failed``, and
`DeviceLost` is raised.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TextIO

import torch

from headroom.agent import heap
from headroom.agent.cases import Case
from headroom.agent.fingerprint import BENCHMARK_VERSION, fingerprint
from headroom.agent.progress import Progress
from headroom.agent.suites import KINDS, build_cases
from headroom.core.errors import ConfigError
from headroom.core.safe_text import printable
from headroom.core.timing.step import HardwareProfile
from headroom.db.models import Result
from headroom.db.profiles import build_profile
from headroom.db.store import Store


@dataclass(slots=True)
class RunReport:
    run_id: str
    device_name: str
    hardware: str
    device_type: str
    rows: list[tuple[Case, Result]] = field(default_factory=list)
    case_seconds: list[float] = field(default_factory=list)
    """Wall time of each row's case, in the order of ``rows`` (0 for cases not run)."""
    seconds: float = 0.0

    def count(self, status: str) -> int:
        return sum(row.status == status for _, row in self.rows)


class DeviceLost(RuntimeError):
    """The CUDA context stopped working: nothing more can be measured in this process.

    ``report`` holds what the run recorded, the cases not run included.
    """

    def __init__(self, message: str, report: RunReport | None = None) -> None:
        super().__init__(message)
        self.report = report


def first_line(err: BaseException, limit: int = 500) -> str:
    """The error's first line as a stored message may hold it: escaped (headroom.core.safe_text), at most ``limit``."""
    text = str(err).strip()
    return printable(text.splitlines()[0])[:limit] if text else ""


def device_context(device: torch.device):
    """Make ``device`` current for the case (CUDA), so streams and events are its own."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def settle(device: torch.device) -> None:
    """Free what the last case left behind and reset the peak statistics; DeviceLost if the context broke."""
    heap.collect()
    if device.type != "cuda":
        return
    try:
        torch.cuda.synchronize(device)
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:  # cuBLAS workspaces outlive their case unless released
            clear_workspaces()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    except RuntimeError as err:  # torch.AcceleratorError: a sticky error from an earlier kernel
        raise DeviceLost(f"{type(err).__name__}: {first_line(err)}") from None


def run_case(case: Case, device: torch.device) -> Result:
    """The case's row; a failure becomes a row too."""
    try:
        with device_context(device):
            return case.measure(device)
    except torch.OutOfMemoryError as err:
        failure = ("oom", first_line(err))
    except (RuntimeError, ValueError, TypeError, ArithmeticError, AssertionError) as err:
        failure = ("error", f"{type(err).__name__}: {first_line(err)}")
    # Outside the except block: the traceback, and the failed case's tensors it held, are released.
    return case.failed(*failure)


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
    for attr, unit in (("tflop_per_s", "TFLOP/s"), ("gb_per_s", "GB/s"), ("tokens_per_s", "tokens/s"),
                       ("busbw_gb_per_s", "GB/s bus bandwidth")):
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
    stream: TextIO | None = None,
    cases: list[Case] | None = None,
    deadline: float | None = None,
) -> RunReport:
    """Benchmark ``device`` with ``suite`` into ``store``; ``cases`` overrides the suite's list.

    ``deadline`` (a ``time.perf_counter()`` value): cases that would start after it are recorded as
    skipped, with that reason, and the run still completes.
    """
    fp = fingerprint(device)
    cases = build_cases(suite, device, only, profile_from_store(store, fp.device_name)) if cases is None else cases
    progress = Progress([c.expected_s for c in cases], stream, quiet)
    started = time.perf_counter()
    gc.collect()  # nothing garbage is frozen: what cycles hold from before, on the device too, is freed here
    with heap.older_objects_frozen(), \
            store.recording(fp, suite=suite, benchmark_version=BENCHMARK_VERSION, labels=labels) as run_id:
        report = RunReport(run_id, fp.device_name, fp.details.get("hardware", "unknown"), fp.device_type)
        for i, case in enumerate(cases):
            progress.update(case.name)
            case_started = time.perf_counter()
            if deadline is not None and case_started > deadline:
                row = case.failed("skipped", "not run: the run's time budget was spent")
            else:
                row = run_case(case, device)
            store.add_result(run_id, row)
            report.rows.append((case, row))
            report.case_seconds.append(time.perf_counter() - case_started)
            progress.update(case.name, outcome(row))
            try:
                settle(device)
            except DeviceLost as lost:
                for rest in cases[i + 1:]:
                    skipped = rest.failed("error", f"not run: the CUDA context broke during {case.name!r}: {lost}")
                    store.add_result(run_id, skipped)
                    report.rows.append((rest, skipped))
                    report.case_seconds.append(0.0)
                report.seconds = time.perf_counter() - started
                raise DeviceLost(f"the CUDA context broke during {case.name!r} ({lost}); "
                                 f"{len(cases) - i - 1} later case(s) recorded as not run", report) from None
        report.seconds = time.perf_counter() - started
    return report
