"""The benchmark suites: which cases each runs, sized for its time target.

=========  =================================================  ======================
suite      for                                                target
=========  =================================================  ======================
smoke      tests and CI, any box                              < 60 s on 2 CPU cores
quick      a first look at a GPU                              < 3 min on an H100
standard   what every box runs                                < 10 min on an H100
full       everything, larger shapes                          as long as it takes
=========  =================================================  ======================

A CPU runs every suite at smoke sizes: its numbers are labelled CPU and
never mixed with GPU results, and bigger shapes would only take longer.

Collectives need several ranks: every suite measures them over ``ranks``
local processes (one per GPU: headroom.agent.bench_collectives), which the agent asks
for when a box has more than one GPU, or when told to on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from headroom.agent import (
    bench_attention,
    bench_collectives,
    bench_dispatch,
    bench_elementwise,
    bench_matmul,
    bench_train,
)
from headroom.agent.cases import Case
from headroom.agent.names import KINDS, SUITES
from headroom.core.errors import ConfigError
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.timing.step import HardwareProfile


@dataclass(frozen=True, slots=True)
class TrainSweep:
    """A grid of micro-batch x checkpoint policy for one model and sequence."""

    model: str
    seq_len: int
    micro_batches: tuple[int, ...]
    policies: tuple[str, ...]
    precision: str
    optimizer: str = "adamw"
    attention: str = "flash"
    accumulation_steps: int = 1
    global_batch: int | None = None
    """Sequences per optimizer step: each micro-batch then accumulates global_batch / micro-batch steps
    (the planner's question for one rank); None: ``accumulation_steps`` for every micro-batch."""
    warmup_steps: int = 2
    steps: int = 5
    expected_s: float = 1.0
    """Rough seconds per configuration, for the ETA."""

    @property
    def base(self) -> TrainConfig:
        """The configuration every point of the sweep shares (micro-batch 1, no checkpointing)."""
        return TrainConfig(seq_len=self.seq_len, precision=self.precision, optimizer=self.optimizer,
                           attention=self.attention)

    def accumulation(self, micro_batch: int) -> int:
        if self.global_batch is None:
            return self.accumulation_steps
        if self.global_batch % micro_batch:
            raise ConfigError(f"micro-batch {micro_batch} does not divide the global batch {self.global_batch}")
        return self.global_batch // micro_batch

    def setups(self) -> list[bench_train.TrainSetup]:
        spec = get_preset(self.model)
        return [
            bench_train.TrainSetup(
                spec=spec,
                config=replace(self.base, micro_batch=micro, recompute=parse_policy(policy)),
                accumulation_steps=self.accumulation(micro), warmup_steps=self.warmup_steps, steps=self.steps,
            )
            for micro in self.micro_batches
            for policy in self.policies
        ]


POLICIES = ("none", "full", "every-2", "selective", "op-selective")
SMOKE_TRAIN = TrainSweep(model="bench-llama-small", seq_len=128, micro_batches=(1, 2), policies=POLICIES,
                         precision="fp32", global_batch=2, steps=3, expected_s=1.0)
GPU_TRAIN = TrainSweep(model="llama3.2-1b", seq_len=2048, micro_batches=(1, 2, 4, 8), policies=POLICIES,
                       precision="amp-bf16", global_batch=8, steps=4, expected_s=4.0)
"""A ~1B llama at s=2048, 8 sequences per step: what the planner weighs for one rank."""


@dataclass(frozen=True, slots=True)
class SuiteSize:
    squares: list[int]
    gemms: list[tuple[str, int]]
    """(preset, tokens) whose layer GEMMs are measured."""
    elementwise_elements: int
    attention_shapes: list[tuple[int, int, int, int]]
    """(batch, seq_len, heads, head_dim)."""
    budget_s: float
    """Seconds of timed samples per case."""
    train: TrainSweep


SMOKE = SuiteSize(
    squares=[128, 256, 512],
    gemms=[("bench-llama-small", 256)],
    elementwise_elements=8 * 2**20,
    attention_shapes=[(1, 256, 8, 64)],
    budget_s=0.25,
    train=SMOKE_TRAIN,
)
GPU_SUITES = {
    "smoke": SMOKE,
    "quick": SuiteSize(
        squares=[1024, 2048, 4096, 8192],
        gemms=[("llama3-8b", 4096), ("llama2-70b", 4096)],
        elementwise_elements=256 * 2**20,
        attention_shapes=[(4, 2048, 32, 128), (1, 8192, 32, 128)],
        budget_s=0.5,
        train=GPU_TRAIN,
    ),
    "standard": SuiteSize(
        squares=[512, 1024, 2048, 4096, 8192, 16384],
        gemms=[("llama3-8b", 2048), ("llama3-8b", 8192), ("llama2-70b", 4096), ("llama3-70b", 8192)],
        elementwise_elements=512 * 2**20,
        attention_shapes=[(8, 1024, 32, 128), (4, 2048, 32, 128), (1, 8192, 32, 128), (1, 16384, 16, 128)],
        budget_s=1.0,
        train=GPU_TRAIN,
    ),
    "full": SuiteSize(
        squares=[256, 512, 1024, 2048, 4096, 8192, 12288, 16384],
        gemms=[(p, t) for p in ("llama3-8b", "llama2-70b", "llama3-70b", "gpt3-175b") for t in (2048, 8192)],
        elementwise_elements=1024 * 2**20,
        attention_shapes=[(8, 1024, 32, 128), (4, 2048, 32, 128), (2, 4096, 32, 128), (1, 8192, 32, 128),
                          (1, 16384, 16, 128), (1, 32768, 8, 128)],
        budget_s=2.0,
        train=GPU_TRAIN,
    ),
}


def suite_size(suite: str, device: torch.device) -> SuiteSize:
    if suite not in GPU_SUITES:
        raise ConfigError(f"unknown suite {suite!r}; valid: {', '.join(SUITES)}")
    return SMOKE if device.type == "cpu" else GPU_SUITES[suite]


def build_cases(
    suite: str, device: torch.device, only: tuple[str, ...] = KINDS,
    profile: Callable[[], HardwareProfile | None] | None = None, ranks: int = 1,
) -> list[Case]:
    """The suite's cases for ``device``; ``profile`` gives the train cases' time predictions when they run;
    collectives run over ``ranks`` local processes (none when ``ranks`` is 1)."""
    unknown = set(only) - set(KINDS)
    if unknown:
        raise ConfigError(f"unknown benchmark kind(s) {', '.join(sorted(unknown))}; valid: {', '.join(KINDS)}")
    size = suite_size(suite, device)
    cases: list[Case] = []
    if "matmul" in only:
        cases += bench_matmul.cases(device, size.squares, size.gemms, size.budget_s)
    if "elementwise" in only:
        cases += bench_elementwise.cases(device, size.elementwise_elements, size.budget_s)
    if "attention" in only:
        cases += bench_attention.cases(device, size.attention_shapes, size.budget_s)
    if "dispatch" in only:
        cases += bench_dispatch.cases(device)
    if "train" in only:
        cases += [bench_train.case(setup, profile, size.train.expected_s) for setup in size.train.setups()]
    if "collectives" in only and ranks > 1:
        cases += bench_collectives.cases(device.type, ranks)
    return cases
