"""Scaled dot-product attention, forward and backward, per SDPA backend.

Each backend (flash, efficient, cudnn, math on CUDA; flash and math on CPU)
is forced in turn with ``sdpa_kernel`` and runs causal attention at a few
(batch, sequence, heads, head dim) shapes; on CUDA a ``default`` row also
runs whatever SDPA picks by itself, which is what a model gets. Each row
records the kernel that actually ran (``details["kernel"]``, agent/sdpa.py).
A backend that cannot run a shape is recorded as skipped with torch's own
reasons (the warnings it gives before "No available kernel"); running out of
memory is ``oom``, not a missing backend. Achieved FLOP/s (the summary, the
dashboard's roofline) follow FlashAttention's convention
(headroom.core.memory.flops.attention_kernel_flops): 4 b s^2 h forward, halved for causal
attention, whose masked half fused kernels skip.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from headroom.agent.cases import Case, skipped
from headroom.agent.sdpa import declined, kernel_label, kernels_run
from headroom.agent.timer import time_fn
from headroom.core.safe_text import printable
from headroom.db.models import AttentionResult

BACKENDS: dict[str, SDPBackend | None] = {
    "default": None,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
CPU_BACKENDS = ("flash", "math")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def backend_context(backend: str):
    """``sdpa_kernel`` forcing the backend; nothing for ``default``."""
    forced = BACKENDS[backend]
    return sdpa_kernel(forced) if forced is not None else contextlib.nullcontext()


def unsupported_reason(err: RuntimeError, caught: list[warnings.WarningMessage]) -> str:
    """torch's warnings say why each kernel declined; its error only says none was available."""
    reasons = list(dict.fromkeys(str(w.message).strip() for w in caught if str(w.message).strip()))
    return printable("; ".join(reasons) if reasons else str(err).splitlines()[0])[:480]


def measure(device: torch.device, backend: str, dtype: str, batch: int, seq_len: int, heads: int, head_dim: int,
            budget_s: float) -> AttentionResult:
    row = AttentionResult(backend=backend, dtype=dtype, batch=batch, seq_len=seq_len, n_heads=heads,
                          n_kv_heads=heads, head_dim=head_dim, causal=True)
    shape = (batch, heads, seq_len, head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=DTYPES[dtype], requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device=device, dtype=DTYPES[dtype])

    def forward(i: int) -> torch.Tensor:
        with backend_context(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _, ops = kernels_run(lambda: forward(0))
        except torch.OutOfMemoryError:
            raise  # a result of its own (oom), not a missing backend
        except RuntimeError as err:
            if not declined(err):
                raise
            return skipped(row, f"{backend} cannot run this shape here: {unsupported_reason(err, caught)}")
    fwd = time_fn(forward, device, budget_s=budget_s / 2)
    outputs = [forward(0) for _ in range(2)]

    def backward(i: int) -> None:
        # retain_graph: each iteration differentiates the same forward graph again.
        torch.autograd.grad(outputs[i % 2], (q, k, v), grad, retain_graph=True)

    bwd = time_fn(backward, device, budget_s=budget_s / 2)
    row.forward_samples_s, row.forward_median_s = list(fwd.samples_s), fwd.median_s
    row.forward_min_s, row.forward_max_s = fwd.min_s, fwd.max_s
    row.backward_samples_s, row.backward_median_s = list(bwd.samples_s), bwd.median_s
    row.backward_min_s, row.backward_max_s = bwd.min_s, bwd.max_s
    row.details = {"kernel": kernel_label(ops), "kernel_ops": ops, "forward": fwd.details(), "backward": bwd.details()}
    return row


def cases(device: torch.device, shapes: list[tuple[int, int, int, int]], budget_s: float) -> list[Case]:
    backends = tuple(BACKENDS) if device.type == "cuda" else CPU_BACKENDS
    dtype = "bf16" if device.type == "cuda" else "fp32"
    out = []
    for backend in backends:
        for batch, seq_len, heads, head_dim in shapes:
            args = dict(backend=backend, dtype=dtype, batch=batch, seq_len=seq_len, heads=heads, head_dim=head_dim)
            out.append(Case(
                kind="attention",
                name=f"{backend} {dtype} b{batch} s{seq_len} a{heads} d{head_dim}",
                expected_s=budget_s + 0.3,
                measure=functools.partial(measure, budget_s=budget_s, **args),
                failed=lambda status, message, a=args: AttentionResult(
                    backend=a["backend"], dtype=a["dtype"], batch=a["batch"], seq_len=a["seq_len"],
                    n_heads=a["heads"], n_kv_heads=a["heads"], head_dim=a["head_dim"], causal=True,
                    status=status, message=message,
                ),
            ))
    return out
