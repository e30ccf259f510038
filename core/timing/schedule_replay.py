"""A pipeline schedule's table replayed with each action's duration: when every rank finishes.

Each rank runs its actions (headroom.core.specs.schedule_order) in order, each
as soon as the rank is free and what it needs has run: a forward the previous
chunk's forward of the same micro-batch, an input gradient the next chunk's
input gradient (the last chunk its own forward: the loss), a weight gradient
its own input gradient. Sends and receives take no time here: the pipeline's
point-to-point traffic is counted on its own (headroom.core.timing.comm).
This is how Qi et al. (2024, Sec. 3) time a schedule, and what torch's
``_simulate_comms_compute`` steps through with every action one unit long.

`zbv_makespan` replays ZB-V over ``REPLAYED_ROUNDS`` x pp micro-batches, or
as many as ``REPLAYED_ACTIONS`` actions hold, and carries on from there at the
busiest rank's pace (its work for one micro-batch: the pace nobody can beat).
Each micro-batch past the warm-up adds a length that grows towards that pace
from below, so this can only over-count, by what the replay had not yet
caught up: on Llama 3 8B, 70B and 405B under torchtitan at pp 2-16 and up to
256 micro-batches it equals the whole replay to rounding; on random chunk
times up to twice as uneven it over-counts by at most 1.5% of the step
(tests/test_zero_bubble.py checks both against whole replays).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from headroom.core.specs.schedule_order import Action, Kind, zbv_chunks, zbv_order

KINDS: tuple[Kind, ...] = ("F", "I", "W")
REPLAYED_ACTIONS = 2048
"""Actions `zbv_makespan` replays at least, where the step has as many (about 2 ms)."""
REPLAYED_ROUNDS = 2
"""Micro-batches `zbv_makespan` replays at least, per pipeline rank."""


@dataclass(frozen=True, slots=True)
class Replay:
    """When a replayed schedule ends, and how long each rank worked."""

    makespan_s: float
    busy_s: tuple[float, ...]
    """Seconds each rank ran actions, first rank first."""

    def idle_s(self, rank: int) -> float:
        """What rank ``rank`` waits in the step: the schedule's length less its own work."""
        return self.makespan_s - self.busy_s[rank]


@dataclass(frozen=True, slots=True)
class _Table:
    """A schedule's table in integers: each action's (chunk, kind) slot and the index of the action it needs."""

    slots: tuple[int, ...]
    needs: tuple[int, ...]
    """-1: nothing."""
    bounds: tuple[tuple[int, int], ...]
    """Each rank's actions: [start, end) of the flat list."""
    chunks: int


def _needs(action: Action, last_chunk: int) -> Action | None:
    kind, chunk, micro_batch = action
    if kind == "F":
        return Action("F", chunk - 1, micro_batch) if chunk else None
    if kind == "I":
        return Action("I", chunk + 1, micro_batch) if chunk < last_chunk else Action("F", chunk, micro_batch)
    return Action("I", chunk, micro_batch)


def _table(order: tuple[tuple[Action, ...], ...]) -> _Table:
    flat = [a for actions in order for a in actions]
    last_chunk = max(a.chunk for a in flat)
    index = {a: i for i, a in enumerate(flat)}
    needs = []
    for a in flat:
        need = _needs(a, last_chunk)
        if need is not None and need not in index:
            raise ValueError(f"the schedule's table runs {a} but never {need}, which it needs")
        needs.append(-1 if need is None else index[need])
    bounds, start = [], 0
    for actions in order:
        bounds.append((start, start + len(actions)))
        start += len(actions)
    return _Table(tuple(a.chunk * 3 + KINDS.index(a.kind) for a in flat), tuple(needs), tuple(bounds),
                  last_chunk + 1)


@functools.lru_cache(maxsize=256)
def _zbv_table(pp: int, micro_batches: int) -> _Table:
    return _table(zbv_order(pp, micro_batches))


def _replay_table(table: _Table, seconds: Callable[[Kind, int], float]) -> Replay:
    took = [seconds(kind, chunk) for chunk in range(table.chunks) for kind in KINDS]
    durations = [took[slot] for slot in table.slots]
    needs = table.needs
    ends = [-1.0] * len(durations)
    free = [0.0] * len(table.bounds)
    next_action = [start for start, _ in table.bounds]
    left = len(durations)
    while left:
        progressed = 0
        for rank, (_, stop) in enumerate(table.bounds):
            i = first = next_action[rank]
            at = free[rank]
            while i < stop:
                need = needs[i]
                if need >= 0:
                    ready = ends[need]
                    if ready < 0:
                        break
                    if ready > at:  # noqa: PLR1730 (max() is a call: the loop runs a million times a search)
                        at = ready
                at += durations[i]
                ends[i] = at
                i += 1
            progressed += i - first
            next_action[rank], free[rank] = i, at
        if not progressed:
            raise ValueError("the schedule's table deadlocks: every rank waits for another")
        left -= progressed
    return Replay(max(free), tuple(sum(durations[start:stop]) for start, stop in table.bounds))


def replay(order: tuple[tuple[Action, ...], ...], seconds: Callable[[Kind, int], float]) -> Replay:
    """Run every rank's ``order`` with ``seconds(kind, chunk)`` an action; refuses a table that deadlocks."""
    return _replay_table(_table(order), seconds)


def zbv_makespan(pp: int, micro_batches: int, seconds: Callable[[Kind, int], float]) -> float:
    """Seconds ZB-V (headroom.core.specs.schedule_order.zbv_order) takes for a step of ``micro_batches``: the
    table replayed over the first of them (see the module's doc), the rest at the busiest rank's pace."""
    replayed = min(micro_batches, max(REPLAYED_ROUNDS * pp, REPLAYED_ACTIONS // (6 * pp)))
    end = _replay_table(_zbv_table(pp, replayed), seconds).makespan_s
    if replayed == micro_batches:
        return end
    pace = max(sum(seconds(kind, chunk) for chunk in zbv_chunks(pp, rank) for kind in KINDS) for rank in range(pp))
    return end + (micro_batches - replayed) * pace


__all__ = ["KINDS", "REPLAYED_ACTIONS", "REPLAYED_ROUNDS", "Replay", "replay", "zbv_makespan"]
