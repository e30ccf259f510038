"""The decoder's block linears swapped for torchao's ``Float8Linear``, as torchtitan's converter swaps them.

torchtitan 0.3's ``Float8LinearConverter`` converts every ``Linear`` whose input and output widths divide by 16,
except the modules its recipe filters out (``lm_head``); headroom.core.specs.float8 says what that keeps and
costs. torchao runs the same Python on a CPU (``torch._scaled_mm`` has a CPU kernel), so what autograd keeps
there is what it keeps on a GPU.
"""

from __future__ import annotations

from torch import nn

from headroom.core.specs.float8 import Float8Recipe, converts


def convert_blocks(blocks: nn.Module, recipe: Float8Recipe) -> int:
    """Swap ``blocks``' eligible linears for float8 ones in place; returns how many were swapped."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as err:  # an agent extra, not a core dependency
        raise RuntimeError(f"--fp8 {recipe.name} needs torchao (pip install torchao): {err}") from None
    swapped: list[str] = []

    def eligible(module: nn.Module, fqn: str) -> bool:
        ok = isinstance(module, nn.Linear) and converts(module.in_features, module.out_features)
        if ok:
            swapped.append(fqn)
        return ok

    convert_to_float8_training(blocks, config=Float8LinearConfig.from_recipe_name(recipe.torchao_recipe),
                               module_filter_fn=eligible)
    return len(swapped)
