"""The activation ledger against what autograd really keeps, on the device at hand.

``headroom.core.memory.ledger`` predicts, tensor by tensor, what one micro-batch of the
agent's decoder keeps for backward; ``headroom.agent.probe`` measures it. On the CPU
the two agree byte for byte (tests/test_ledger.py). On a GPU the core relies
on CUDA rules no CPU can show: fused SDPA kernels and the tensors each keeps,
1-byte dropout masks, fp32 softmax under autocast, the fused RMSNorm, and
offload to host memory. ``check`` builds one configuration on a device,
probes it (optionally with one SDPA backend forced) and compares three
quantities with the ledger:

- ``device activations``: activations and token ids kept on the device;
- ``host``: what ``save_on_cpu`` moved to host memory (activations and weights);
- ``weight copies``: autocast's 16-bit copies of weights kept on the device.

A configuration the device cannot run (a forced backend that declines it,
out of memory) is a result with its reason, not a crash. A mismatch lists
the storages one side has and the other lacks, by dtype and size, with the
ops (probe) and names (ledger) behind them, so the rule to correct can be
read off the report.
"""

from __future__ import annotations

import dataclasses
import gc
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch

from headroom.agent.bench_attention import backend_context, unsupported_reason
from headroom.agent.bench_train import TrainSetup, build_model, forward_loss
from headroom.agent.model import Decoder
from headroom.agent.probe import ProbeResult, probe
from headroom.agent.sdpa import declined, kernel_label, kernels_run
from headroom.core.memory.ledger import Ledger, activation_ledger
from headroom.core.safe_text import printable
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.devices import device_rules
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy

TOLERANCE = 0.02
"""Relative error within which ledger and probe agree (observed on CPU: 0.00%)."""
PARTS = ("device activations", "host", "weight copies")
DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
"""torch's dtype names as the ledger writes them."""


@dataclass(frozen=True, slots=True)
class LedgerCase:
    model: str
    """A preset; ``n_layers`` replaces its depth."""
    n_layers: int
    seq_len: int
    micro_batch: int
    attention: str
    dropout: float
    policy: str
    precision: str
    backend: str = "default"
    """SDPA backend forced while probing: ``default`` (SDPA's own choice), flash, efficient, cudnn, math."""
    stack: str = "reference"
    """Whose checkpointing applies the policy (headroom.core.specs.stack)."""

    @property
    def spec(self) -> ModelSpec:
        return dataclasses.replace(get_preset(self.model), n_layers=self.n_layers)

    @property
    def config(self) -> TrainConfig:
        return TrainConfig(seq_len=self.seq_len, micro_batch=self.micro_batch, attention=self.attention,
                           dropout=self.dropout, recompute=parse_policy(self.policy), precision=self.precision,
                           stack=self.stack)

    @property
    def label(self) -> str:
        backend = f" [{self.backend}]" if self.backend != "default" else ""
        stack = f" ({self.stack})" if self.stack != "reference" else ""
        return (f"{self.model} L{self.n_layers} s{self.seq_len} b{self.micro_batch} {self.attention} "
                f"p{self.dropout:g} {self.policy} {self.precision}{stack}{backend}")


@dataclass(slots=True)
class LedgerCheck:
    case: LedgerCase
    status: str
    """ok, mismatch, unsupported (a forced backend declined), oom or error."""
    message: str = ""
    kernel: str | None = None
    """The attention kernel that ran (agent/sdpa.py), for flash attention."""
    parts: dict[str, tuple[int, int]] = field(default_factory=dict)
    """(predicted, measured) bytes for each of PARTS."""
    diff: list[str] = field(default_factory=list)

    @property
    def error(self) -> float | None:
        """The largest relative error over the parts (each over its prediction, or over the device
        activations where a part is predicted to be 0); None when nothing was measured."""
        if not self.parts:
            return None
        scale = max(1, self.parts["device activations"][0])
        return max(abs(m - p) / (p or scale) for p, m in self.parts.values())

    def to_dict(self) -> dict:
        return {"case": dataclasses.asdict(self.case), "label": self.case.label, "status": self.status,
                "message": self.message, "kernel": self.kernel, "error": self.error,
                "parts": {name: {"predicted": p, "measured": m} for name, (p, m) in self.parts.items()},
                "diff": self.diff}


def build(spec: ModelSpec, config: TrainConfig, device: str | torch.device = "cpu",
          seed: int = 0) -> tuple[Decoder, torch.Tensor, torch.Tensor]:
    """The agent's decoder as it trains this configuration, with token ids and (different) targets."""
    torch.manual_seed(seed)
    device = torch.device(device)
    model = build_model(TrainSetup(spec=spec, config=config), device)
    shape = (config.micro_batch, config.seq_len)
    with torch.device(device):
        tokens = torch.randint(0, spec.vocab_size, shape)
        targets = torch.randint(0, spec.vocab_size, shape)
    return model, tokens, targets


def probe_config(spec: ModelSpec, config: TrainConfig, device: str | torch.device = "cpu") -> ProbeResult:
    """What one forward of this configuration keeps for backward on ``device``."""
    model, tokens, targets = build(spec, config, device)
    return probe(model, lambda: forward_loss(model, tokens, targets, config.precision))


def compare(ledger: Ledger, measured: ProbeResult) -> dict[str, tuple[int, int]]:
    return {
        "device activations": (ledger.device_activation_bytes, measured.device_activation_bytes),
        "host": (ledger.host_bytes, measured.host_bytes),
        "weight copies": (ledger.parameter_copy_bytes, measured.device_parameter_copy_bytes),
    }


def difference(ledger: Ledger, measured: ProbeResult, limit: int = 12) -> list[str]:
    """Storages one side has and the other lacks, as (dtype, bytes, where, kind) with their names, largest first."""
    def where(location: str) -> str:
        return "host" if location in ("host", "cpu") and measured.device_type != "cpu" else "device"

    predicted: Counter = Counter()
    probed: Counter = Counter()
    names: dict[str, dict[tuple, set[str]]] = {"ledger only": {}, "probe only": {}}
    for t in ledger.tensors:
        key = (t.dtype, t.bytes, where(t.location), t.kind)
        predicted[key] += 1
        names["ledger only"].setdefault(key, set()).add(t.name)
    for t in measured.tensors:
        if t.kind == "parameter":
            continue
        key = (DTYPE_NAMES.get(t.dtype, t.dtype), t.nbytes, where(t.device.split(":")[0]), t.kind)
        probed[key] += 1
        names["probe only"].setdefault(key, set()).add(t.op)
    lines = []
    for side, extra in (("probe only", probed - predicted), ("ledger only", predicted - probed)):
        for key, count in extra.items():
            dtype, nbytes, place, kind = key
            lines.append((nbytes * count, f"{side}: {count} x {nbytes:,} B {dtype} {kind} on {place} "
                                          f"({', '.join(sorted(names[side][key])[:5])})"))
    return [text for _, text in sorted(lines, key=lambda x: -x[0])[:limit]]


def check(case: LedgerCase, device: torch.device) -> LedgerCheck:
    """Probe one configuration on ``device`` and compare it with the ledger for that device type."""
    spec, config = case.spec, case.config
    rules = device_rules(device.type)
    if case.backend == "math":  # SDPA forced off its fused kernels: the ledger's math-path rule
        rules = dataclasses.replace(rules, fused_attention=False)
    ledger = activation_ledger(spec, config, device.type, rules)
    failure: tuple[str, str] | None = None
    try:
        model, tokens, targets = build(spec, config, device)
        with warnings.catch_warnings(record=True) as caught, backend_context(case.backend):
            warnings.simplefilter("always")
            try:
                measured, ops = kernels_run(lambda: probe(model, lambda: forward_loss(model, tokens, targets,
                                                                                       config.precision)))
            except torch.OutOfMemoryError:
                raise
            except RuntimeError as err:
                if not declined(err):
                    raise
                failure = ("unsupported", unsupported_reason(err, caught))
    except torch.OutOfMemoryError as err:
        failure = ("oom", printable(str(err).splitlines()[0])[:300])
    except (RuntimeError, ValueError, TypeError) as err:
        failure = ("error", f"{type(err).__name__}: {printable(str(err).splitlines()[0])[:300] if str(err) else ''}")
    if failure is not None:
        model = tokens = targets = None
        gc.collect()
        return LedgerCheck(case, *failure)
    kernel = kernel_label(ops) if config.attention == "flash" else None
    result = LedgerCheck(case, "ok", kernel=kernel, parts=compare(ledger, measured))
    if result.error is not None and result.error > TOLERANCE:
        result.status = "mismatch"
        result.diff = difference(ledger, measured)
    return result
