"""The flags of a training configuration, declared once for ``estimate``, ``plan`` and ``agent train``.

Each flag maps to a field of headroom.core.specs.config.TrainConfig or headroom.core.specs.layout.Layout;
`train_config` builds the configuration back from parsed arguments.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import fields, replace
from typing import Any, Literal

from headroom.cli.hf_fetch import resolve
from headroom.core.errors import ConfigError
from headroom.core.planning.ask import DEFAULT_SEQ_LEN
from headroom.core.specs.config import ATTENTIONS, TrainConfig
from headroom.core.specs.float8 import AUTO, FLOAT8_RECIPES, FP8_CHOICES, OFF
from headroom.core.specs.layout import (
    CP_COMMS,
    EP_COMMS,
    MULTI_CHUNK,
    SCHEDULES,
    SWITCHES,
    Layout,
)
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.precision import (
    LIGHTEST,
    OPTIMIZER_STATE_BYTES,
    PRECISIONS,
    SEARCHED,
)
from headroom.core.specs.recompute import POLICY_MEANINGS, POLICY_NAMES, parse_policy
from headroom.core.specs.stack import FORMER_NAMES, STACKS

Many = Literal["one", "list", "none"]
LAYOUT_AXES = ("tp", "pp", "cp", "dp")
NEGATIVE_VALUE = re.compile(r"^-\.?[0-9]")
"""What argparse should read as a flag's value, not as an option: a minus sign and a number, with or without
a unit (``--budget -5GB``, ``--dropout -1e-3``). Python 3.11's argparse reads only bare integers and decimals
so (``-5GB`` became "expected one argument", which names no valid value); 3.13's reads what this does. No
option of these commands starts with a digit."""


def add_train_flags(parser: argparse.ArgumentParser, *, micro_batch: Many = "one", recompute: Many = "one",
                    layout: Literal["fixed", "free", "none"] = "fixed", precision_default: str | None = "amp-bf16",
                    fp8: Literal["none", "one", "auto"] = "one", training: Any = None, axes: Any = None,
                    stack_default: str = "reference") -> None:
    """Add the training-configuration flags, in the ``training`` and ``axes`` argument groups (else the parser).

    ``micro_batch`` / ``recompute``: one value, a comma-separated list (the agent's sweep), or no flag
    (the planner chooses). ``layout``: ``fixed`` (every axis defaults to 1), ``free`` (an axis left
    out is the planner's to choose; ``--tp 2`` pins it) or ``none`` (single device). A value that starts
    with a minus sign and a digit reaches its flag's own check (`NEGATIVE_VALUE`).
    """
    parser._negative_number_matcher = NEGATIVE_VALUE  # argparse's own attribute; inert on versions without it
    p = training or parser
    p.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help=f"tokens per sequence (default {DEFAULT_SEQ_LEN})")
    if micro_batch == "one":
        p.add_argument("--micro-batch", type=int, default=1, help="sequences per forward/backward pass per rank (default 1)")
    elif micro_batch == "list":
        p.add_argument("--micro-batch", default="1", help="micro-batch size(s), comma-separated (default 1)")
    policies = "|".join(POLICY_NAMES) + " (see the policies below)"
    if recompute == "one":
        p.add_argument("--recompute", default="none", help=f"activation checkpointing: {policies} (default none)")
    elif recompute == "list":
        p.add_argument("--recompute", default="none", help=f"checkpoint policy(ies), comma-separated: {policies} (default none)")
    searched = [SEARCHED] if fp8 == "auto" else []  # the planner's commands search recipes
    p.add_argument("--precision", default=precision_default, choices=[*PRECISIONS, *searched],
                   help="precision recipe (default " + (precision_default or "amp-bf16 on a GPU, fp32 on a CPU") + ")"
                   + ("; auto tries each the hardware computes in, with and without each fp8 recipe the stack runs"
                      if searched else ""))
    if fp8 != "none":
        choices = [*FP8_CHOICES, *([AUTO] if fp8 == "auto" else [])]
        p.add_argument("--fp8", default="off", choices=choices,
                       help="FP8 recipe of the linears: " + "; ".join(
                           f"{r.name} ({r.summary}; {' and '.join(r.stacks)} stack{'s' if len(r.stacks) > 1 else ''})"
                           for r in FLOAT8_RECIPES.values())
                       + ("; auto tries each the stack runs, on GPUs with fp8 units" if fp8 == "auto" else "")
                       + " (default off; needs a bf16 recipe, or for torchao's amp-bf16 with --zero 3)")
        p.add_argument("--fp8-param-gather", default="off", choices=["on", "off"],
                       help="Megatron-LM's --fp8-param-gather under a Transformer Engine recipe: the block weights "
                            "held in fp8 (the distributed optimizer keeps their fp32 master; --zero 1 or more) and "
                            "all-gathered in fp8 (default off)")
        p.add_argument("--first-last-layers-bf16", default="off", choices=["on", "off"],
                       help="Megatron-LM's --first-last-layers-bf16 under --fp8 te-current or te-mxfp8: the model's "
                            "first and last blocks run in bf16, outside the recipe, as Megatron-Bridge's current-scaling "
                            "recipe sets it (default off)")
    if fp8 != "none":  # the planner's and the estimate's commands
        p.add_argument("--compile", default="off", choices=["on", "off"],
                       help="each block compiled with torch.compile, as torchtitan's --compile.enable (reference and "
                            "torchtitan stacks, llama blocks, recompute none or full): what inductor keeps for "
                            "backward, measured on the CPU; the step priced as eager (default off)")
    p.add_argument("--optimizer", default="adamw", choices=list(OPTIMIZER_STATE_BYTES), help="optimizer (default adamw)")
    p.add_argument("--attention", default="flash", choices=ATTENTIONS,
                   help="flash (fused SDPA) or standard (materialises s x s scores); default flash")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability, gpt blocks only (default 0)")
    p.add_argument("--capacity-factor", type=float, default=None,
                   help="a mixture of experts' expert capacity: each expert takes at most ceil(t k / E x C) of a "
                        "micro-batch's t tokens, drops the rest and is padded to that many (Megatron-LM's "
                        "--moe-expert-capacity-factor with padding); 0 is dropless (default: dropless)")
    p.add_argument("--stack", default="reference", choices=list(STACKS), type=lambda name: FORMER_NAMES.get(name, name),
                   help="training stack whose kernels and checkpointing apply: "
                        + "; ".join(f"{s.name} ({s.summary})" for s in STACKS.values()) + f" (default {stack_default})")
    if layout == "none":
        return
    p = axes or parser
    free = layout == "free"
    what = {"tp": "tensor-parallel ranks", "pp": "pipeline stages", "cp": "context-parallel ranks (ring attention)",
            "dp": "data-parallel ranks"}
    for axis in LAYOUT_AXES:
        p.add_argument(f"--{axis}", type=int, default=None if free else 1,
                       help=f"{what[axis]} (default " + ("chosen by the planner" if free else "1") + ")")
    p.add_argument("--zero", type=int, default=None if free else 0, choices=(0, 1, 2, 3),
                   help="sharding stage over dp ranks: 0 none, 1 optimizer, 2 +grads, 3 +params (FSDP) (default "
                   + ("chosen by the planner" if free else "0") + ")")
    p.add_argument("--sp", default=None if free else "off", choices=("on", "off"),
                   help="sequence parallelism between tensor-parallel ranks, needs tp > 1 (default "
                   + ("chosen by the planner" if free else "off") + ")")
    p.add_argument("--ep", type=int, default=None if free else 1,
                   help="expert-parallel ranks of a mixture of experts, taken from the dp x cp ranks: each holds "
                   "1/ep of the routed experts (default " + ("chosen by the planner" if free else "1") + ")")
    p.add_argument("--cp-comm", default=None, choices=CP_COMMS,
                   help="cp > 1: how ranks exchange keys and values: ring (passed rank to rank, each hop beside a "
                        "chunk's attention) or all-gather (gathered once a layer) (default: the stack's; torch's "
                        "context parallelism gathers, under reference, torchtitan and hf; megatron passes them, "
                        "its --cp-comm-type p2p)")
    p.add_argument("--tp-overlap", default=None, choices=("on", "off"),
                   help="tp with --sp on: run each block's tensor-parallel all-gathers and reduce-scatters beside the "
                        "GEMMs they feed (megatron's --tp-comm-overlap, torchtitan's async TP under torch.compile) "
                        "(default off, as in every stack)")
    p.add_argument("--ep-overlap", default=None, choices=("on", "off"),
                   help="ep > 1: run one micro-batch's expert all-to-alls beside another's compute (megatron's "
                        "--overlap-moe-expert-parallel-comm, its combined 1F1B: no full or every-K recompute, a "
                        "16-bit model) (default off, as in every stack)")
    p.add_argument("--ep-comm", default=None, choices=EP_COMMS,
                   help="ep > 1: how expert-parallel ranks send tokens to their experts across nodes: all-to-all "
                        "(each token's k copies to their ranks), deepep or hybridep (each token once to each other "
                        "node its experts are on, then over NVLink; megatron's flex dispatcher, torchtitan's "
                        "moe_comm_backend) (default all-to-all, as in every stack)")
    p.add_argument("--reshard-after-forward", type=reshard_value, default=None, metavar="true|false|K",
                   help="FSDP (zero 3): free each unit's gathered parameters after its forward (true), keep them to "
                        "its backward (false), or keep a shard over K ranks, gathered again over those K in backward "
                        "(default: the stack's; torchtitan keeps them under a pipeline, every stack frees them "
                        "otherwise)")
    p.add_argument("--defer-gradient-sync", default=None, choices=("on", "off"),
                   help="zero 0 and 3 (and the reference stack's zero 1, DDP): reduce the gradients once per step, "
                        "in the last micro-batch's backward (on), or every micro-batch (off) (default: the stack's; "
                        "megatron and hf defer, reference and torchtitan only under a pipeline)")
    p.add_argument("--overlap-grad-reduce", default=None, choices=("on", "off"),
                   help="zero 0-2: reduce the gradients while backward runs (on) or after it (off) (default: the "
                        "stack's; megatron after, as Megatron-LM without --overlap-grad-reduce; the others beside)")
    p.add_argument("--overlap-param-gather", default=None, choices=("on", "off"),
                   help="zero 1-2: gather the updated parameters during the next forward (on) or after the "
                        "optimizer step (off) (default: the stack's; megatron after, as Megatron-LM without "
                        "--overlap-param-gather; the others during)")
    p.add_argument("--schedule", default="1f1b", choices=SCHEDULES,
                   help="pipeline schedule: 1f1b, interleaved (Megatron's and torch's interleaved 1F1B), gpipe, or "
                        "zbv (zero-bubble ZB-V, torch's ScheduleZBVZeroBubble: reference and torchtitan) "
                        "(default 1f1b)")
    p.add_argument("--virtual-stages", type=int, default=None,
                   help="model chunks per pipeline rank under --schedule interleaved (default 2 there; zbv: 2; "
                        "else 1)")
    p.add_argument("--stage-layers", type=stage_layers_value, default=None, metavar="N,N,...",
                   help="blocks on each pipeline stage, first to last, e.g. 7,8,8,7 (1f1b, gpipe, and interleaved "
                        "with each count divisible by --virtual-stages; sets --pp to their count) (default: the stack's split: torchtitan counts the embedding and the head "
                        "as a block each, the others split evenly, and where the layers do not divide the planner "
                        "splits them as torchtitan does)")


def reshard_value(text: str) -> bool | int:
    """``--reshard-after-forward``: true, false or a number of ranks (Layout checks the number)."""
    word = text.strip().lower()
    if word in ("true", "on", "yes"):
        return True
    if word in ("false", "off", "no"):
        return False
    try:
        return int(word)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not true, false or a number of ranks") from None


def stage_layers_value(text: str) -> tuple[int, ...]:
    """``--stage-layers``: comma-separated counts of blocks (Layout checks them against pp and the model)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of block counts, e.g. 7,8,8,7") \
            from None


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    """``--model`` resolved (headroom.core.specs.presets.resolve_model; a hub id the cache lacks fetched, headroom.cli.hf_fetch), at
    ``--capacity-factor`` when given."""
    spec = resolve(args.model)
    factor = getattr(args, "capacity_factor", None)
    if factor is None:
        return spec
    if not spec.is_moe:
        raise ConfigError(f"--capacity-factor {factor:g}: {spec.name} has no experts to cap; leave the flag out")
    return replace(spec, capacity_factor=factor)


def pinned_axes(args: argparse.Namespace) -> frozenset[str]:
    """Layout fields the flags set explicitly (under ``layout="free"`` the others are None)."""
    pinned = {f.name for f in fields(Layout) if f.name != "schedule" and getattr(args, f.name, None) is not None}
    if getattr(args, "schedule", "1f1b") != "1f1b":  # a default, not None: pinned when another is given
        pinned.add("schedule")
    return frozenset(pinned)


def layout_from_args(args: argparse.Namespace, **defaults: object) -> Layout:
    """The one layout the flags give; an axis the flags leave free takes ``defaults`` (else the Layout default).
    A pipeline schedule asked for without a pipeline is refused: nothing would run it, and an export would carry
    it (Megatron's virtual-pipeline flag on one stage)."""
    layout = Layout(**layout_values(args, **defaults))  # type: ignore[arg-type]
    asked = [f"--schedule {args.schedule}"] if getattr(args, "schedule", "1f1b") != "1f1b" else []
    asked += [f"--virtual-stages {args.virtual_stages}"] if getattr(args, "virtual_stages", None) not in (None, 1) else []
    if layout.pp == 1 and asked:
        raise ConfigError(f"{' '.join(asked)} schedules a pipeline, and there is none (pp 1): add --pp 2 or more, "
                          "or leave the schedule out")
    return layout


def layout_values(args: argparse.Namespace, **defaults: object) -> dict[str, object]:
    """The Layout fields the flags set, and ``defaults`` for those they leave free; the virtual stages of a
    schedule of several chunks a rank (interleaved, zbv) left free are 2, whatever ``defaults`` says."""
    values: dict[str, object] = {}
    if getattr(args, "virtual_stages", None) is None and getattr(args, "schedule", None) in MULTI_CHUNK:
        values["virtual_stages"] = 2
    for f in fields(Layout):
        raw = getattr(args, f.name, None)
        if f.name in SWITCHES and raw is not None:
            raw = raw == "on"
        if raw is not None:
            values[f.name] = raw
        elif f.name in defaults and f.name not in values:
            values[f.name] = defaults[f.name]
    stages = values.get("stage_layers")
    if stages is not None and values.get("pp", 1) == 1:  # the stages' count, unless pp says otherwise
        values["pp"] = len(stages)
    return values


def train_config(args: argparse.Namespace, *, precision: str | None = None, micro_batch: int | None = None,
                 recompute: str | None = None, layout: Layout | None = None) -> TrainConfig:
    """The TrainConfig the flags give; keyword arguments override a flag (one value of a swept list)."""
    micro = micro_batch if micro_batch is not None else getattr(args, "micro_batch", 1)
    policy = recompute if recompute is not None else getattr(args, "recompute", "none")
    if not isinstance(micro, int):
        raise ConfigError(f"--micro-batch {micro!r} is not one integer")
    fp8 = getattr(args, "fp8", OFF)  # auto: the planner's to try (PlanRequest.fp8_search)
    precision = precision or args.precision  # auto: the planner's to try, from the lightest (PlanRequest.precision_search)
    return TrainConfig(
        seq_len=args.seq_len, micro_batch=micro, precision=LIGHTEST if precision == SEARCHED else precision,
        optimizer=args.optimizer, fp8=OFF if fp8 == AUTO else fp8,
        fp8_param_gather=_fp8_param_gather(args, fp8), compile=getattr(args, "compile", "off") == "on",
        first_last_bf16=_first_last_bf16(args, fp8),
        attention=args.attention, dropout=args.dropout, recompute=parse_policy(policy), stack=args.stack,
        layout=layout if layout is not None else (layout_from_args(args) if hasattr(args, "dp") else Layout()),
    )


def _fp8_flag(args: argparse.Namespace, name: str, fp8: str, refused: str, why: str) -> bool:
    """An on/off flag of the FP8 recipe (``name``, its dest), on; refused with ``why`` beside ``--fp8 refused``."""
    if getattr(args, name, "off") == "off":
        return False
    if fp8 == refused:
        raise ConfigError(why)
    return True


def _first_last_bf16(args: argparse.Namespace, fp8: str) -> bool:
    """``--first-last-layers-bf16 on``: refused beside ``--fp8 auto``, whose recipes it does not all apply to."""
    return _fp8_flag(args, "first_last_layers_bf16", fp8, AUTO,
                     "--first-last-layers-bf16 on applies to --fp8 te-current and te-mxfp8 alone, and --fp8 auto "
                     "searches other recipes too: give --fp8 te-current or te-mxfp8")


def _fp8_param_gather(args: argparse.Namespace, fp8: str) -> bool:
    """``--fp8-param-gather on``: refused beside ``--fp8 off``, where no weight is in fp8 to gather."""
    return _fp8_flag(args, "fp8_param_gather", fp8, OFF,
                     "--fp8-param-gather on holds the weights of an FP8 recipe in fp8, and --fp8 is off: use --fp8 "
                     "te-delayed, te-current or auto")


POLICIES_HELP = "checkpoint policies (--recompute):\n" + "\n".join(
    f"  {name}: {meaning}" for name, meaning in POLICY_MEANINGS.items())
"""The epilog of every command that takes --recompute: each policy defined."""
