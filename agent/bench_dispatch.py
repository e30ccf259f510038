"""What the host pays to dispatch eager PyTorch: a forward op, a backward kernel, and an op under a
selective-checkpoint context (the time model's host costs, headroom.core.timing.op_time.HostCosts).

A chain of ``CHAIN`` products by a scalar runs on a tensor of ``ELEMENTS`` elements that requires grad, so
autograd records every op and the device's own work (a few microseconds a kernel) never sets the pace:

- ``forward``: the chain's forward, host wall time over its ops;
- ``backward``: the chain's backward (one kernel per op: a product's gradient is a product), host wall time
  over its kernels;
- ``selective-checkpoint``: the same forward under ``torch.utils.checkpoint`` with
  ``create_selective_checkpoint_contexts`` (every op recomputed: the policy is called for each), less the plain
  forward's time, over its ops: what the context adds per op.

Each sample is one chain; on a GPU the device is synchronised before a sample starts and after it ends, never
inside it, so a sample is the host's time. The same code runs on a CPU, where it also includes the tiny
kernels themselves (the host is the device there).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from headroom.agent.cases import Case
from headroom.db.models import DISPATCH_MODES, DispatchResult

CHAIN = 256
"""Ops in one sample: enough that the clock's resolution and the call's own overhead vanish."""
ELEMENTS = 4096
"""Elements of the tensor the chain runs on: a kernel the device finishes in microseconds."""
SAMPLES = 30


def _chain(x: torch.Tensor) -> torch.Tensor:
    for _ in range(CHAIN):
        x = x * 1.0001
    return x


def _recompute_everything(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.PREFER_RECOMPUTE


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _host_seconds(device: torch.device, run: Callable[[], object], prepare: Callable[[], object] | None = None
                  ) -> list[float]:
    """Host wall seconds of ``run`` per sample, ``prepare`` (untimed) before each, after a warm-up."""
    samples = []
    for i in range(SAMPLES + 3):
        arg = prepare() if prepare else None
        _sync(device)
        started = time.perf_counter()
        run() if arg is None else run(arg)
        elapsed = time.perf_counter() - started
        _sync(device)
        if i >= 3:  # the first calls pay for lazy initialisation
            samples.append(elapsed)
    return samples


def measure(device: torch.device, mode: str) -> DispatchResult:
    x = torch.randn(ELEMENTS, device=device, requires_grad=True)
    if mode == "forward":
        per_op = [s / CHAIN for s in _host_seconds(device, lambda: _chain(x))]
    elif mode == "backward":
        per_op = [s / CHAIN for s in _host_seconds(device, lambda y: y.backward(), lambda: _chain(x).sum())]
    else:
        context = functools.partial(create_selective_checkpoint_contexts, _recompute_everything)
        under = _host_seconds(device, lambda: checkpoint(_chain, x, use_reentrant=False, context_fn=context))
        plain = _host_seconds(device, lambda: _chain(x))
        per_op = [max(0.0, (u - p) / CHAIN) for u, p in zip(sorted(under), sorted(plain), strict=True)]
    median = statistics.median(per_op)
    return DispatchResult(mode=mode, ops=CHAIN, samples_s=per_op, median_s=median, min_s=min(per_op),
                          max_s=max(per_op), details={"elements": ELEMENTS, "samples": SAMPLES})


def cases(device: torch.device) -> list[Case]:
    return [
        Case(kind="dispatch", name=f"host dispatch, {mode}", expected_s=0.5,
             measure=functools.partial(measure, mode=mode),
             failed=lambda status, message, mode=mode: DispatchResult(mode=mode, ops=CHAIN, status=status,
                                                                     message=message))
        for mode in DISPATCH_MODES
    ]
