"""What the traced ledger (agent.hf_trace) can follow, checked without torch: the planner asks before it plans.

The trace runs transformers' whole model in one process, in one dtype, under transformers' own checkpointing,
with transformers' own modules (not Liger's kernels).
"""

from __future__ import annotations

from core.config import TrainConfig
from core.precision import get_precision

TRACE_POLICIES = ("none", "full")
"""What transformers' own checkpointing gives: nothing, or every decoder layer (``full``)."""


def trace_refusal(config: TrainConfig) -> str | None:
    """Why ``config`` cannot be traced, or None."""
    if get_precision(config.precision).autocast:
        return (f"--trace runs the model in one dtype: --precision {config.precision} needs autocast, which the "
                "meta device does not have; use fp32 or a bf16 recipe (bf16-pure, bf16-master)")
    if str(config.recompute) not in TRACE_POLICIES:
        return (f"--trace follows transformers' own checkpointing: --recompute {str(config.recompute)!r} cannot be "
                f"traced; valid: {', '.join(TRACE_POLICIES)} (--stack hf plans with those alone)")
    if config.stack == "hf-liger":
        return ("--trace runs transformers' own modules on the meta device, where Liger's Triton kernels cannot run: "
                "--stack hf-liger's ledger is checked against those kernels run on a CPU instead "
                "(docs/accounting.md); trace with --stack hf")
    layout = config.layout
    if max(layout.tp, layout.pp, layout.cp, layout.ep) > 1:
        return (f"--trace runs the whole model in one process: layout {layout} splits it; "
                "leave out --tp, --pp, --cp and --ep")
    return None
