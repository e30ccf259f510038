"""The cyclic garbage collector paused around the planner's allocation-heavy work.

A layout search makes millions of small objects (symbolic tensors, ledgers, estimates, candidates) and
keeps hundreds of thousands of them to the end; none forms a reference cycle that outlives the search, so
they are freed by reference counting alone. The cyclic collector still walks them, ever more of them as
the search goes on: a fifth of the time of a 512-GPU llama3-70b search, finding nothing
(benchmarks/bench_planner.py). Reference counting goes on while the collector is paused.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def collector_paused(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run with the cyclic collector off, and the collector as it was after it (on, unless the caller
    had turned it off; where threads overlap, whoever paused it first turns it back on)."""

    @functools.wraps(fn)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return paused
