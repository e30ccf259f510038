"""How much one plan may weigh, its advice included: a bound on work, counted, not timed.

A layout search evaluates candidates (a layout, a micro-batch, a policy) one at a time, about 0.5 ms each on
this project's 2-core machine whatever the model's depth (its ledger and ops replay repeated layers, and FSDP's
units are counted as runs). Realistic searches stay well below the bound: llama3-70b on 1,024 GPUs evaluates
17,869 candidates (9 s), on 2^20 GPUs with a global batch of 2^24 41,499 (23 s). A plan at every maximum at
once (10,000 layers, hidden 65,536, 2^20 GPUs, a batch of 2^24 sequences of 2^24 tokens) evaluates 180,487
(84 s), and ran past 120 s before its layers were replayed. So a plan stops trying layouts once ``LIMIT``
candidates are spent: those whose compute floor is lowest first, as a page's time limit cuts it, and the plan counts the layouts left
(headroom.core.planning.planner.Plan.unsearched). The same inputs stop at the same place on every machine, which a time limit
cannot promise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

LIMIT = 2**16
"""Candidates one plan may evaluate, its advice included: 65,536, about 30 s here."""


@dataclass(slots=True)
class SearchWork:
    """Candidates the searches of one plan have evaluated so far."""

    limit: int
    spent: int = 0

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.limit


_current: ContextVar[SearchWork | None] = ContextVar("search_work", default=None)


@contextlib.contextmanager
def bounded_search(limit: int | None = None) -> Iterator[SearchWork]:
    """One bound for every search and evaluation inside: the outermost sets it (``LIMIT`` by default)."""
    work = _current.get()
    if work is not None:
        yield work
        return
    work = SearchWork(LIMIT if limit is None else limit)
    token = _current.set(work)
    try:
        yield work
    finally:
        _current.reset(token)


def current_work() -> SearchWork:
    """The bound in force, or a fresh one (nothing spent) outside any search."""
    return _current.get() or SearchWork(LIMIT)


def charge() -> None:
    """Count one candidate evaluated against the bound in force, if any."""
    if (work := _current.get()) is not None:
        work.spent += 1
