"""The decoder's linears swapped for torchao's float8 or MXFP8 ones, as torchtitan's converters swap them.

torchtitan 0.3's ``Float8LinearConverter`` converts every block ``Linear`` whose input and output widths divide
by 16, its recipes filtering out the head; its ``MXFP8LinearConverter`` converts every linear, the head
included. headroom.core.specs.float8 says what each keeps and costs. torchao runs the same Python on a CPU
(``torch._scaled_mm`` has a CPU kernel; MXFP8 runs its emulated kernels there), so what autograd keeps there
is what it keeps on a GPU.
"""

from __future__ import annotations

import torch
from torch import nn

from headroom.core.specs.float8 import Float8Recipe


def convert(model: nn.Module, recipe: Float8Recipe) -> int:
    """Swap the decoder's linears the recipe converts (its blocks', and the head under MXFP8) in place; returns
    how many were swapped."""
    try:
        if recipe.block:
            return _to_mxfp8(model, recipe)
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as err:  # an agent extra, not a core dependency
        raise RuntimeError(f"--fp8 {recipe.name} needs torchao (pip install torchao): {err}") from None
    swapped: list[str] = []

    def eligible(module: nn.Module, fqn: str) -> bool:
        ok = isinstance(module, nn.Linear) and recipe.converts(module.in_features, module.out_features)
        if ok:
            swapped.append(fqn)
        return ok

    convert_to_float8_training(model.blocks, config=Float8LinearConfig.from_recipe_name(recipe.torchao_recipe),
                               module_filter_fn=eligible)
    return len(swapped)


def _to_mxfp8(model: nn.Module, recipe: Float8Recipe) -> int:
    """Every linear as an ``MXFP8Linear`` holding the same parameters: Blackwell's kernels on a GPU, torchao's
    emulation elsewhere."""
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear) or isinstance(child, MXFP8Linear):
                continue
            weight = child.weight
            preference = KernelPreference.AUTO if weight.is_cuda else KernelPreference.EMULATED
            with torch.device("meta"):
                mx = MXFP8Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                 kernel_preference=preference)
            mx.weight, mx.bias = weight, child.bias
            setattr(parent, name, mx)
            swapped += 1
    return swapped
