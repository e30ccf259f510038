"""The Plan page's logic: inputs <-> URL query string, the plan, and its tables.

Inputs live in the query string (``?model=llama2-7b&seq_len=4096&budget=80GB``)
so a plan can be shared by its URL. `PlanInputs.from_query` reads them,
falling back to the defaults below for anything missing or unreadable;
`PlanInputs.to_query` writes them back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace

import pandas as pd

from core.calibration import Calibration
from core.hardware import HARDWARE
from core.model import ModelSpec
from core.planner import Candidate, Plan, PlanRequest, plan
from core.presets import get_preset
from core.timing import HardwareProfile, datasheet_profile
from core.units import GB, parse_bytes

MODEL_SOURCES = ("preset", "dimensions", "config.json")
DATASHEET_PREFIX = "datasheet: "
MEASURED_PREFIX = "measured: "


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """Everything the Plan page asks for; each field is one query-string key."""

    source: str = "preset"
    model: str = "llama2-7b"
    block: str = "llama"
    n_layers: int = 32
    hidden: int = 4096
    n_heads: int = 32
    n_kv_heads: int = 32
    ffn_hidden: int = 11008
    vocab_size: int = 32000
    seq_len: int = 4096
    global_batch: int = 64
    budget: str = "80GB"
    hardware: str = DATASHEET_PREFIX + "h100-sxm"
    dp: int = 8
    zero: int = 2
    precision: str = "amp-bf16"
    optimizer: str = "adamw"
    attention: str = "flash"
    offload: bool = False

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> PlanInputs:
        """Inputs from a query string; a missing or malformed value keeps its default."""
        values = {}
        for f in fields(cls):
            if f.name not in query:
                continue
            raw = str(query[f.name])
            default = getattr(cls(), f.name)
            try:
                if isinstance(default, bool):
                    values[f.name] = raw.lower() in ("1", "true", "yes", "on")
                elif isinstance(default, int):
                    values[f.name] = int(raw)
                else:
                    values[f.name] = raw
            except ValueError:
                continue
        return cls(**values)

    def to_query(self) -> dict[str, str]:
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in asdict(self).items()}

    def with_(self, **changes) -> PlanInputs:
        return replace(self, **changes)


def dimensions_spec(inputs: PlanInputs) -> ModelSpec:
    """A model from its dimensions (llama: RMSNorm + SwiGLU, no bias; gpt: LayerNorm + GELU, biases)."""
    llama = inputs.block == "llama"
    return ModelSpec(
        name="custom", block=inputs.block, n_layers=inputs.n_layers, hidden=inputs.hidden, n_heads=inputs.n_heads,
        n_kv_heads=inputs.n_kv_heads if llama else inputs.n_heads, ffn_hidden=inputs.ffn_hidden,
        vocab_size=inputs.vocab_size, max_seq_len=max(inputs.seq_len, 1), tied_embeddings=not llama,
        bias="none" if llama else "all",
    )


def hardware_options(measured: list[str]) -> list[str]:
    """Measured devices first (the planner prefers a box's own numbers), then every datasheet row."""
    return [MEASURED_PREFIX + name for name in measured] + [DATASHEET_PREFIX + hw.key for hw in HARDWARE]


def datasheet_hardware(option: str) -> tuple[HardwareProfile, Calibration | None]:
    key = option.removeprefix(DATASHEET_PREFIX)
    spec = next(hw for hw in HARDWARE if hw.key == key)
    return datasheet_profile(spec), None


def build_request(inputs: PlanInputs, spec: ModelSpec) -> PlanRequest:
    """The planner's request; ConfigError (shown as is) when an input is invalid."""
    return PlanRequest(
        spec=spec, seq_len=inputs.seq_len, global_batch=inputs.global_batch, budget_bytes=parse_bytes(inputs.budget),
        dp=inputs.dp, zero=inputs.zero, precision=inputs.precision, optimizer=inputs.optimizer,
        attention=inputs.attention, allow_offload=inputs.offload,
    )


def make_plan(inputs: PlanInputs, spec: ModelSpec, profile: HardwareProfile, calibration: Calibration | None) -> Plan:
    return plan(build_request(inputs, spec), profile, calibration)


def resolve_preset(name: str) -> ModelSpec:
    return get_preset(name)


def recommendation_text(result: Plan) -> str:
    """One line: what to run. Tests compare it across inputs."""
    best = result.recommendation
    if best is None:
        return f"Nothing fits the {result.request.budget_bytes / GB:.1f} GB budget"
    return (
        f"micro-batch {best.config.micro_batch} x accumulation {best.accumulation_steps} x "
        f"{result.request.dp} rank(s), recompute {best.config.recompute}"
    )


def candidates_frame(result: Plan) -> pd.DataFrame:
    """Every candidate, fitting ones ranked first (rank 1 = recommendation), rejected ones with their reason."""
    budget = result.request.budget_bytes
    rows = []
    for rank, c in enumerate((*result.candidates, *result.rejected), 1):
        fits = c.rejection is None
        rows.append({
            "rank": rank if fits else None,
            "candidate": c.label,
            "micro_batch": c.config.micro_batch,
            "accumulation": c.accumulation_steps,
            "recompute": str(c.config.recompute),
            "tokens_per_s": c.tokens_per_s,
            "step_time_s": c.step_time_s,
            "peak_gb": c.peak_bytes / GB,
            "required_gb": c.required_bytes / GB,
            "headroom_gb": (budget - c.required_bytes) / GB,
            "fits": "fits" if fits else "rejected",
            "rejection": c.rejection or "",
        })
    return pd.DataFrame(rows)


def peak_components_frame(result: Plan, candidates: list[Candidate]) -> pd.DataFrame:
    """Peak memory by component (GB) of each candidate, scaled by the calibration, plus the margin.

    The components are the core's estimate times the memory calibration factor,
    so they add up to the calibrated peak; ``margin`` is fragmentation plus the
    CUDA context reserve, so each bar ends at what must fit in the budget.
    """
    factor = result.calibration.memory.factor
    rows = []
    for order, c in enumerate(candidates):
        for name, size in c.estimate.peak_components.items():  # at the moment the peak happens
            rows.append({"candidate": c.label, "order": order, "component": name, "gb": size * factor / GB})
        rows.append({"candidate": c.label, "order": order, "component": "margin",
                     "gb": (c.required_bytes - c.peak_bytes) / GB})
    return pd.DataFrame(rows)


def shown_candidates(result: Plan, fitting: int = 5, rejected: int = 3) -> list[Candidate]:
    """The best fitting candidates and the fastest rejected ones (what the stacked bar shows)."""
    faster = sorted(result.rejected, key=lambda c: -c.tokens_per_s)
    return [*result.candidates[:fitting], *faster[:rejected]]
