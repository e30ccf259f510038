"""What SDPA keeps for backward when handed an explicit mask: the GPU check's probe of a rule the core lacks.

transformers hands a sliding-window layer's SDPA an explicit boolean mask once
the sequence is as long as the window (Mistral 7B v0.1, Gemma 3), with k and v
repeated to every head. On a CPU the flash kernel takes the mask and keeps it,
made additive in the inputs' dtype (tests/test_hf_trace.py checks that against
a real forward). Which CUDA kernel takes it, and what that keeps, has not been
measured, so the hf stack refuses such configurations on CUDA
(headroom.core.specs.devices.DeviceRules.fused_attention_mask).

This probe is the measurement that settles it: one masked call per dtype and
sequence length (a multiple of 32 and one that is not, for kernels that pad),
the kernel that ran, and the storages kept beyond q, k and v, against the rule
the ledger applies on a CPU (headroom.core.memory.attention_trace.attention_core): the mask in the inputs'
dtype, the output, an fp32 log-sum-exp per row and, on CUDA, the generator's
seed and offset. Where every probe agrees, the rule holds on that device.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F

from headroom.agent.ledger_check import DTYPE_NAMES
from headroom.agent.probe import probe
from headroom.agent.sdpa import kernel_label, kernels_run

HEADS, HEAD_DIM, WINDOW = 8, 128, 64
"""A Gemma-3-like attention (grouped k/v repeated to 8 heads of 128) and a window shorter than every probe."""
DTYPES = (torch.bfloat16, torch.float32)


def sequence_lengths(device: torch.device) -> tuple[int, ...]:
    """A multiple of 32 and a length that is not (2,048 and 2,040 on a GPU; 128 and 120 on a CPU)."""
    return (2048, 2040) if device.type == "cuda" else (128, 120)


def sliding_window_mask(seq_len: int, window: int, device: torch.device) -> torch.Tensor:
    """transformers' sliding-window causal mask: (1, 1, s, s) booleans, True where a query may attend."""
    i = torch.arange(seq_len, device=device)
    distance = i[:, None] - i[None, :]
    return ((distance >= 0) & (distance < window))[None, None]


def expected(device: torch.device, dtype: str, seq_len: int) -> Counter:
    """What the CPU's rule says the kernel keeps beyond q, k and v, as (dtype, bytes) storages."""
    size = {"bf16": 2, "fp32": 4}[dtype]
    kept = Counter({(dtype, seq_len * seq_len * size): 1})  # the mask, additive
    kept[(dtype, HEADS * seq_len * HEAD_DIM * size)] += 1  # the output
    kept[("fp32", HEADS * seq_len * 4)] += 1  # the log-sum-exp
    if device.type == "cuda":
        kept[("int64", 8)] += 2  # the generator's seed and offset
    return kept


class _Inputs(torch.nn.Module):
    """q, k and v as parameters, so that what the probe reports beyond them is the kernel's own."""

    def __init__(self, device: torch.device, dtype: torch.dtype, seq_len: int) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Parameter(torch.randn(1, HEADS, seq_len, HEAD_DIM, device=device,
                                                                 dtype=dtype)) for _ in range(3))


def probe_masked(device: torch.device, dtype: torch.dtype, seq_len: int) -> dict[str, Any]:
    """One masked SDPA call: the kernel that ran, what it kept beyond its inputs, and whether that is the rule."""
    name = DTYPE_NAMES[str(dtype).removeprefix("torch.")]
    inputs = _Inputs(device, dtype, seq_len)
    mask = sliding_window_mask(seq_len, WINDOW, device)
    label = f"{name} s{seq_len} b1 a{HEADS} d{HEAD_DIM} window {WINDOW}"
    try:
        probed, ops = kernels_run(lambda: probe(inputs, lambda: F.scaled_dot_product_attention(
            inputs.q, inputs.k, inputs.v, attn_mask=mask).sum()))
    except RuntimeError as err:
        return {"label": label, "status": "error", "message": str(err).splitlines()[0][:200]}
    kept = [t for t in probed.tensors if t.kind != "parameter"]
    measured = Counter((DTYPE_NAMES.get(t.dtype, t.dtype), t.nbytes) for t in kept)
    rule = expected(device, name, seq_len)
    return {
        "label": label, "status": "ok" if measured == rule else "differs", "kernel": kernel_label(ops),
        "kept": [{"op": t.op, "shape": list(t.shape), "dtype": DTYPE_NAMES.get(t.dtype, t.dtype), "bytes": t.nbytes}
                 for t in kept],
        "only_measured": _listed(measured - rule), "only_rule": _listed(rule - measured),
    }


def _listed(storages: Counter) -> list[str]:
    return [f"{dtype} {size:,} bytes" + (f" (x{n})" if n > 1 else "") for (dtype, size), n in sorted(storages.items())]


def probes(device: torch.device) -> list[dict[str, Any]]:
    """Every dtype at every sequence length; a CUDA device's memory given back after each."""
    out = []
    for dtype in DTYPES:
        for seq_len in sequence_lengths(device):
            out.append(probe_masked(device, dtype, seq_len))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return out
