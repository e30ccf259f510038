"""FP8 training recipes: which linears run their matmuls in float8, how their inputs are scaled, what that keeps.

A recipe sits on top of a precision recipe (headroom.core.specs.precision): the parameters, gradients and
optimizer state are the precision recipe's, and the converted linears' three GEMMs (output, input gradient,
weight gradient) run in float8 on tensors cast just before each.

torchao's float8 training (``torchao.float8``, torchao 0.18; torchtitan 0.3 runs it through its
``Float8LinearConverter``, ``torchtitan/components/quantization/float8.py``):

- **Conversion.** ``convert_to_float8_training`` swaps ``nn.Linear`` modules for ``Float8Linear``. torchtitan's
  filter (``module_filter_fn``, ``torchtitan/components/quantization/utils.py``) converts a linear only when
  its input and output widths both divide by 16 (the float8 tensor cores' alignment), and its recipes skip
  the head (``filter_fqns=["lm_head"]``, its ``llama3_405b``); the agent converts the same way
  (headroom.agent.float8).
  A mixture of experts' grouped GEMMs are another converter's (``Float8GroupedExpertsConverter``, a
  prototype): not modelled.
- **What backward keeps.** ``matmul_with_hp_or_float8_args.forward`` saves its input and the weight *in
  high precision* (``ctx.save_for_backward(input_hp, weight_hp_t)``) and casts them to float8 again in
  backward: the activations a converted linear keeps are exactly the 16-bit linear's, under every checkpoint
  policy (its output is a 16-bit ``aten.mm`` result, which op-selective caches as it would a bf16 one; a bias
  is added after it, so under torchtitan's every-second-matmul rule the linear counts as an ``aten.mm``).
  tests/test_float8.py checks this byte for byte against what autograd keeps on the CPU, where torchao runs
  the same code.
- **Recipes.** torchtitan 0.3's converter offers ``rowwise`` (its default) and ``rowwise_with_gw_hp``; torchao's
  ``tensorwise`` recipe runs outside it (the agent's decoder, the reference stack). (Under torchtitan's per-op
  checkpointing a tensorwise linear would also keep its two amaxes: its save list names ``aten.max``.)
- **Casts.** Tensorwise: one scale per tensor (an amax over the whole tensor, then a scaled cast).
  Rowwise: one scale per row of the GEMM's reduction, for every operand (``Float8LinearConfig``'s
  ``rowwise`` recipe: e4m3 throughout). Forward casts the input and the weight; backward casts the output's
  gradient twice (once per GEMM, each scaled along its own reduction), the weight again and the input again.
  Each cast is priced as one kernel that reads the 16-bit tensor twice (its amax, then the scaled cast) and
  writes one byte an element: what a compiled step fuses it into (eager torchao launches several, not
  modelled).
- **Precision.** The converted linears need a 16-bit input: a bf16 recipe, or autocast under FSDP's mixed
  precision. Under autocast without FSDP ``Float8Linear`` casts its input to *CUDA's* autocast dtype,
  whatever the device, so the CPU cannot check what it keeps: refused.
- **MXFP8** (``torchao-mxfp8``: torchao's ``MXFP8Linear``, ``torchao/prototype/moe_training/mxfp8_linear.py``;
  torchtitan 0.3's ``MXFP8LinearConverter``, ``torchtitan/components/quantization/mx.py``, its ``llama3_8b_mxfp8``):
  one e8m0 scale for each block of 32 elements along each GEMM's reduction, on Blackwell's tensor cores (SM100;
  the converter refuses anything older). Its converter swaps every linear, the head included, and torchao asserts
  that each cast dimension divides by 32: a linear's widths and the tokens of a micro-batch. ``mx_mm`` saves its
  input and weight in high precision, as float8 does: what a linear keeps is the bf16 linear's. A cast is one
  pass (the blocks' amaxes are local): a read of the 16-bit tensor, a one-byte write and a scale byte a block.
- **Tensor parallelism.** torchtitan 0.3 builds its float8 linears and then shards them as it shards bf16 ones
  (no float8 all-gather): each keeps what the sharded bf16 linear keeps, and a cast whose amax reduces over a
  sharded dimension all-reduces it (headroom.core.timing.comm, ``_float8_amax_calls``). Both measured on two
  gloo ranks: rowwise under sequence parallelism, tensorwise without (tests/test_distributed_memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from headroom.core.errors import ConfigError
from headroom.core.specs.precision import get_precision

ALIGNMENT = 16
"""A converted linear's input and output widths divide by this (torchtitan's ``module_filter_fn``)."""


@dataclass(frozen=True, slots=True)
class Float8Recipe:
    name: str
    torchao_recipe: str
    """``Float8LinearConfig.from_recipe_name``'s name: ``tensorwise`` (one scale per tensor) or ``rowwise`` (one
    per row of each GEMM's reduction). The two keep the same tensors and are priced alike (their casts move the
    same bytes)."""
    stacks: tuple[str, ...]
    """Stacks that run it: the agent's decoder (reference), and torchtitan's converter where it offers it."""
    summary: str
    stacks_note: str = ""
    """Why the other stacks do not run it, where one would expect them to."""
    block: int = 0
    """Elements a scale covers along a GEMM's reduction (MX formats: 32); 0: torchao float8's per-tensor or
    per-row scales."""

    @property
    def converts_head(self) -> bool:
        """The head runs in float8 too (torchtitan's MX converter swaps every linear; its float8 recipes skip it)."""
        return self.block > 0

    def converts(self, in_features: int, out_features: int) -> bool:
        """Does the recipe convert a linear of these widths? float8: both divide by 16 (torchtitan's filter);
        MX: every linear (`mx_misfits` refuses a model with one whose widths do not divide by its blocks)."""
        return self.block > 0 or (in_features % ALIGNMENT == 0 and out_features % ALIGNMENT == 0)


FLOAT8_RECIPES: dict[str, Float8Recipe] = {
    r.name: r
    for r in (
        Float8Recipe("torchao-tensorwise", "tensorwise", ("reference",),
                     "torchao float8, one dynamic scale per tensor",
                     "torchtitan 0.3's Float8LinearConverter offers the rowwise recipes only"),
        Float8Recipe("torchao-rowwise", "rowwise", ("reference", "torchtitan"),
                     "torchao float8, one dynamic scale per row; torchtitan's default"),
        Float8Recipe("torchao-mxfp8", "mxfp8", ("reference", "torchtitan"),
                     "torchao MXFP8, one scale per block of 32, Blackwell only", block=32),
    )
}
OFF = "off"
FP8_CHOICES = (OFF, *FLOAT8_RECIPES)
AUTO = "auto"
"""A plan's ``--fp8 auto``: the planner tries each recipe (headroom.core.planning.planner.PlanRequest.fp8_search)."""


def get_float8(name: str) -> Float8Recipe | None:
    """The recipe called ``name``, or None for ``off``."""
    if name == OFF:
        return None
    try:
        return FLOAT8_RECIPES[name]
    except KeyError:
        raise ConfigError(f"unknown fp8 recipe {name!r}; valid: {', '.join(FP8_CHOICES)}") from None


def needs_fsdp(precision: str, fp8: str) -> bool:
    """Does ``fp8`` run beside ``precision`` only under FSDP's mixed precision (an autocast recipe, refused without
    FSDP)? A search then holds zero 3 (headroom.core.planning.layout_search.pinned_layout)."""
    return fp8 not in (OFF, AUTO) and get_precision(precision).autocast


def mx_misfits(recipe: Float8Recipe, widths: dict[str, int]) -> list[str]:
    """Those of ``widths`` (a name -> a dimension an MX cast blocks) that do not divide by the recipe's block:
    torchao asserts they do."""
    if not recipe.block:
        return []
    return [f"{name} {width:,}" for name, width in widths.items() if width % recipe.block]
