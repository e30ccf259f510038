"""``--trace`` on ``headroom estimate`` and ``headroom plan``: the traced ledger (headroom.agent.hf_trace) beside the
analytic one.

Imported only when asked for; torch and transformers, which a planner's laptop may not have, only when a trace
runs.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from headroom.cli.hf_fetch import config_file
from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import Estimate
from headroom.core.memory.trace_limits import trace_refusal
from headroom.core.planning.planner import Candidate, Plan
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hf_config import read_hf_config
from headroom.core.specs.model import ModelSpec


def traceable_path(model: str) -> Path:
    """The config.json ``--model`` names (a path, or a hub id's); a preset is refused (the trace builds
    transformers' model from a config)."""
    path = config_file(model)
    if path is None:
        raise ConfigError(f"--trace builds the model from its HuggingFace config: --model {model!r} is a preset; "
                          "give a config.json, a model directory or a HuggingFace model id")
    return path


def traceable(model: str, config: TrainConfig, spec: ModelSpec) -> Path:
    """``model``'s config.json, when ``spec`` can be traced at ``config``; else ConfigError with the reason."""
    path = traceable_path(model)
    if (refusal := trace_refusal(config, spec)) is not None:
        raise ConfigError(refusal)
    return path


def traced_report(model: str, config: TrainConfig, result: Estimate) -> dict:
    """The trace of ``model`` (a config.json or model directory) at ``config``, its total against the
    analytic ledger's, and where the two part."""
    path = traceable(model, config, result.spec)
    try:
        from headroom.agent.hf_trace import differences, trace
    except ImportError as err:
        raise ConfigError(f"--trace needs torch and transformers ({err}): "
                          "pip install 'headroom[agent,frameworks]'") from None
    raw = read_hf_config(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a JSON object with model fields, got {type(raw).__name__}")
    traced = trace(raw, result.spec.name, config, result.device)
    return traced.to_dict() | {"analytic_saved_bytes": result.ledger.saved_bytes,
                               "differences": differences(traced, result.ledger)}


def plan_trace_report(model: str, result: Plan) -> dict:
    """The plan's recommendation (or, when nothing fits, the candidate closest to fitting) traced, and what it
    needs with the traced activations in place of the analytic ones: its peak moves by the difference in bytes
    kept for backward, once per micro-batch the rank holds, and is margined as the planner margins it. A
    candidate the trace cannot follow is named with the reason, the plan unchanged."""
    candidate = result.recommendation or min(result.rejected, key=lambda c: c.required_bytes, default=None)
    if candidate is None:
        return {"refused": "the plan has no candidate to trace"}
    refusal = trace_refusal(candidate.config, result.request.spec)
    if refusal is not None:
        return {"candidate": _name(candidate), "refused": refusal}
    est = candidate.estimate
    report = traced_report(model, candidate.config, est)
    extra = (report["saved_bytes"] - report["analytic_saved_bytes"]) * Fraction(est.rank.in_flight)
    peak = round((est.peak_bytes + extra) * result.calibration.memory.correction)
    required = round(peak * result.profile.fragmentation) + result.request.context_reserve_bytes
    return report | {"candidate": _name(candidate), "traced_required_bytes": required,
                     "required_bytes": candidate.required_bytes, "budget_bytes": result.request.budget_bytes,
                     "fits": required <= result.request.budget_bytes}


def _name(candidate: Candidate) -> str:
    return f"{candidate.layout}: {candidate.label}"


def render_trace(report: dict) -> str:
    saved, analytic = report["saved_bytes"], report["analytic_saved_bytes"]
    lines = [f"traced with transformers on meta ({report['device']} attention kernels): "
             f"{saved / 1e6:,.3f} MB kept for backward, analytic {analytic / 1e6:,.3f} MB "
             f"({(saved - analytic) / analytic:+.1%}; MB = 1e6 bytes)"]
    lines += [f"  {line}" for line in report["differences"]] or ["  the two ledgers keep the same tensors"]
    return "\n".join(lines)


def render_plan_trace(report: dict) -> str:
    if "refused" in report:
        where = f" ({report['candidate']})" if "candidate" in report else ""
        return f"trace: not run{where}: {report['refused']}"
    needs, budget = report["traced_required_bytes"], report["budget_bytes"]
    verdict = "fits" if report["fits"] else "does not fit"
    return "\n".join([
        f"trace of {report['candidate']}:",
        render_trace(report),
        f"with the traced activations it needs {needs / 1e9:,.2f} GB of the {budget / 1e9:,.2f} GB budget "
        f"(planned {report['required_bytes'] / 1e9:,.2f} GB): {verdict}"])
