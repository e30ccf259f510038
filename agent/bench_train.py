"""The training-step benchmark: where the planner's promise is checked.

One configuration (model, sequence, micro-batch, accumulation, checkpoint
policy, attention, precision recipe, optimizer) trains for a few optimizer
steps on random tokens. After ``warmup_steps`` (at least two, so the
optimizer's state exists) each step is timed, with the optimizer
apart from forward/backward; on CUDA the allocator's peak allocated and
reserved bytes are read at steady state, by phase (forward+backward,
optimizer), with the bytes one forward keeps for backward as the allocator
sees them (``details``). The saved-activation bytes of one
micro-batch are measured with agent/probe.py, and the core's predictions for
the same configuration are stored beside the measurements.

Precision recipes: ``fp32``; ``amp-bf16`` (fp32 parameters, forward under
``torch.autocast``); ``bf16-pure`` (the model in bf16; torch's optimizers keep
their state in the parameters' dtype, so this trainer holds 8 B/param where the
core's recipe (core/specs/precision.py) assumes fp32 state at 12: its static prediction is
an upper bound here). ``bf16-master`` needs a master-copy optimizer the agent
does not have: such rows are recorded as skipped, with that reason.

An out-of-memory error is a result: recorded as ``oom`` with the memory the
step had reached, after which everything is freed and the sweep goes on. A
step the core predicts cannot fit is not run at all (agent/safety.py): it is
recorded as ``skipped``, naming the predicted bytes.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from headroom.agent import float8, host_load
from headroom.agent.cases import Case, skipped
from headroom.agent.fingerprint import datasheet_spec
from headroom.agent.model import Decoder
from headroom.agent.probe import probe
from headroom.agent.safety import refusal
from headroom.agent.sdpa import kernel_label, kernels_run
from headroom.core.memory.estimate import estimate
from headroom.core.safe_text import printable
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.precision import get_precision
from headroom.core.specs.run_config import RunConfig
from headroom.core.timing.step import HardwareProfile, step_time
from headroom.db.models import TrainStepResult


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainSetup:
    spec: ModelSpec
    config: TrainConfig
    accumulation_steps: int = 1
    warmup_steps: int = 2
    steps: int = 5

    @property
    def run_config(self) -> RunConfig:
        """The configuration measured, as a plan and the store write it down."""
        return RunConfig(train=self.config, accumulation_steps=self.accumulation_steps)

    @property
    def label(self) -> str:
        cfg = self.config
        fp8 = f" fp8 {cfg.fp8}" if cfg.float8 is not None else ""
        compiled = " compiled" if cfg.compile else ""
        return (f"{self.spec.name} s{cfg.seq_len} micro {cfg.micro_batch} x{self.accumulation_steps} "
                f"{cfg.recompute} {cfg.attention} {cfg.precision}{fp8}{compiled}")


def forward_loss(model: Decoder, tokens: torch.Tensor, targets: torch.Tensor, precision: str) -> torch.Tensor:
    """One micro-batch's loss under the precision recipe."""
    if get_precision(precision).autocast:
        with torch.autocast(tokens.device.type, dtype=torch.bfloat16):
            return model(tokens, targets)
    return model(tokens, targets)


def build_model(setup: TrainSetup, device: torch.device) -> Decoder:
    cfg = setup.config
    with torch.device(device):
        model = Decoder(setup.spec, attention=cfg.attention, dropout=cfg.dropout, recompute=cfg.recompute,
                        stack=cfg.stack)
    if cfg.recipe.param_dtype == "bf16":
        model = model.to(torch.bfloat16)
    if cfg.float8 is not None:
        float8.convert(model, cfg.float8)
    if cfg.compile:
        from headroom.agent.compiled import compile_blocks  # only where a run compiles

        compile_blocks(model, cfg.recompute, cfg.stack)
    return model.train()


def make_optimizer(name: str, params, device: torch.device) -> torch.optim.Optimizer:
    fused = {"fused": True} if device.type == "cuda" else {"foreach": True}
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, **fused)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, **fused)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    return torch.optim.Adagrad(params, lr=1e-3)


class _Clock:
    """Marks within a step: CUDA events on the device's own stream on a GPU, the host clock on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self):
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def seconds(self, start, end) -> float:
        if self.device.type == "cuda":
            return start.elapsed_time(end) / 1e3
        return end - start


class _Memory:
    """The allocator's view of the timed steps (CUDA): peaks by phase, and the allocated bytes around the
    last micro-batch of the last step (before and after its forward and its backward).

    The caching allocator books allocations and frees when they are enqueued,
    so its counters are read without synchronising. Each ``phase`` call ends
    a phase: its peak is the most allocated since the previous call.
    """

    def __init__(self, device: torch.device) -> None:
        self.device, self.cuda = device, device.type == "cuda"
        self.peaks: dict[str, int] = {}
        self.reserved = 0
        self.allocated_at: dict[str, int] = {"case start": self.allocated()}

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device) if self.cuda else 0

    def start(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def phase(self, name: str, snapshot: str | None = None) -> None:
        """End phase ``name``; ``snapshot`` also records the bytes allocated now under that name."""
        if not self.cuda:
            return
        self.peaks[name] = max(self.peaks.get(name, 0), torch.cuda.max_memory_allocated(self.device))
        self.reserved = max(self.reserved, torch.cuda.max_memory_reserved(self.device))
        torch.cuda.reset_peak_memory_stats(self.device)
        if snapshot:
            self.allocated_at[snapshot] = self.allocated()

    def details(self) -> dict:
        if not self.cuda or not self.peaks:
            return {}
        at = self.allocated_at
        return {"phase_peak_bytes": dict(self.peaks), "allocated_bytes": dict(at),
                "forward_kept_bytes": at["after forward"] - at["before forward"]}


ProfileSource = HardwareProfile | Callable[[], HardwareProfile | None] | None


def measure(device: torch.device, setup: TrainSetup, profile: ProfileSource = None) -> TrainStepResult:
    """``profile`` (or a function giving it when the case runs) predicts the step time; None: no prediction."""
    cfg, spec = setup.config, setup.spec
    profile = profile() if callable(profile) else profile
    prediction = estimate(spec, cfg, device.type, setup.accumulation_steps)
    predicted_time = step_time(prediction, profile, setup.accumulation_steps).total_s if profile else None
    row = TrainStepResult(
        model_name=spec.name, model_spec=spec.to_dict(), **setup.run_config.columns(),
        prediction=prediction.to_dict() | {"step_time_s": predicted_time},
        predicted_peak_bytes=prediction.peak_bytes,
        predicted_activation_bytes=prediction.ledger.saved_bytes,
        predicted_step_time_s=predicted_time,
    )
    if cfg.recipe.master_bytes or cfg.recipe.grad_bytes != cfg.recipe.param_bytes:
        return skipped(row, f"the agent's trainer has no master-copy optimizer for {cfg.precision}")
    reason = refusal(prediction, device)
    if reason:
        return skipped(row, reason)
    memory = _Memory(device)
    model = optimizer = batches = None
    try:
        model = build_model(setup, device)
        optimizer = make_optimizer(cfg.optimizer, model.parameters(), device)
        shape = (cfg.micro_batch, cfg.seq_len)
        batches = [(torch.randint(0, spec.vocab_size, shape, device=device),
                    torch.randint(0, spec.vocab_size, shape, device=device)) for _ in range(setup.accumulation_steps)]
        clock = _Clock(device)
        marks = []
        for step in range(setup.warmup_steps + setup.steps):
            timed = step >= setup.warmup_steps
            if timed:
                memory.start()
            if step == setup.warmup_steps:
                window = host_load.mark()
            start = clock.mark()
            for i, (tokens, targets) in enumerate(batches):
                last = timed and i == len(batches) - 1
                if last:
                    memory.phase("backward", snapshot="before forward")
                loss = forward_loss(model, tokens, targets, cfg.precision) / setup.accumulation_steps
                if timed:
                    memory.phase("forward", snapshot="after forward" if last else None)
                loss.backward()
                del loss
                if timed:
                    memory.phase("backward", snapshot="after backward" if last else None)
            middle = clock.mark()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            end = clock.mark()
            if step == 0:
                first_s = clock.seconds(start, end)  # a compiled model's includes its compile
            if timed:
                memory.phase("optimizer")
                marks.append((start, middle, end))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            row.peak_allocated_bytes = max(memory.peaks.values())
            row.peak_reserved_bytes = memory.reserved
        samples = [clock.seconds(s, e) for s, _, e in marks]
        host = host_load.verdict(window, host_load.mark(), samples, torch.get_num_threads())
        optimizer_s = [clock.seconds(m, e) for _, m, e in marks]
        tokens, targets = batches[0]
        def forward() -> torch.Tensor:
            return forward_loss(model, tokens, targets, cfg.precision)

        if cfg.compile:  # hooks alone: under a dispatch mode dynamo would run the blocks eagerly
            probed, kernel = probe(model, forward, track=False), "compiled"
        else:
            probed, ops = kernels_run(lambda: probe(model, forward))
            kernel = kernel_label(ops) if cfg.attention == "flash" else "standard"
        row.activation_bytes = probed.activation_bytes
        row.details = memory.details() | {
            "kernel": kernel, "first_step_s": first_s,
            "probe": {"device_activation_bytes": probed.device_activation_bytes, "host_bytes": probed.host_bytes,
                      "parameter_copy_bytes": probed.parameter_copy_bytes},
            "host": host,
        }
    except torch.OutOfMemoryError as err:
        row.status = "oom"
        row.message = printable(str(err).splitlines()[0])[:500]
        if device.type == "cuda":
            row.peak_allocated_bytes = max([torch.cuda.max_memory_allocated(device), *memory.peaks.values()])
            row.peak_reserved_bytes = max(torch.cuda.max_memory_reserved(device), memory.reserved)
        return row
    finally:
        del model, optimizer, batches
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    row.samples_s = samples
    row.median_s, row.min_s, row.max_s = statistics.median(samples), min(samples), max(samples)
    row.optimizer_median_s = statistics.median(optimizer_s)
    row.tokens_per_s = cfg.tokens * setup.accumulation_steps / row.median_s
    hw = datasheet_spec(device)
    dtype = get_precision(cfg.precision).compute_dtype
    if hw is not None and dtype in hw.peak_flop_per_s:
        flops = prediction.flops
        row.mfu = flops.model * setup.accumulation_steps / row.median_s / hw.peak_flop_per_s[dtype]
        row.hfu = flops.hardware * setup.accumulation_steps / row.median_s / hw.peak_flop_per_s[dtype]
    return row


def case(setup: TrainSetup, profile: ProfileSource = None, expected_s: float = 2.0) -> Case:
    return Case(
        kind="train",
        name=setup.label,
        expected_s=expected_s,
        measure=functools.partial(measure, setup=setup, profile=profile),
        failed=lambda status, message: TrainStepResult(
            model_name=setup.spec.name, model_spec=setup.spec.to_dict(), **setup.run_config.columns(),
            status=status, message=message,
        ),
    )
