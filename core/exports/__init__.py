"""A recommendation as settings to paste into a training framework.

One module per framework; ``export(fmt, request, best)`` returns an `Export`: the text, in the
framework's own format (it parses as that format with no pre-processing), and
the notes: one sentence for each thing the format cannot express, naming the
setting written instead and which way it moves memory or time. Every exporter
carries the candidate's layout (tp, sp, pp and its schedule, cp, dp and the
ZeRO stage), batch, precision, optimizer and checkpoint policy.

=============  =========================  =============  =========
format         what                       module         notes in
=============  =========================  =============  =========
``hf``         TrainingArguments (Py)     `huggingface`  comments
``torchtitan`` 0.3 launch command (bash)  `torchtitan`   comments
``megatron``   Megatron-LM arguments      `megatron`     ``notes``
``deepspeed``  ds_config.json             `deepspeed`    ``notes``
``lightning``  Trainer + strategy (Py)    `lightning`    comments
=============  =========================  =============  =========

Where a format has comments the text carries the notes too (``notes_in_text``);
otherwise show ``notes`` beside it (the CLI prints them to stderr).
`run`         holds what every writer shares: the plan reduced
to a `Run`, and the `Export` each writer returns.
"""

from __future__ import annotations

from collections.abc import Callable

from headroom.core.errors import ConfigError
from headroom.core.exports.deepspeed import UNEXPRESSED as DEEPSPEED_UNEXPRESSED
from headroom.core.exports.deepspeed import deepspeed
from headroom.core.exports.huggingface import UNEXPRESSED as HF_UNEXPRESSED
from headroom.core.exports.huggingface import huggingface
from headroom.core.exports.lightning import UNEXPRESSED as LIGHTNING_UNEXPRESSED
from headroom.core.exports.lightning import lightning
from headroom.core.exports.megatron import megatron
from headroom.core.exports.run import Export, Run
from headroom.core.exports.torchtitan import torchtitan
from headroom.core.planning.planner import Candidate, PlanRequest
from headroom.core.specs.stack import STACKS

__all__ = ["EXPORTERS", "UNEXPRESSED_AXES", "Export", "export", "export_stack", "fp8_refusal"]

EXPORTERS: dict[str, Callable[[Run], Export]] = {
    "hf": huggingface,
    "torchtitan": torchtitan,
    "megatron": megatron,
    "deepspeed": deepspeed,
    "lightning": lightning,
}


UNEXPRESSED_AXES: dict[str, tuple[str, ...]] = {
    "hf": HF_UNEXPRESSED, "torchtitan": (), "megatron": (), "deepspeed": DEEPSPEED_UNEXPRESSED,
    "lightning": LIGHTNING_UNEXPRESSED,
}
"""The layout axes each format cannot carry (its export notes them): ``plan --export FORMAT`` searches them at 1."""


EXPORT_STACKS = {"deepspeed": "hf"}
"""Formats that run the stack of another name: DeepSpeed's ZeRO-1 and 2 are the hf stack's, call for call
(headroom.core.specs.stack.Stack.deepspeed_zero), where the reference stack's are torch's own."""


def export_stack(fmt: str) -> str | None:
    """The training stack a format is, where Headroom has one of its name (torchtitan, megatron, hf) or runs its
    ZeRO (deepspeed: hf, `EXPORT_STACKS`): ``plan --export FORMAT`` plans on it unless ``--stack`` says otherwise."""
    return EXPORT_STACKS.get(fmt, fmt if fmt in STACKS else None)


FP8_UNEXPRESSED = {
    "hf": "the HF Trainer's TrainingArguments have no float8 linear conversion (Accelerate's own FP8 recipes are "
          "not modelled)",
    "deepspeed": "a DeepSpeed config has no float8 linear conversion (its FP8 is Transformer Engine's, in the model's "
                 "code)",
    "lightning": "Lightning's FP8 precision is Transformer Engine's over its own module swap "
                 "(precision=\"transformer-engine\"), which is not modelled",
}
"""Formats that cannot carry an FP8 recipe, and why: an export of a plan that uses one is refused, as is torchtitan's
of a recipe its converter does not offer."""


def export(fmt: str, request: PlanRequest, best: Candidate) -> Export:
    """``best`` (a candidate of ``request``'s plan, on its own layout) as ``fmt``'s settings and notes. A format
    that cannot carry the candidate's FP8 recipe refuses it (`FP8_UNEXPRESSED`)."""
    try:
        writer = EXPORTERS[fmt]
    except KeyError:
        raise ConfigError(f"unknown export format {fmt!r}; valid: {', '.join(EXPORTERS)}") from None
    if (reason := fp8_refusal(fmt, best)) is not None:
        recipe = best.config.float8
        other = next((f" or export it with --export {stack}" for stack in ("torchtitan", "megatron")
                      if stack in recipe.stacks), "")
        raise ConfigError(f"--export {fmt} of a plan with --fp8 {recipe.name}: {reason}; plan with --fp8 off{other}")
    return writer(Run.of(request, best))


def fp8_refusal(fmt: str, best: Candidate) -> str | None:
    """Why ``fmt`` cannot carry ``best``'s FP8 recipe, or None (no recipe, or one the format carries: torchtitan's
    converter recipes, Megatron-LM's Transformer Engine ones)."""
    recipe = best.config.float8
    if recipe is None or (fmt not in FP8_UNEXPRESSED and fmt in recipe.stacks):
        return None
    if fmt == "megatron":
        return ("Megatron-LM trains FP8 with Transformer Engine (--fp8-format, --fp8-recipe), not torchao's "
                "float8 linears")
    if fmt == "torchtitan" and recipe.saves_fp8:
        return "torchtitan converts linears with torchao, not Transformer Engine"
    return FP8_UNEXPRESSED.get(fmt) or recipe.stacks_note
