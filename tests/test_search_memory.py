"""What a layout search does to go fast without changing its answer: the cyclic collector paused
(headroom.core.collector) and every ledger kept for the search's length (headroom.core.memory.ledger.ledgers_kept)."""

import gc
import threading

import pytest

from headroom.core.collector import collector_paused
from headroom.core.memory.ledger import _cached_ledger, activation_ledger, ledgers_kept
from headroom.core.planning.planner import PlanRequest, plan
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.timing.step import datasheet_profile


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_the_collector_is_paused_inside_and_as_it_was_after_even_on_an_error(collector_on):
    seen = []

    @collector_paused
    def work(fail: bool) -> str:
        seen.append(gc.isenabled())
        if fail:
            raise ValueError("boom")
        return "done"

    assert work(False) == "done" and seen == [False] and gc.isenabled()
    with pytest.raises(ValueError, match="boom"):
        work(True)
    assert seen == [False, False] and gc.isenabled()
    gc.disable()  # a caller that turned it off keeps it off
    assert work(False) == "done" and not gc.isenabled()


def test_a_plan_runs_with_the_collector_paused_and_leaves_it_on(collector_on, monkeypatch):
    import headroom.core.planning.planner as planner

    states = []
    real = planner._plan_layout
    monkeypatch.setattr(planner, "_plan_layout", lambda *a, **k: (states.append(gc.isenabled()), real(*a, **k))[1])
    request = PlanRequest(spec=get_preset("bench-llama-small"), train=TrainConfig(seq_len=256), global_batch=8)
    assert plan(request, datasheet_profile(get_hardware("h100-sxm"))).recommendation is not None
    assert states == [False] and gc.isenabled()


def test_kept_ledgers_outlive_the_process_cache_until_the_outermost_scope_ends():
    spec = get_preset("llama3-8b")
    config = TrainConfig(seq_len=4096, layout=Layout(tp=2, sp=True))
    with ledgers_kept():
        first = activation_ledger(spec, config)
        _cached_ledger.cache_clear()  # as a search's thousands of other ledgers evict it
        with ledgers_kept():  # an inner scope shares the outer one
            assert activation_ledger(spec, config) is first
        assert activation_ledger(spec, config) is first
    _cached_ledger.cache_clear()
    assert activation_ledger(spec, config) is not first  # the scope is gone: traced again
    assert activation_ledger(spec, config) == first


def test_kept_ledgers_are_per_thread():
    spec = get_preset("llama3-8b")
    config = TrainConfig(seq_len=2048)
    other = []
    with ledgers_kept():
        mine = activation_ledger(spec, config)
        _cached_ledger.cache_clear()
        thread = threading.Thread(target=lambda: other.append(activation_ledger(spec, config)))
        thread.start()
        thread.join(timeout=60)
    assert other and other[0] is not mine and other[0] == mine
