"""headroom.agent.launch and headroom.agent.train_ranks.Launches: results as they come, a bound on every wait, and a sweep
of setups in as few launches as its failures allow.

Launches runs tests/fake_ranks.py under torch's own launcher (each launch about 3 s on 2 cores: the
launcher imports torch, the stand-in ranks do not), so what is checked is the parent's bookkeeping
and the launcher's handling of a rank that exits.
"""

from __future__ import annotations

import signal
import sys
import time

import pytest

pytest.importorskip("torch")

from headroom.agent import train_ranks  # noqa: E402
from headroom.agent.bench_train import TrainSetup  # noqa: E402
from headroom.agent.launch import MARKER, Launch, LaunchFailed  # noqa: E402
from headroom.agent.train_ranks import Launches  # noqa: E402
from headroom.core.specs.config import TrainConfig  # noqa: E402
from headroom.core.specs.layout import Layout  # noqa: E402
from headroom.core.specs.presets import get_preset  # noqa: E402
from tests import fake_ranks  # noqa: E402
from tests.fake_ranks import BROKEN_STEPS, CRASH_STEPS, FAIL_STEPS  # noqa: E402


def test_each_result_restarts_the_clock_and_silence_ends_the_launch():
    """Six results 0.25 s apart take longer than the 1 s timeout, and all arrive; then the ranks say
    nothing, and the launch is killed a timeout later."""
    launch = Launch("unused", 1, timeout_s=1.0)
    script = (f"import json, time\nfor i in range(6):\n    time.sleep(0.25)\n"
              f"    print({MARKER!r} + json.dumps({{'key': str(i), 'rank': 0, 'row': {{'i': i}}}}), flush=True)\n"
              "time.sleep(60)\n")
    launch.command = [sys.executable, "-c", script]
    started = time.monotonic()
    assert [launch.result(str(i))["i"] for i in range(6)] == list(range(6))
    assert time.monotonic() - started > launch.timeout_s
    with pytest.raises(LaunchFailed, match=r"no result for '6' from rank 0: the ranks reported nothing for 1 s "
                                           r"and were killed"):
        launch.result("6")
    assert launch.killed and launch.process.poll() is not None
    assert time.monotonic() - started < 30


def _gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie waiting to be)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return any(line.startswith("State:\tZ") for line in status)
    except FileNotFoundError:
        return True


def _rank_pids(launch: Launch) -> list[int]:
    return [launch.result("pid", rank)["pid"] for rank in (0, 1)]


def test_a_silent_launch_is_stopped_ranks_and_all():
    """Ranks waiting as in a collective: past the timeout the launcher is stopped, and so are the ranks,
    each in a session of its own that a signal to the launcher's group would miss."""
    # The timeout also bounds the start (the launcher imports torch): 3 s was too short on 2 loaded cores.
    launch = Launch("tests.sleepy_ranks", 2, timeout_s=10.0)
    pids = _rank_pids(launch)
    with pytest.raises(LaunchFailed, match="reported nothing for 10 s and were killed"):
        launch.result("never")
    assert all(_gone(pid) for pid in pids)


def test_an_interrupted_wait_stops_the_ranks_and_goes_on_interrupting():
    """Ctrl-C (or a stop signal the CLI raises as one) while waiting for a result."""
    launch = Launch("tests.sleepy_ranks", 2, timeout_s=60.0)
    pids = _rank_pids(launch)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            launch.result("never")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 30 and launch.process.poll() is not None
    assert all(_gone(pid) for pid in pids)


def _setup(steps: int, layout: Layout) -> TrainSetup:
    return TrainSetup(spec=get_preset("bench-llama-tiny"), steps=steps, config=TrainConfig(
        seq_len=32, micro_batch=1, precision="fp32", layout=layout))


def test_a_launch_runs_the_setups_after_its_first_up_to_a_change_of_world_size():
    worlds = [Layout(dp=2), Layout(tp=2), Layout(), Layout(pp=2), Layout(dp=2, tp=2)]
    launches = Launches(dict(enumerate(_setup(1, layout) for layout in worlds)), "cpu", timeout_s=60)
    assert [launches.run_of(i) for i in range(5)] == [[0, 1], [1], [2], [3], [4]]
    skipping = Launches({0: _setup(1, Layout(dp=2)), 2: _setup(1, Layout(tp=2))}, "cpu", timeout_s=60)
    assert skipping.run_of(0) == [0, 2]  # a setup skipped before measuring (1) is not in the way
    many = Launches(dict(enumerate(_setup(1, Layout(dp=2)) for _ in range(70))), "cpu", timeout_s=60)
    assert [len(many.run_of(i)) for i in (0, 32, 64)] == [32, 32, 6]
    assert (fake_ranks.begin_key(7), fake_ranks.step_key(7)) == (train_ranks.begin_key(7), train_ranks.step_key(7))


@pytest.mark.slow
def test_a_failed_setup_costs_only_itself():
    two = Layout(dp=2)
    setups = dict(enumerate(_setup(steps, two) for steps in (1, FAIL_STEPS, 2, CRASH_STEPS, 3)))
    launches = Launches(setups, "cpu", timeout_s=60, module="tests.fake_ranks")
    first = [launches.result(0, rank)["details"] for rank in (0, 1)]
    assert [d["setup_in_launch"] for d in first] == [1, 1]
    assert launches.result(1, 0)["details"]["setup_in_launch"] == 2  # rank 0's row came before rank 1 failed
    assert launches.result(1, 1) == {"status": "error", "message": "RuntimeError: injected by the test"}
    # Setup 2 never began in that launch: a new one runs it and the rest.
    second = [launches.result(2, rank)["details"] for rank in (0, 1)]
    assert [d["setup_in_launch"] for d in second] == [1, 1]
    assert {d["pid"] for d in second}.isdisjoint(d["pid"] for d in first)
    # A rank that dies without a word: the setup it was in fails for the ranks that did not report.
    assert launches.result(3, 0)["details"]["setup_in_launch"] == 2
    with pytest.raises(LaunchFailed, match=r"no result for 'step 3' from rank 1: the launch exited with code 1"):
        launches.result(3, 1)
    assert [launches.result(4, rank)["details"]["setup_in_launch"] for rank in (0, 1)] == [1, 1]
    assert launches.launch.process.poll() == 0  # the last launch was closed with its last result


@pytest.mark.slow
def test_a_launch_that_begins_nothing_is_not_started_again_for_each_setup():
    setups = dict(enumerate([_setup(BROKEN_STEPS, Layout(dp=2)), _setup(1, Layout(dp=2))]))
    launches = Launches(setups, "cpu", timeout_s=60, module="tests.fake_ranks")
    for index in (0, 1):
        with pytest.raises(LaunchFailed, match=rf"no result for 'step {index}' from rank 0: the launch exited"):
            launches.result(index, 0)
    assert launches.indices == [0, 1]
