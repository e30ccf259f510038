"""Which attention kernel ``F.scaled_dot_product_attention`` actually runs.

SDPA picks a kernel per call from the input's device, dtype, shape and the
libraries present: on Hopper with a recent cuDNN it may run cuDNN attention
where flash was expected, and what a kernel saves for backward (and how fast
it is) depends on which one ran. The kernels are aten ops of their own below
autograd, so a dispatch mode sees the one that ran; SDPA's math fallback is
a composite of plain ops, so a call that reaches none of them ran ``math``.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.utils._python_dispatch import TorchDispatchMode

KERNELS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_fused_attention_overrideable": "overrideable",
}


class _KernelRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in KERNELS and name not in self.seen:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def kernels_run(fn: Callable[[], object]) -> tuple[object, list[str]]:
    """Run ``fn()``; return its result and the fused attention ops it reached (aten names, in order)."""
    recorder = _KernelRecorder()
    with recorder:
        out = fn()
    return out, recorder.seen


def declined(err: RuntimeError) -> bool:
    """Did SDPA refuse the call because no allowed kernel takes it (CUDA's and the CPU's wording)?"""
    text = str(err)
    return "No available kernel" in text or "No viable backend" in text


def kernel_label(ops: list[str]) -> str:
    """'flash', 'efficient', 'cudnn' or 'math' (none reached) for what ``kernels_run`` saw."""
    return "+".join(KERNELS[op] for op in ops) if ops else "math"
