"""``headroom estimate --trace``: the traced ledger (agent.hf_trace) beside the analytic one.

Imported only when asked for: it needs torch and transformers, which a planner's laptop may not have.
"""

from __future__ import annotations

from core.config import TrainConfig
from core.errors import ConfigError
from core.estimate import Estimate
from core.hf_config import hf_model_name, read_hf_config
from core.presets import hf_config_path


def traced_report(model: str, config: TrainConfig, result: Estimate) -> dict:
    """The trace of ``model`` (a config.json or model directory) at ``config``, its total against the
    analytic ledger's, and where the two part."""
    path = hf_config_path(model)
    if path is None:
        raise ConfigError(f"--trace builds the model from its HuggingFace config: --model {model!r} is a preset; "
                          "give a config.json or a model directory")
    layout = config.layout
    if max(layout.tp, layout.pp, layout.cp, layout.ep) > 1:
        raise ConfigError(f"--trace runs the whole model in one process: layout {layout} splits it; "
                          "leave out --tp, --pp, --cp and --ep")
    try:
        from agent.hf_trace import differences, trace
    except ImportError as err:
        raise ConfigError(f"--trace needs torch and transformers ({err}): "
                          "pip install 'headroom[agent,frameworks]'") from None
    raw = read_hf_config(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a JSON object with model fields, got {type(raw).__name__}")
    traced = trace(raw, hf_model_name(raw, path), config, result.device)
    return traced.to_dict() | {"analytic_saved_bytes": result.ledger.saved_bytes,
                               "differences": differences(traced, result.ledger)}


def render_trace(report: dict) -> str:
    saved, analytic = report["saved_bytes"], report["analytic_saved_bytes"]
    lines = [f"traced with transformers on meta ({report['device']} attention kernels): "
             f"{saved / 1e6:,.3f} MB kept for backward, analytic {analytic / 1e6:,.3f} MB "
             f"({(saved - analytic) / analytic:+.1%}; MB = 1e6 bytes)"]
    lines += [f"  {line}" for line in report["differences"]] or ["  the two ledgers keep the same tensors"]
    return "\n".join(lines)
