"""Precision recipes and optimizers: bytes per parameter of static state.

Static memory per parameter (optimizer state is fp32 in every recipe):

=============  =====  ====  ======  ==========================================
recipe         param  grad  master  notes
=============  =====  ====  ======  ==========================================
fp32             4     4      0     activations fp32
amp-bf16         4     4      0     PyTorch autocast: fp32 params and grads;
                                    forward makes bf16 copies of matmul weights
                                    that backward keeps alive (2 B each)
bf16-pure        2     2      0     params, grads and activations bf16
bf16-master      2     2      4     bf16 model, fp32 master copy for the update
bf16-fp32grad    2     4      4     bf16 model, fp32 main gradients and master
                                    copy: Megatron-LM's distributed optimizer
=============  =====  ====  ======  ==========================================

Optimizer state in fp32: SGD 0, SGD with momentum 4, AdaGrad 4, Adam/AdamW 8
bytes per parameter. So fp32 + Adam = 16 B/param, bf16-pure + Adam = 12,
bf16-master + Adam = 16 (a 7B model: 112 GB before any activation).
bf16-fp32grad + Adam with the master copy and state sharded over d ranks
(``--zero 1``) is Megatron's documented 6 + 12/d bytes per parameter
(18 for d = 1; Megatron-LM docs, "Distributed Optimizer").

Under FSDP (``--zero 3``) ``amp-bf16`` is FSDP's mixed precision
(``MixedPrecisionPolicy(param_dtype=bfloat16)``): fp32 sharded parameters and
gradients, each unit gathered in bf16 for its forward and backward, no
autocast and so no per-op casts; headroom.core.memory.estimate accounts the gathered units.
"""

from __future__ import annotations

from dataclasses import dataclass

from headroom.core.errors import ConfigError

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int64": 8, "bool": 1, "uint8": 1}
"""Bytes of one element, by the dtype names the core uses."""


@dataclass(frozen=True, slots=True)
class PrecisionRecipe:
    name: str
    param_bytes: int
    grad_bytes: int
    master_bytes: int
    activation_bytes: int
    """Element size of activations (the compute dtype)."""
    compute_dtype: str
    """Dtype the matmuls run in: picks the peak FLOP/s for MFU."""
    autocast: bool = False
    """Matmuls run under ``torch.autocast``: 16-bit copies of fp32 weights and per-op casts."""

    @property
    def param_dtype(self) -> str:
        """Dtype the model's parameters (and so its residual stream) are held in."""
        return "fp32" if self.param_bytes == 4 else "bf16"


PRECISIONS: dict[str, PrecisionRecipe] = {
    r.name: r
    for r in (
        PrecisionRecipe("fp32", 4, 4, 0, 4, "fp32"),
        PrecisionRecipe("amp-bf16", 4, 4, 0, 2, "bf16", autocast=True),
        PrecisionRecipe("bf16-pure", 2, 2, 0, 2, "bf16"),
        PrecisionRecipe("bf16-master", 2, 2, 4, 2, "bf16"),
        PrecisionRecipe("bf16-fp32grad", 2, 4, 4, 2, "bf16"),
    )
}

OPTIMIZER_STATE_BYTES: dict[str, int] = {
    "sgd": 0,
    "sgd-momentum": 4,
    "adagrad": 4,
    "adam": 8,
    "adamw": 8,
}


def optimizer_step_transient_bytes(name: str, device: str, state_bytes: int) -> int:
    """Bytes one optimizer step allocates beyond the parameters, gradients and its state (``state_bytes``,
    this rank's), as torch runs the agent's optimizers (headroom.agent.bench_train.make_optimizer).

    On CUDA Adam and AdamW are fused (``fused=True``, as torchtitan, Megatron-LM and the HF Trainer run
    them): they update in place, and an H200 measured the optimizer's peak at the static state plus the
    cuBLAS workspaces (tests/test_reference_data.py). On a CPU they run ``foreach``: ``_foreach_sqrt``
    of the second moments is a copy of half the state. SGD, with or without momentum, works in place;
    AdaGrad keeps ``sqrt`` of its sums beside them (at most one copy of its state: torch's ``foreach``
    path makes one for every tensor, the CPU's per-tensor path one tensor at a time).
    """
    if name in ("adam", "adamw"):
        return 0 if device == "cuda" else state_bytes // 2
    return state_bytes if name == "adagrad" else 0


SEARCHED = "auto"
"""A plan's ``--precision auto``: the planner tries every recipe the device computes in, each with and without
the FP8 recipes (headroom.core.planning.planner.PlanRequest.precision_search)."""
LIGHTEST = "bf16-pure"
"""The recipe of least static memory and activations: what a precision search screens a layout with."""


def searched_precisions(peaks: dict[str, float]) -> list[str]:
    """The recipes a precision search tries on a device with these dense peaks (dtype -> FLOP/s): every bf16
    recipe where the device has bf16 units (a profile without peaks, a measured box that timed no matmul, is taken
    to have them), else fp32. fp32 is not tried beside bf16: its matmuls run at a small fraction of bf16's peak
    (1/15 on an H100, 1/16 on an A100 without TF32) and its activations take twice the bytes, so it cannot win.
    The search weighs time and memory only: a recipe's numerics (bf16-pure keeps no fp32 master copy) are the
    user's to judge."""
    if peaks and "bf16" not in peaks:
        return ["fp32"]
    return [name for name, recipe in PRECISIONS.items() if recipe.compute_dtype == "bf16"]


def get_precision(name: str) -> PrecisionRecipe:
    try:
        return PRECISIONS[name]
    except KeyError:
        raise ConfigError(f"unknown precision recipe {name!r}; valid: {', '.join(PRECISIONS)}") from None


def optimizer_state_bytes(name: str) -> int:
    """fp32 optimizer state bytes per parameter."""
    try:
        return OPTIMIZER_STATE_BYTES[name]
    except KeyError:
        raise ConfigError(f"unknown optimizer {name!r}; valid: {', '.join(OPTIMIZER_STATE_BYTES)}") from None
