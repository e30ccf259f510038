"""What a planned step achieves and what a run of it costs: MFU, TFLOP/s per GPU, wall time, GPU-hours, price.

FLOPs are headroom.core.memory.flops's: model FLOPs (MFU's numerator) are every matmul of forward and backward, **causal
attention counted in full** (as FlopCounterMode, PaLM and Megatron count it); hardware FLOPs (HFU's) add what
the checkpoint policy recomputes. One step's FLOPs are one micro-batch's over the whole model, times the
micro-batches a replica runs and the data-parallel replicas: tensor, pipeline and context parallelism split
a micro-batch's FLOPs, they do not add any. Utilisation is against the dense peak of the recipe's compute
dtype (headroom.core.specs.hardware); a device without one (a CPU) has throughput but no utilisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import Estimate


@dataclass(frozen=True, slots=True)
class Utilization:
    """One optimizer step's work over its time, per GPU."""

    model_flops: float
    """The step's model FLOPs, every GPU together."""
    hardware_flops: float
    """Model FLOPs plus recompute."""
    step_time_s: float
    gpus: int
    peak_flop_per_s: float | None
    """Dense peak of one GPU for the compute dtype; None where the device has none."""

    @property
    def tflop_per_s_per_gpu(self) -> float:
        """Model FLOPs per second per GPU, in TFLOP/s."""
        return self.model_flops / self.step_time_s / self.gpus / 1e12

    @property
    def hardware_tflop_per_s_per_gpu(self) -> float:
        return self.hardware_flops / self.step_time_s / self.gpus / 1e12

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: model FLOPs / time / (GPUs x dense peak)."""
        return self.tflop_per_s_per_gpu * 1e12 / self.peak_flop_per_s if self.peak_flop_per_s else None

    @property
    def hfu(self) -> float | None:
        """Hardware FLOPs utilisation: recomputed FLOPs count too."""
        return self.hardware_tflop_per_s_per_gpu * 1e12 / self.peak_flop_per_s if self.peak_flop_per_s else None

    def to_dict(self) -> dict[str, Any]:
        return {"model_flops_per_step": self.model_flops, "hardware_flops_per_step": self.hardware_flops,
                "tflop_per_s_per_gpu": self.tflop_per_s_per_gpu,
                "hardware_tflop_per_s_per_gpu": self.hardware_tflop_per_s_per_gpu, "mfu": self.mfu,
                "hfu": self.hfu, "peak_flop_per_s": self.peak_flop_per_s,
                "flops_convention": "matmuls only, causal attention counted in full"}


def utilization(estimate: Estimate, accumulation_steps: int, step_time_s: float,
                peak_flop_per_s: float | None) -> Utilization:
    """The utilisation of a step of ``estimate``'s configuration taking ``step_time_s``."""
    if step_time_s <= 0:
        raise ConfigError(f"step time must be positive, got {step_time_s!r} s")
    micro_batches = accumulation_steps * estimate.config.dp
    flops = estimate.flops
    return Utilization(model_flops=float(flops.model * micro_batches),
                       hardware_flops=float(flops.hardware * micro_batches), step_time_s=step_time_s,
                       gpus=estimate.config.layout.world, peak_flop_per_s=peak_flop_per_s or None)


@dataclass(frozen=True, slots=True)
class RunCost:
    """Training ``train_tokens`` at one step time: how long, how many GPU-hours, and at a price what it costs."""

    train_tokens: int
    tokens_per_step: int
    step_time_s: float
    gpus: int
    price_per_gpu_hour: float | None = None

    @property
    def steps(self) -> int:
        """Optimizer steps, the last one whole."""
        return -(-self.train_tokens // self.tokens_per_step)

    @property
    def wall_s(self) -> float:
        return self.steps * self.step_time_s

    @property
    def gpu_hours(self) -> float:
        return self.wall_s / 3600 * self.gpus

    @property
    def cost(self) -> float | None:
        return None if self.price_per_gpu_hour is None else self.gpu_hours * self.price_per_gpu_hour

    def to_dict(self) -> dict[str, Any]:
        return {"train_tokens": self.train_tokens, "steps": self.steps, "wall_s": self.wall_s,
                "wall_days": self.wall_s / 86400, "gpu_hours": self.gpu_hours,
                "price_per_gpu_hour": self.price_per_gpu_hour, "cost": self.cost}

    def describe(self) -> str:
        price = "" if self.cost is None else f", {self.cost:,.0f} at {self.price_per_gpu_hour:g} a GPU-hour"
        gpus = f"{self.gpus:,} GPU" + ("s" if self.gpus > 1 else "")
        return (f"{self.train_tokens:,} tokens: {self.steps:,} steps, {_duration(self.wall_s)} on {gpus}, "
                f"{self.gpu_hours:,.0f} GPU-hours{price}")


MAX_TRAIN_TOKENS = 10**18
"""The most tokens a run may be priced for: a thousand times the largest published runs (tens of trillions)."""
MAX_GPU_HOUR_PRICE = 1e9
"""The highest price of a GPU-hour taken, in any currency (a hundred million times a cloud H100's in dollars):
beyond it a cost is no figure anyone plans with, and near float's range it overflows to infinity."""


def check_run(train_tokens: int | None, price_per_gpu_hour: float | None) -> None:
    """ConfigError naming a bad ``--train-tokens`` or ``--gpu-hour-price``."""
    if train_tokens is not None and (isinstance(train_tokens, bool) or not isinstance(train_tokens, int)
                                     or not 0 < train_tokens <= MAX_TRAIN_TOKENS):
        raise ConfigError(f"--train-tokens must be a positive number of tokens up to {MAX_TRAIN_TOKENS:.0e}, got "
                          f"{train_tokens!r}")
    if price_per_gpu_hour is not None:
        if train_tokens is None:
            raise ConfigError("--gpu-hour-price prices a run: give --train-tokens too")
        if not isinstance(price_per_gpu_hour, (int, float)) or isinstance(price_per_gpu_hour, bool) \
                or not 0 <= price_per_gpu_hour <= MAX_GPU_HOUR_PRICE:
            raise ConfigError(f"--gpu-hour-price must be a number from 0 to {MAX_GPU_HOUR_PRICE:.0e}, got "
                              f"{price_per_gpu_hour!r}")


def _duration(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:,.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:,.1f} hours"
    return f"{seconds / 60:,.1f} minutes"
