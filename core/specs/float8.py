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

Transformer Engine's FP8 (Megatron-LM ``--fp8-format hybrid``: e4m3 forward, e5m2 gradients; ``--fp8-recipe
delayed`` is TE's ``DelayedScaling``, ``--fp8-recipe tensorwise`` its ``Float8CurrentScaling``; megatron-core's
``TransformerConfig.fp8_recipe``; Transformer Engine 2.x, ``transformer_engine/pytorch/module/linear.py`` and
``layernorm_linear.py``):

- **Conversion.** Inside ``fp8_autocast`` every Transformer Engine linear of the blocks runs its three GEMMs in
  fp8: the fused norm-and-projection (``TELayerNormColumnParallelLinear``: q/k/v, fc1) and the row-parallel
  ones (the attention's output, fc2). The head is Megatron's own ``ColumnParallelLinear``, outside
  ``fp8_autocast``: bf16. TE refuses a linear whose input's last width does not divide by 16 or whose rows
  do not divide by 8 (``assert_dim_for_fp8_exec``): refused here too.
- **What backward keeps.** Unlike torchao, TE saves the *fp8* input: ``_Linear.forward`` quantizes it and keeps
  only the column-wise (transposed) copy its weight-gradient GEMM reads ("Discard row-wise data since it is not
  needed in backward pass"), one byte an element; under sequence parallelism a column-parallel linear keeps its
  sharded row-wise copy and all-gathers it again, in fp8, in backward (Float8 quantizers support "only rowwise
  all-gather"). The norm fused into q/k/v and fc1 writes that copy itself (``apply_normalization`` with the
  input quantizer); its 16-bit output is never kept. The attention core still keeps its bf16 output, so the
  output projection's fp8 copy comes in addition; fc2's replaces the bf16 SwiGLU output.
- **Weights.** The fp8 copy of each weight, row-wise for forward and column-wise for the input gradient (Hopper's
  fp8 GEMMs take TN operands only), is made on a step's first micro-batch and cached on the module for the rest
  (``is_first_microbatch``, which Megatron's TE wrappers pass; ``_fp8_workspaces["weight"]``): two bytes a
  weight element for the whole run, beside the bf16 parameter. (``--fp8-param-gather``, which NeMo's recipes
  set, keeps the parameters themselves in fp8 instead: not modelled.)
- **Scales.** Delayed scaling keeps, per linear, an amax history of Megatron's ``--fp8-amax-history-len``
  (default 1) for each of its three forward tensors (input, weight, output) and two backward ones, and a
  scale per tensor, all fp32 (``DelayedScalingRecipeState``, ``transformer_engine/pytorch/quantization.py``):
  a few bytes a linear, counted. Current scaling keeps
  none: each cast takes its tensor's own amax first.
- **Casts.** Delayed: one pass reading the 16-bit tensor and writing its fp8 row- and column-wise copies (the
  amax for the next step's scale is taken in the same kernel), none for the norm-fed inputs (the norm writes
  them). Current: the same, after a pass reading the tensor for its amax, the norm-fed inputs included; under
  sequence parallelism that amax is all-reduced over the tensor-parallel ranks (a scalar a column-parallel
  linear, ``set_quantizer_amax_reduction_group``). Backward casts the output's gradient once, row- and
  column-wise together; the saved input and the cached weight are not cast again. The weights are cast once a
  step (their first micro-batch), priced with the optimizer's step.
- **MXFP8** (``te-mxfp8``: Megatron ``--fp8-format e4m3 --fp8-recipe mxfp8``, TE's ``MXFP8BlockScaling``,
  Megatron-Bridge's ``bf16_with_mxfp8_mixed``; Blackwell only): e4m3 throughout, one e8m0 scale byte a block of 32
  along each GEMM's reduction (``MXFP8Quantizer``, transformer_engine/pytorch/tensor/mxfp8_tensor.py). The same
  linears and the same fp8 copies as current scaling, each with its scales, padded as ``get_scale_shape`` pads
  them (row-wise [rows to 128, cols / 32 to 4], column-wise [rows / 32 to 4, cols to 128]): the saved input's
  column-wise copy, and under sequence parallelism the local shard's column-wise copy, all-gathered as it is in
  backward ("For MXFP8, columnwise only data can be allgathered", layernorm_linear.py); the cached weight's two
  copies. A cast is one pass (the blocks' amaxes are local), writing the row- and column-wise copies with their
  scales; no amax is all-reduced. Both dimensions a cast blocks divide by 32 (``MXFP8Quantizer.is_quantizable``):
  refused otherwise. Under ``--fp8-param-gather`` the parameters are MXFP8 tensors, the two copies and their
  scales with no 16-bit weight beside them, updated in bf16 into the parameter buffer the gradient buffer
  shares (``reuse_grad_buf_for_mxfp8_param_ag``), gathered in bf16 and cast after
  (megatron/core/distributed/param_and_grad_buffer.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
    same bytes). Empty for Transformer Engine's recipes."""
    stacks: tuple[str, ...]
    """Stacks that run it: the agent's decoder (reference), and torchtitan's converter where it offers it."""
    summary: str
    stacks_note: str = ""
    """Why the other stacks do not run it, where one would expect them to."""
    block: int = 0
    """Elements a scale covers along a GEMM's reduction (MX formats: 32); 0: torchao float8's per-tensor or
    per-row scales."""
    library: Literal["torchao", "transformer-engine"] = "torchao"
    """Whose linears: torchao's (kept inputs in 16 bits, weights cast every micro-batch) or Transformer Engine's
    (kept inputs in fp8, weights cast once a step and cached)."""
    megatron_recipe: str = ""
    """Megatron-LM's ``--fp8-recipe`` for a Transformer Engine recipe."""
    megatron_format: str = "hybrid"
    """Megatron-LM's ``--fp8-format`` for it: ``hybrid`` (e4m3 forward, e5m2 gradients), MXFP8's ``e4m3``."""

    @property
    def saves_fp8(self) -> bool:
        """Backward keeps a converted linear's input as its fp8 copy (Transformer Engine), not in 16 bits."""
        return self.library == "transformer-engine"

    @property
    def delayed(self) -> bool:
        """Scales come from an amax history (Transformer Engine's delayed scaling), not each tensor's own amax."""
        return self.megatron_recipe == "delayed"

    @property
    def te_cast_reads(self) -> int:
        """Passes a Transformer Engine cast reads its tensor in: its amax, then the cast (current scaling), or the
        cast alone (delayed scaling takes the amax for the next step in the same kernel; MXFP8's amaxes are its
        blocks')."""
        return 1 if self.delayed or self.block else 2

    @property
    def reduces_amax(self) -> bool:
        """Each cast of a sharded tensor all-reduces its amax over the tensor-parallel ranks (Transformer Engine's
        current scaling), where no history (delayed) or local block (MXFP8) gives its scale."""
        return self.saves_fp8 and not self.delayed and not self.block

    @property
    def converts_head(self) -> bool:
        """The head runs in float8 too (torchtitan's MX converter swaps every linear; its float8 recipes skip it,
        and Megatron-LM's head is not a Transformer Engine linear)."""
        return self.block > 0 and not self.saves_fp8

    def converts(self, in_features: int, out_features: int) -> bool:
        """Does the recipe convert a linear of these widths? float8: both divide by 16 (torchtitan's filter);
        MX and Transformer Engine: every linear (`mx_misfits` and `te_misfits` refuse a model with one they
        cannot run)."""
        return self.block > 0 or self.saves_fp8 or (in_features % ALIGNMENT == 0 and out_features % ALIGNMENT == 0)


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
        Float8Recipe("te-delayed", "", ("megatron",),
                     "Transformer Engine delayed scaling, Megatron's --fp8-recipe delayed",
                     "Megatron-LM runs it through Transformer Engine",
                     library="transformer-engine", megatron_recipe="delayed"),
        Float8Recipe("te-current", "", ("megatron",),
                     "Transformer Engine current scaling, Megatron's --fp8-recipe tensorwise",
                     "Megatron-LM runs it through Transformer Engine",
                     library="transformer-engine", megatron_recipe="tensorwise"),
        Float8Recipe("te-mxfp8", "", ("megatron",),
                     "Transformer Engine MXFP8, Megatron's --fp8-recipe mxfp8, one scale per block of 32, Blackwell "
                     "only", "Megatron-LM runs it through Transformer Engine", block=32,
                     library="transformer-engine", megatron_recipe="mxfp8", megatron_format="e4m3"),
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
    FSDP)? A search then holds zero 3 (headroom.core.planning.layout_search.pinned_layout). A searched precision
    (``auto``) holds nothing: the search drops the combinations a layout cannot run."""
    return fp8 not in (OFF, AUTO) and precision != AUTO and get_precision(precision).autocast


TE_WIDTH, TE_ROWS = 16, 8
"""Transformer Engine's fp8 GEMMs need each input's last width to divide by 16 and its rows by 8
(``assert_dim_for_fp8_exec``, transformer_engine/pytorch/utils.py); under MXFP8 both by its block of 32
(``MXFP8Quantizer.is_quantizable``)."""


def te_units(recipe: Float8Recipe) -> tuple[int, int]:
    """What a Transformer Engine recipe's input widths and rows divide by: (16, 8), or MXFP8's block both ways."""
    return (recipe.block, recipe.block) if recipe.block else (TE_WIDTH, TE_ROWS)


def mx_scale_bytes(rows: int, cols: int, rowwise: bool = True, columnwise: bool = True) -> int:
    """Bytes of Transformer Engine's MXFP8 scales (e8m0, a byte a block of 32) of a (rows x cols) tensor's row- and
    column-wise copies, padded as ``MXFP8Quantizer.get_scale_shape`` pads them: row-wise [rows to 128, cols / 32 to
    4], column-wise [rows / 32 to 4, cols to 128]."""
    def up(n: int, m: int) -> int:
        return -(-n // m) * m
    return (up(rows, 128) * up(cols // 32, 4) if rowwise else 0) + (up(rows // 32, 4) * up(cols, 128)
                                                                     if columnwise else 0)

AMAX_HISTORY = 1
"""Megatron-LM's default ``--fp8-amax-history-len``: the delayed-scaling history each fp8 tensor keeps."""
TE_FORWARD_TENSORS, TE_BACKWARD_TENSORS = 3, 2
"""Scaled tensors of a Transformer Engine linear's ``fp8_meta``: input, weight and output forward, the output's
and the input's gradient backward."""


def scaling_state_bytes(recipe: Float8Recipe, linears: int) -> int:
    """Bytes of ``linears`` Transformer Engine linears' delayed-scaling state: each scaled tensor's fp32 amax
    history and its scale (``DelayedScalingRecipeState``, forward and backward); none under current scaling or
    torchao, whose scales are each cast's own."""
    if not recipe.delayed:
        return 0
    return linears * (TE_FORWARD_TENSORS + TE_BACKWARD_TENSORS) * (AMAX_HISTORY + 1) * 4


def te_misfits(recipe: Float8Recipe, widths: dict[str, int], rows: int) -> list[str]:
    """What Transformer Engine would refuse of a block's linears: ``widths`` (a name -> the width a linear reads on
    a rank) that do not divide by 16, and ``rows`` (a micro-batch's tokens a linear reads on a rank) that do not
    divide by 8."""
    if not recipe.saves_fp8:
        return []
    width_unit, rows_unit = te_units(recipe)
    misfits = [f"{name} {width:,}" for name, width in widths.items() if width % width_unit]
    return misfits + ([f"row count {rows:,}"] if rows % rows_unit else [])


def mx_misfits(recipe: Float8Recipe, widths: dict[str, int]) -> list[str]:
    """Those of ``widths`` (a name -> a dimension an MX cast blocks) that do not divide by the recipe's block:
    torchao asserts they do (Transformer Engine's MXFP8: `te_misfits`)."""
    if not recipe.block or recipe.saves_fp8:
        return []
    return [f"{name} {width:,}" for name, width in widths.items() if width % recipe.block]
