"""The planner: for a model, a global batch and a memory budget, what to run.

Every micro-batch that divides the per-rank batch is tried with every
checkpoint policy worth trying. Each candidate gets the ledger's peak memory
and the time model's step time on the chosen hardware, both corrected by that
hardware's calibration. A candidate fits when

    required = calibrated peak x allocator fragmentation + CUDA context reserve <= budget.

Fitting candidates are ranked by tokens/s, ties broken toward more headroom.
Every rejected one says by how much it missed and which term broke the budget.
When nothing fits, `core.advice` says what dominates and the smallest change
that would fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from core.calibration import Calibration, uncalibrated
from core.config import ATTENTIONS, TrainConfig
from core.errors import ConfigError
from core.estimate import Estimate, estimate
from core.model import ModelSpec
from core.precision import get_precision
from core.recompute import RecomputePolicy
from core.timing import HardwareProfile, StepTime, step_time, tokens_per_s
from core.units import GB

DEFAULT_BUDGET_BYTES = 80 * GB
DEFAULT_CONTEXT_RESERVE_BYTES = 1 * GB
"""CUDA context, cuBLAS/cuDNN workspaces and NCCL buffers: about 0.5-1 GB on Hopper; the high end."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanRequest:
    spec: ModelSpec
    seq_len: int
    global_batch: int
    """Sequences per optimizer step, across all data-parallel ranks."""
    budget_bytes: int = DEFAULT_BUDGET_BYTES
    dp: int = 1
    zero: int = 0
    precision: str = "amp-bf16"
    optimizer: str = "adamw"
    attention: str = "flash"
    dropout: float = 0.0
    allow_offload: bool = False
    context_reserve_bytes: int = DEFAULT_CONTEXT_RESERVE_BYTES

    def __post_init__(self) -> None:
        if self.global_batch <= 0:
            raise ConfigError(f"global batch must be a positive number of sequences, got {self.global_batch}")
        if self.dp <= 0:
            raise ConfigError(f"dp must be a positive number of ranks, got {self.dp}")
        if self.global_batch % self.dp:
            valid = [d for d in range(1, self.global_batch + 1) if self.global_batch % d == 0]
            raise ConfigError(
                f"global batch {self.global_batch} does not split over {self.dp} data-parallel ranks; "
                f"use --dp among {', '.join(map(str, valid[:12]))}{' ...' if len(valid) > 12 else ''}"
            )
        if self.budget_bytes <= self.context_reserve_bytes:
            raise ConfigError(
                f"budget {self.budget_bytes / GB:.2f} GB leaves nothing after the "
                f"{self.context_reserve_bytes / GB:.2f} GB CUDA context reserve"
            )
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"attention {self.attention!r} is not one of {', '.join(ATTENTIONS)}")
        self.base_config(1, RecomputePolicy("none")).check_model(self.spec)

    @property
    def per_rank_batch(self) -> int:
        return self.global_batch // self.dp

    def base_config(self, micro_batch: int, policy: RecomputePolicy) -> TrainConfig:
        return TrainConfig(
            seq_len=self.seq_len, micro_batch=micro_batch, precision=self.precision, optimizer=self.optimizer,
            attention=self.attention, dropout=self.dropout, recompute=policy, dp=self.dp, zero=self.zero,
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    estimate: Estimate
    accumulation_steps: int
    time: StepTime
    peak_bytes: int
    """Predicted peak allocated bytes, calibrated."""
    required_bytes: int
    """peak x fragmentation + context reserve: what must fit in the budget."""
    tokens_per_s: float
    """Across all data-parallel ranks, calibrated."""
    step_time_s: float
    """Calibrated."""
    rejection: str | None = None

    @property
    def config(self) -> TrainConfig:
        return self.estimate.config

    @property
    def label(self) -> str:
        return f"micro {self.config.micro_batch} x accum {self.accumulation_steps}, {self.config.recompute}"

    def to_dict(self, budget_bytes: int) -> dict[str, Any]:
        memory = self.estimate.to_dict()["memory_bytes"]
        return {
            "micro_batch": self.config.micro_batch,
            "accumulation_steps": self.accumulation_steps,
            "recompute": str(self.config.recompute),
            "tokens_per_s": self.tokens_per_s,
            "step_time_s": self.step_time_s,
            "peak_bytes": self.peak_bytes,
            "required_bytes": self.required_bytes,
            "headroom_bytes": budget_bytes - self.required_bytes,
            "memory_bytes": memory,
            "time_s": {
                "forward": self.time.forward_s * self.time.micro_batches,
                "backward": self.time.backward_s * self.time.micro_batches,
                "recompute": self.time.recompute_s * self.time.micro_batches,
                "offload": self.time.offload_s * self.time.micro_batches,
                "accumulation": self.time.accumulation_s,
                "optimizer": self.time.optimizer_s,
            },
            "rejection": self.rejection,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    request: PlanRequest
    profile: HardwareProfile
    calibration: Calibration
    candidates: tuple[Candidate, ...]
    """Fitting candidates, best first."""
    rejected: tuple[Candidate, ...]
    advice: tuple[str, ...] = field(default=())
    """When nothing fits: what dominates and the smallest change that would fit."""

    @property
    def recommendation(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None


def policies_worth_trying(request: PlanRequest) -> list[RecomputePolicy]:
    """none, selective, op-selective, full, every-K near the optimum, offload when allowed.

    The segment optimum of DESIGN.md: M(k) ~ ceil(L/k) c + k A is smallest near
    k = sqrt(L c / A), with c one block's input and A one block's activations;
    its neighbours and 2 and 4 are tried too.
    """
    layers = request.spec.n_layers
    probe = estimate(request.spec, request.base_config(1, RecomputePolicy("none")))
    per_layer = max(1, probe.ledger.per_layer_bytes)
    block_input = request.seq_len * request.spec.hidden * get_precision(request.precision).param_bytes
    best_k = round(math.sqrt(layers * block_input / per_layer))
    ks = sorted({k for k in (2, 4, best_k - 1, best_k, best_k + 1) if 2 <= k < layers})
    policies = [RecomputePolicy(kind) for kind in ("none", "selective", "op-selective", "full")]
    policies += [RecomputePolicy("every", k) for k in ks]
    if request.allow_offload:
        policies.append(RecomputePolicy("offload"))
    return policies


def evaluate(request: PlanRequest, profile: HardwareProfile, calibration: Calibration,
             micro_batch: int, policy: RecomputePolicy) -> Candidate:
    accumulation = request.per_rank_batch // micro_batch
    est = estimate(request.spec, request.base_config(micro_batch, policy), profile.device, accumulation)
    time = step_time(est, profile, accumulation)
    step_s = time.total_s * calibration.time.factor
    peak = round(est.peak_bytes * calibration.memory.factor)
    required = round(peak * profile.fragmentation) + request.context_reserve_bytes
    candidate = Candidate(
        estimate=est, accumulation_steps=accumulation, time=time, peak_bytes=peak, required_bytes=required,
        tokens_per_s=tokens_per_s(est.config, time, request.dp) / calibration.time.factor, step_time_s=step_s,
    )
    if required <= request.budget_bytes:
        return candidate
    return replace(candidate, rejection=rejection_reason(candidate, request, profile))


def rejection_reason(candidate: Candidate, request: PlanRequest, profile: HardwareProfile) -> str:
    """How far over the budget, and the term that broke it."""
    est, budget = candidate.estimate, request.budget_bytes
    over = candidate.required_bytes - budget
    static = est.static.total
    if static * profile.fragmentation + request.context_reserve_bytes > budget:
        term = f"static state alone ({static / GB:.1f} GB of parameters, gradients and optimizer state) breaks it"
    else:
        static_parts = ("parameters", "gradients", "master_weights", "optimizer_states")
        dynamic = {k.replace("_", " "): v for k, v in est.peak_components.items() if k not in static_parts}
        name, size = max(dynamic.items(), key=lambda kv: kv[1])
        term = f"{name} ({size / GB:.1f} GB) break it on top of {static / GB:.1f} GB static"
    return (
        f"needs {candidate.required_bytes / GB:.1f} GB (peak {candidate.peak_bytes / GB:.1f} GB x "
        f"{profile.fragmentation:.2f} fragmentation + {request.context_reserve_bytes / GB:.1f} GB context), "
        f"{over / GB:.1f} GB over the {budget / GB:.1f} GB budget: {term}"
    )


def plan(request: PlanRequest, profile: HardwareProfile, calibration: Calibration | None = None,
         advise: bool = True) -> Plan:
    calibration = calibration or uncalibrated(profile.name)
    micro_batches = [m for m in range(1, request.per_rank_batch + 1) if request.per_rank_batch % m == 0]
    evaluated = [
        evaluate(request, profile, calibration, micro, policy)
        for policy in policies_worth_trying(request)
        for micro in micro_batches
    ]
    fitting = sorted((c for c in evaluated if c.rejection is None), key=lambda c: (-c.tokens_per_s, c.required_bytes))
    rejected = tuple(c for c in evaluated if c.rejection is not None)
    result = Plan(request, profile, calibration, tuple(fitting), rejected)
    if not fitting and advise:
        from core.advice import advise_nothing_fits

        result = replace(result, advice=advise_nothing_fits(result))
    return result


def plan_to_dict(result: Plan, top: int | None = None) -> dict[str, Any]:
    """The JSON contract of ``headroom plan --json`` (README.md)."""
    budget = result.request.budget_bytes
    best = result.recommendation
    profile = result.profile
    return {
        "request": {
            "model": result.request.spec.name,
            "parameters": result.request.spec.parameters,
            "seq_len": result.request.seq_len,
            "global_batch": result.request.global_batch,
            "global_tokens": result.request.global_batch * result.request.seq_len,
            "budget_bytes": budget,
            "dp": result.request.dp,
            "zero": result.request.zero,
            "precision": result.request.precision,
            "optimizer": result.request.optimizer,
            "attention": result.request.attention,
        },
        "hardware": {
            "name": profile.name,
            "source": profile.source,
            "memory_bytes": profile.memory_bytes,
            "fragmentation": profile.fragmentation,
            "context_reserve_bytes": result.request.context_reserve_bytes,
            "assumptions": list(profile.assumptions),
        },
        "calibration": result.calibration.to_dict(),
        "recommendation": best.to_dict(budget) if best else None,
        "candidates": [c.to_dict(budget) for c in result.candidates[:top]],
        "rejected": [c.to_dict(budget) for c in result.rejected],
        "advice": list(result.advice),
    }
