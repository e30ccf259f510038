"""Matmul throughput by dtype and shape.

fp32 is measured twice, with TF32 off (``highest``) and on (``high``), and the
setting is recorded; fp16 and bf16 directly; fp8 e4m3 through
``torch._scaled_mm`` where a tiny probe call succeeds (Hopper, Ada), else the
row records why it was skipped. fp8 runs twice, with fp32 accumulation
throughout and with ``use_fast_accum`` (the mode the datasheet's fp8 peak
assumes), and the flag is kept in the row's details. Shapes: a square sweep,
plus the GEMMs of transformer layers (q/o projection, k/v projection, MLP up
and down, logits) for a few presets and token counts.

Inputs are random normal (headroom.agent.operands). Every call reads operands no other call of the
last twice-the-L2 bytes read: one allocation holds as many operand sets as
that takes (hundreds for a small GEMM), and call i uses set i mod sets.
"""

from __future__ import annotations

import functools
import math

import torch

from headroom.agent.cases import Case, skipped
from headroom.agent.fingerprint import datasheet_spec
from headroom.agent.operands import random_normal
from headroom.agent.timer import l2_bytes, time_fn
from headroom.core.specs.presets import get_preset
from headroom.db.models import MatmulResult

TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
CPU_FP16_MAX_DIM = 256
"""fp16 matmul ran at about 1 GFLOP/s on this project's 2-core CPU (bf16: ~400): measured small only."""


def transformer_shapes(preset: str, tokens: int) -> list[tuple[str, int, int, int]]:
    """(label, m, n, k) of each GEMM in one layer and the head, for ``tokens`` tokens."""
    spec = get_preset(preset)
    h, kv, f = spec.hidden, spec.kv_dim, spec.ffn_hidden
    return [
        (f"{preset} q/o proj", tokens, h, h),
        (f"{preset} k/v proj", tokens, kv, h),
        (f"{preset} mlp up", tokens, f, h),
        (f"{preset} mlp down", tokens, h, f),
        (f"{preset} logits", tokens, spec.vocab_size, h),
    ]


@functools.cache
def fp8_support(device: torch.device) -> str | None:
    """None when ``torch._scaled_mm`` runs on this device, else why not (probed once per device)."""
    if device.type != "cuda":
        return "fp8 matmul (torch._scaled_mm) needs a CUDA device"
    if not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no float8_e4m3fn"
    try:
        a = torch.randn(32, 32, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(32, 32, device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except (RuntimeError, TypeError, AssertionError) as err:
        return f"torch._scaled_mm failed on a 32x32 probe: {str(err).splitlines()[0]}"
    return None


def _operands(device: torch.device, dtype: str, m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) stacked over enough sets that a pass over them is twice the L2; set i is (A[i], B[i])."""
    element = 1 if dtype == "fp8" else torch.finfo(TORCH_DTYPES[dtype]).bits // 8
    set_bytes = element * (m * k + k * n)
    sets = max(1, math.ceil(2 * l2_bytes(device) / set_bytes))
    if dtype == "fp8":
        a = random_normal(sets, m, k, dtype=torch.float32, device=device).to(torch.float8_e4m3fn)
        # B column-major, as _scaled_mm wants: each B[i] is (k, n) with strides (1, k).
        b = random_normal(sets, n, k, dtype=torch.float32, device=device).to(torch.float8_e4m3fn).transpose(1, 2)
    else:
        a = random_normal(sets, m, k, dtype=TORCH_DTYPES[dtype], device=device)
        b = random_normal(sets, k, n, dtype=TORCH_DTYPES[dtype], device=device)
    return a, b


def measure(device: torch.device, dtype: str, m: int, n: int, k: int, budget_s: float,
            fast_accum: bool = False) -> MatmulResult:
    precision = "high" if dtype == "tf32" else "highest"
    row = MatmulResult(dtype=dtype, m=m, n=n, k=k, precision=precision if dtype in ("fp32", "tf32") else None)
    if dtype == "fp8" and (reason := fp8_support(device)):
        return skipped(row, reason)
    a, b = _operands(device, dtype, m, n, k)
    sets = a.shape[0]
    one = torch.ones((), device=device)
    if dtype == "fp8":
        def step(i: int) -> torch.Tensor:
            return torch._scaled_mm(a[i % sets], b[i % sets], scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                    use_fast_accum=fast_accum)
    else:
        def step(i: int) -> torch.Tensor:
            return a[i % sets] @ b[i % sets]

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        timing = time_fn(step, device, budget_s=budget_s, graph=True)
    finally:
        torch.set_float32_matmul_precision(previous)
    flop_per_s = 2 * m * n * k / timing.median_s
    row.samples_s, row.median_s, row.min_s, row.max_s = list(timing.samples_s), timing.median_s, timing.min_s, timing.max_s
    row.tflop_per_s = flop_per_s / 1e12
    row.details = timing.details() | {"operand_sets": sets} | ({"use_fast_accum": fast_accum} if dtype == "fp8" else {})
    hw = datasheet_spec(device)
    if hw is not None and dtype in hw.peak_flop_per_s:
        row.peak_fraction = flop_per_s / hw.peak_flop_per_s[dtype]
    if device.type == "cpu" and dtype == "fp16":
        row.message = f"shrunk to <= {CPU_FP16_MAX_DIM}: fp16 matmul is pathologically slow on CPU (~1 GFLOP/s)"
    return row


def case(dtype: str, m: int, n: int, k: int, label: str = "", budget_s: float = 1.0, fast_accum: bool = False) -> Case:
    label = " ".join(filter(None, ("fast-accum" if fast_accum else "", label)))
    name = f"{dtype} {label + ' ' if label else ''}{m}x{n}x{k}"
    return Case(
        kind="matmul",
        name=name,
        expected_s=budget_s + 0.2,
        measure=functools.partial(measure, dtype=dtype, m=m, n=n, k=k, budget_s=budget_s, fast_accum=fast_accum),
        failed=lambda status, message: MatmulResult(
            dtype=dtype, m=m, n=n, k=k, status=status, message=message,
            details={"use_fast_accum": fast_accum} if dtype == "fp8" else None),
    )


def cases(device: torch.device, squares: list[int], gemms: list[tuple[str, int]], budget_s: float) -> list[Case]:
    """Square sweep per dtype, then transformer GEMMs in bf16 (fp32 on a CPU, where bf16 is emulated)."""
    dtypes = ["fp32", "tf32", "fp16", "bf16", "fp8"]
    out = []
    for dtype in dtypes:
        for size in squares:
            if device.type == "cpu" and dtype == "fp16":
                size = min(size, CPU_FP16_MAX_DIM)
            if device.type == "cpu" and dtype == "tf32":
                continue  # CPUs have no TF32 mode: the fp32 rows are the measurement
            out.append(case(dtype, size, size, size, budget_s=budget_s))
            if dtype == "fp8" and device.type == "cuda":
                out.append(case(dtype, size, size, size, budget_s=budget_s, fast_accum=True))
    gemm_dtype = "bf16" if device.type == "cuda" else "fp32"
    for preset, tokens in gemms:
        for label, m, n, k in transformer_shapes(preset, tokens):
            out.append(case(gemm_dtype, m, n, k, label, budget_s=budget_s))
    return list({c.name: c for c in out}.values())
