"""What the traced ledger (headroom.agent.hf_trace) can follow, checked without torch: the planner asks before it plans.

The trace runs transformers' whole model in one process, in one dtype, under transformers' own checkpointing,
with transformers' own modules (not Liger's kernels).
"""

from __future__ import annotations

from headroom.core.specs.config import TrainConfig
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.precision import get_precision

TRACE_POLICIES = ("none", "full")
"""What transformers' own checkpointing gives: nothing, or every decoder layer (``full``)."""


MAX_TRACED_LAYERS = 1024
"""Decoder layers a trace follows at most: it builds and runs every one in one process (about 0.03 s each on
this project's 2-core CI machine, after 5 s of start: 280 layers took 13 s, 10,000 ran past 600 s and 2.3 GB),
and 1,024 is eight times the deepest published model's 126 (Llama 3.1 405B)."""


def trace_refusal(config: TrainConfig, spec: ModelSpec | None = None) -> str | None:
    """Why ``config`` (of ``spec``, where it is known) cannot be traced, or None."""
    if spec is not None and spec.n_layers > MAX_TRACED_LAYERS:
        return (f"--trace builds and runs every layer of transformers' model in one process: {spec.name}'s "
                f"{spec.n_layers:,} layers are more than the {MAX_TRACED_LAYERS:,} it follows; leave out --trace (the "
                "analytic ledger has no such limit)")
    if spec is not None and spec.attention_softcap and config.attention == "flash":
        return (f"--trace runs transformers' attention on the meta device: {spec.name}'s soft-capped attention has "
                "no SDPA form, and its flash attention (FlashAttention 2) needs CUDA; trace --attention standard "
                "(transformers' eager attention)")
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
