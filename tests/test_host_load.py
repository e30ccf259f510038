"""A busy host is detected and flagged on the result; CPU bandwidth tensors follow the real cache."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from headroom.agent import host_load  # noqa: E402
from headroom.agent.bench_elementwise import STREAM_CACHE_MULTIPLE, streaming_elements  # noqa: E402
from headroom.agent.summary import summarize  # noqa: E402
from headroom.agent.timer import CPU_CACHE_GUESS, cpu_cache_bytes, time_fn  # noqa: E402
from headroom.db.models import MatmulResult  # noqa: E402

CPU = torch.device("cpu")


def test_spread_is_the_interquartile_range_over_the_median():
    assert host_load.spread([1.0, 1.0, 1.0, 1.0, 1.0]) == 0.0
    # quartiles (inclusive) of 1, 2, 3, 4, 5: 2 and 4, median 3
    assert host_load.spread([5.0, 1.0, 3.0, 2.0, 4.0]) == 2 / 3
    assert host_load.spread([2.0]) == 0.0


def test_other_processes_cpu_time_is_the_machines_busy_time_less_this_process(monkeypatch):
    monkeypatch.setattr(host_load.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(host_load.os, "sysconf", lambda name: 100)  # ticks per second
    start = host_load.Mark(wall_s=10.0, own_cpu_s=1.0, busy_ticks=1000)
    end = host_load.Mark(wall_s=11.0, own_cpu_s=1.5, busy_ticks=1150)  # 1.5 CPU-s busy, 0.5 of them ours
    assert host_load.other_cpu_fraction(start, end) == 0.5
    verdict = host_load.verdict(start, end, [1.0, 1.0, 1.0], threads=2)
    assert verdict["busy"] and verdict["why"] == ["other processes used 50% of the CPUs"]
    assert host_load.other_cpu_fraction(start, host_load.Mark(11.0, 1.5, None)) is None


def test_disagreeing_samples_are_flagged_whatever_the_load():
    start, end = host_load.Mark(0.0, 0.0, None), host_load.Mark(1.0, 1.0, None)
    bimodal = [0.03e-3] * 5 + [12e-3] * 5  # a thread descheduled for a quantum in half the samples
    verdict = host_load.verdict(start, end, bimodal, threads=1)
    assert verdict["busy"] and verdict["why"][0].startswith("samples spread")
    assert not host_load.verdict(start, end, [1.0, 1.01, 0.99], threads=1)["busy"]


SPIN = "import time\nstop = time.monotonic() + 30\nwhile time.monotonic() < stop: pass"


def test_a_timing_next_to_busy_processes_is_flagged():
    """Real processes spinning on every CPU (fresh interpreters, not forks of this one): the matmul's
    window sees their CPU time."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.5)  # started and spinning
        a = torch.randn(256, 256)
        timing = time_fn(lambda i: a @ a, CPU, budget_s=0.4, iterations=10_000)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    host = timing.details()["host"]
    assert host["window_s"] >= host_load.MIN_WINDOW_S and host["threads"] == torch.get_num_threads(), host
    assert host["other_cpu_fraction"] > host_load.BUSY_OTHER_FRACTION and host["busy"], host


def _cache(root, index: int, level: int, kind: str, size: str) -> None:
    d = root / f"index{index}"
    d.mkdir()
    (d / "level").write_text(f"{level}\n")
    (d / "type").write_text(f"{kind}\n")
    (d / "size").write_text(f"{size}\n")


def test_the_last_level_cache_is_read_from_the_kernel(tmp_path):
    _cache(tmp_path, 0, 1, "Data", "32K")
    _cache(tmp_path, 1, 1, "Instruction", "32K")
    _cache(tmp_path, 2, 2, "Unified", "1024K")
    _cache(tmp_path, 3, 3, "Unified", "491520K")  # 480 MiB of L3
    assert cpu_cache_bytes(str(tmp_path)) == 480 * 2**20
    assert cpu_cache_bytes(str(tmp_path / "absent")) == CPU_CACHE_GUESS


def test_cpu_bandwidth_tensors_are_four_times_the_last_level_cache():
    elements = streaming_elements(CPU, "fp32", 1024)
    assert elements * 4 >= STREAM_CACHE_MULTIPLE * cpu_cache_bytes() and elements % 1024 == 0
    assert streaming_elements(torch.device("cuda", 0), "bf16", 1024) == 1024


def test_the_summary_says_when_results_were_taken_on_a_busy_host():
    def row(busy: bool) -> MatmulResult:
        why = ["other processes used 60% of the CPUs"] if busy else []
        return MatmulResult(dtype="fp32", m=8, n=8, k=8, batch=1, tflop_per_s=1.0, status="ok",
                            details={"host": {"busy": busy, "why": why}})

    report = SimpleNamespace(run_id="r", device_name="cpu", device_type="cpu", hardware="unknown", seconds=1.0,
                             rows=[(None, row(True)), (None, row(False))], count=lambda status: 0)
    text = summarize(report)
    assert "busy host: 1 of 2 results were measured while the host was busy (other processes used 60% of the " \
           "CPUs)" in text
    assert "--settle 120 to wait up to two minutes" in text
    report.rows = [(None, row(False))]
    assert "busy host" not in summarize(report)


def _clock(step_s: float):
    """A clock each look at the load advances by ``step_s`` (the look's window), and nothing else."""
    now = [0.0]

    def load_then_tick(shares):
        def load():
            now[0] += step_s
            return next(shares)
        return load

    return (lambda: now[0]), load_then_tick


def test_settling_waits_window_by_window_until_the_host_is_quiet():
    clock, looking = _clock(1.0)
    assert host_load.wait_until_quiet(60, looking(iter([0.9, 0.6, 0.2, 0.9])), clock) == (True, 3.0, 0.2)
    clock, looking = _clock(1.0)
    assert host_load.wait_until_quiet(2.5, looking(iter([0.9, 0.8, 0.7, 0.6, 0.5])), clock) == (False, 3.0, 0.7)
    clock, looking = _clock(1.0)
    assert host_load.wait_until_quiet(10, looking(iter([None])), clock) == (True, 1.0, None)  # load unreadable


def test_settle_takes_seconds_within_an_hour(run_cli):
    for value in ("-1", "3601", "nan"):
        result = run_cli("agent", "run", "--suite", "smoke", "--device", "cpu", "--settle", value)
        assert result.returncode == 2 and "--settle must be 0 to 3,600 seconds" in result.stderr, value
