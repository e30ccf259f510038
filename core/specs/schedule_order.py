"""The order of work each pipeline rank runs under a zero-bubble schedule, as a table.

Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR
2024, arXiv 2401.10241) split a chunk's backward in two: ``I``, the gradient of
its input, which the chunk before it waits for, and ``W``, the gradients of its
weights, which nobody waits for; a rank runs its W's where 1F1B would idle.
ZB-V (Sec. 6 there) puts two chunks on each of the pp ranks in a V: rank r
holds chunk r and chunk 2 pp - 1 - r, so the first rank runs both the first
chunk (with the embedding) and the last (with the head and the loss), and
every rank keeps about pp micro-batches of its blocks in flight, as 1F1B's
first stage does.

`zbv_order` is ``ScheduleZBVZeroBubble._calculate_single_rank_operations`` of
torch.distributed.pipelining (torch 2.13, schedules.py), the schedule
torchtitan runs as ``ZBVZeroBubble``: a warm-up of forwards, a steady phase of
(F, I, W) on each chunk in turn, a cool-down that runs the input gradients
first and the weight gradients last. With fewer than 2 pp - 1 micro-batches
torch plans 2 pp - 1 and drops the actions of those it does not have; so does
this. tests/test_zero_bubble.py compares every rank's list with torch's.

A chunk's activations stay alive from its forward to its weight gradient:
torch's ``stage_backward_input`` runs ``autograd.grad`` with
``retain_graph=True`` (torch/distributed/pipelining/_backward.py), so the
graph and every tensor it saved are freed only when ``W`` has run.
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

Kind = Literal["F", "I", "W"]


class Action(NamedTuple):
    """One piece of work a rank runs: the forward (``F``), input gradient (``I``) or weight gradient (``W``)
    of micro-batch ``micro_batch`` through chunk ``chunk`` (0 is the first chunk of the model)."""

    kind: Kind
    chunk: int
    micro_batch: int


def zbv_chunks(pp: int, rank: int) -> tuple[int, int]:
    """The two chunks rank ``rank`` holds under ZB-V: its own on the way down, its mirror on the way back."""
    return rank, 2 * pp - 1 - rank


@functools.lru_cache(maxsize=1024)
def zbv_order(pp: int, micro_batches: int) -> tuple[tuple[Action, ...], ...]:
    """Every rank's actions in the order it runs them under ZB-V (torch's ``ScheduleZBVZeroBubble``)."""
    if pp < 1 or micro_batches < 1:
        raise ValueError(f"ZB-V needs pp >= 1 and micro-batches >= 1, got pp {pp}, {micro_batches} micro-batches")
    return tuple(_zbv_rank(pp, micro_batches, rank) for rank in range(pp))


def _zbv_rank(pp: int, micro_batches: int, rank: int) -> tuple[Action, ...]:
    planned = max(2 * pp - 1, micro_batches)
    down, up = zbv_chunks(pp, rank)
    ops: list[Action] = []
    f = {down: 0, up: 0}
    i = {down: 0, up: 0}
    w = {down: 0, up: 0}

    def run(kind: Kind, chunk: int) -> None:
        count = {"F": f, "I": i, "W": w}[kind]
        ops.append(Action(kind, chunk, count[chunk]))
        count[chunk] += 1

    for _ in range(2 * (pp - rank) - 1):
        run("F", down)
    for _ in range(rank):
        run("F", up)
        run("F", down)
    for _ in range(pp - rank):
        run("F", up)
        run("I", up)
        run("W", up)
    while f[up] < f[down] or f[down] < planned:
        if f[down] < planned:
            run("F", down)
        run("I", down)
        run("W", down)
        run("F", up)
        run("I", up)
        run("W", up)
    for _ in range(rank):
        run("I", down)
        run("I", up)
    for _ in range(pp - rank):
        run("I", down)
        run("W", down)
    while w[up] < i[up]:
        run("W", up)
    while w[down] < i[down]:
        run("W", down)
    return tuple(a for a in ops if a.micro_batch < micro_batches)


@functools.lru_cache(maxsize=4096)
def zbv_alive(pp: int, micro_batches: int, rank: int) -> tuple[tuple[int, int], ...]:
    """`alive_peaks` of a zbv rank's two chunks (`zbv_chunks`). From 2 pp micro-batches on, the steady phase
    only repeats: the moments are those of 2 pp (tests/test_zero_bubble.py checks it to 6 pp)."""
    m = min(micro_batches, 2 * pp)
    return alive_peaks(zbv_order(pp, m)[rank], zbv_chunks(pp, rank))  # type: ignore[return-value]


def alive_peaks(actions: tuple[Action, ...], chunks: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Micro-batches of each of ``chunks`` whose activations are alive (forward run, weight gradient not yet),
    at every moment one may peak: right after each forward."""
    alive = dict.fromkeys(chunks, 0)
    peaks = []
    for action in actions:
        if action.kind == "F":
            alive[action.chunk] += 1
            peaks.append(tuple(alive[c] for c in chunks))
        elif action.kind == "W":
            alive[action.chunk] -= 1
    return tuple(dict.fromkeys(peaks))


__all__ = ["Action", "Kind", "alive_peaks", "zbv_alive", "zbv_chunks", "zbv_order"]
