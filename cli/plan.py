"""``headroom plan``: micro-batch, accumulation and checkpoint policy for a model, a batch and a budget."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace

from headroom.cli.nccl_tests import read_nccl_tests
from headroom.cli.network_file import read_network_file
from headroom.cli.search_status import SearchStatus
from headroom.cli.train_flags import (
    POLICIES_HELP,
    add_train_flags,
    layout_from_args,
    layout_values,
    model_from_args,
    pinned_axes,
    train_config,
)
from headroom.cli.wrap import wrap
from headroom.core.errors import ConfigError
from headroom.core.exports import (
    EXPORT_STACKS,
    EXPORTERS,
    UNEXPRESSED_AXES,
    export,
    export_stack,
)
from headroom.core.planning import search_work
from headroom.core.planning.advice import plan_and_advise
from headroom.core.planning.ask import DEFAULT_GPUS_PER_NODE, ONE_GPU, PlanAsk
from headroom.core.planning.dispatch_hint import dispatch_hint
from headroom.core.planning.layout_search import pinned_layout
from headroom.core.planning.planner import (
    NEAR,
    Candidate,
    Plan,
    PlanRequest,
    budget_note,
    budget_share,
    plan_to_dict,
    whole_device_budget,
)
from headroom.core.safe_text import printable, printable_lines
from headroom.core.specs.config import hf_stack_covers
from headroom.core.specs.float8 import AUTO, needs_fsdp
from headroom.core.specs.interconnect import (
    DEFAULT_INTER_NODE_LINK,
    LINKS_BY_KEY,
    MAX_GPUS_PER_NODE,
    NETWORK_EXAMPLE,
    NetworkSettings,
    intra_node_link,
    network,
)
from headroom.core.specs.precision import SEARCHED
from headroom.core.specs.recompute import POLICY_NAMES, parse_policy
from headroom.core.specs.stack import get_stack
from headroom.core.specs.stages import split_text_for
from headroom.core.timing.step import HardwareProfile
from headroom.core.units import GB, parse_budget
from headroom.db.hardware import resolve_hardware


def _checked_by(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse type that keeps the text once ``check`` takes it, and says why where it does not."""
    def value(text: str) -> str:
        try:
            check(text)
        except ConfigError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return text
    return value


def _gpus_per_node(text: str) -> int:
    """``--gpus-per-node``'s value: a node of 1 to MAX_GPUS_PER_NODE GPUs, checked when the flags are read (a plan
    on one GPU builds no cluster to check it)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of GPUs, got {text!r}") from None
    if not 0 < value <= MAX_GPUS_PER_NODE:
        raise argparse.ArgumentTypeError(f"a node holds 1 to {MAX_GPUS_PER_NODE:,} GPUs, got {value}")
    return value


_network = _checked_by(network)
"""``--interconnect``'s value, checked when the flags are read (a plan on one GPU never builds the network)."""
_link = _checked_by(intra_node_link)
"""``--intra-node``'s value: a link's key."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="recommend micro-batch, accumulation and checkpointing for a memory budget",
        description="For a model, a global batch and a per-GPU memory budget, rank every micro-batch x "
        "checkpoint policy by predicted tokens/s, explain the winner and every rejection. With --gpus N, search "
        "every tensor x pipeline x context x data-parallel layout and sharding stage of N GPUs (and expert "
        "parallelism for a mixture of experts); --tp/--pp/--cp/--dp/--zero/--sp/--ep pin an axis. Example: headroom plan --model llama3-70b --seq-len 8192 --global-batch 512 --gpus 64",
        epilog=POLICIES_HELP,
    )
    model = p.add_argument_group("model")
    model.add_argument("--model", required=True, help="preset name (see `headroom models`), a HuggingFace config.json, a model directory holding one, or a HuggingFace model id (org/name[@revision]: the local hub cache, else fetched)")
    training = p.add_argument_group("training", "the run the plan is for")
    batch = training.add_mutually_exclusive_group(required=True)
    batch.add_argument("--global-batch", type=int, help="sequences per optimizer step, all ranks together")
    batch.add_argument("--global-tokens", type=int, help="tokens per optimizer step, all ranks together (a multiple of --seq-len)")
    hardware = p.add_argument_group("hardware")
    hardware.add_argument("--hardware", default="h100-sxm", help="a device measured in the store (its name) or a datasheet key from `headroom hardware` (default h100-sxm)")
    hardware.add_argument("--budget", help="memory per GPU with its unit, e.g. 80GB, 80GiB, 81920MiB (GB = 1e9 bytes; a bare "
                                           "number is refused; default 80GB, or the device's memory where it has less)")
    hardware.add_argument("--db", help="result store URL for measured hardware and calibration (default: HEADROOM_DB or the default store)")
    layout = p.add_argument_group("layout", "with --gpus every layout of that many GPUs is searched and an axis given "
                                            "is pinned; without it, the one layout the axes give")
    layout.add_argument("--gpus", type=int, default=None, help="search every layout of this many GPUs (default: plan the one layout the flags give)")
    layout.add_argument("--gpus-per-node", type=_gpus_per_node, default=None,
                        help=f"GPUs joined by the node's own link, 1 to {MAX_GPUS_PER_NODE:,} (default: the "
                             f"--network file's, else {DEFAULT_GPUS_PER_NODE})")
    layout.add_argument("--interconnect", default=None, metavar="NETWORK", type=_network,
                        help=f"network between nodes: one of {', '.join(LINKS_BY_KEY)} (one NIC per GPU), or NICs x "
                             f"Gb/s a node ({NETWORK_EXAMPLE}); default: the GPU generation's network, ib-hdr for an "
                             "A100, ib-ndr for an H100, H200 or B200, roce-400g for an MI300X, roce-200g for an L40S "
                             f"or RTX 4090, else {DEFAULT_INTER_NODE_LINK}; see core/specs/interconnect.py for every "
                             "row's source")
    layout.add_argument("--intra-node", default=None, metavar="LINK", type=_link,
                        help=f"link between the GPUs of a node: one of {', '.join(LINKS_BY_KEY)} (default: the "
                             "card's own, e.g. nvlink4 for an H100 SXM, pcie5-x16 for an H100 PCIe)")
    layout.add_argument("--nccl-tests", action="append", default=[], metavar="[OP=]FILE",
                        help="nccl-tests' output (all_reduce_perf, all_gather_perf, reduce_scatter_perf, "
                             "alltoall_perf or sendrecv_perf): over one node's GPUs, the collective's measured times "
                             "replace the node's link for groups inside a node, and the store's curve for that "
                             "collective and group size; over several hosts, as many ranks on each, they replace the "
                             "network for groups across nodes, any size and ranks a node; OP= names the collective "
                             "where the output does not (all_reduce, all_gather, reduce_scatter, all_to_all, "
                             "send_recv); repeatable")
    layout.add_argument("--network", default=None, metavar="FILE",
                        help="a TOML file of the cluster's network: gpus_per_node, intra_node and interconnect, "
                             "each as the flag of that name takes it (e.g. interconnect = \"8x200g\"); a flag given "
                             "here wins over the file")
    add_train_flags(p, micro_batch="none", recompute="none", layout="free", fp8="auto", training=training, axes=layout,
                    stack_default="reference, or the stack --export names: torchtitan, megatron or hf (deepspeed: "
                                  "hf, whose ZeRO-1 and 2 are DeepSpeed's, where it covers the model)")
    pins = p.add_argument_group("configuration", "pin what the planner would choose, to evaluate a configuration "
                                                 "you already have")
    pins.add_argument("--micro-batch", type=int, default=None,
                      help="pin the micro-batch (sequences per forward/backward pass per rank; default: the planner "
                           "tries every one that divides the per-rank batch)")
    pins.add_argument("--accumulation", type=int, default=None,
                      help="pin the micro-batches per optimizer step (the micro-batch is then the per-rank batch over "
                           "it; default: chosen with the micro-batch)")
    pins.add_argument("--recompute", default=None,
                      help=f"pin the checkpoint policy, one of {', '.join(POLICY_NAMES)} (below; default: the planner "
                           "tries those the stack offers). With --micro-batch or --accumulation on one layout, the plan "
                           "evaluates exactly that configuration and reports it even when it does not fit")
    pins.add_argument("--offload", action="store_true", help="also consider offloading activations to host memory")
    output = p.add_argument_group("output")
    output.add_argument("--train-tokens", type=int, default=None,
                        help="tokens the whole run trains on: the plan adds its wall time and GPU-hours")
    output.add_argument("--gpu-hour-price", type=float, default=None,
                        help="price of one GPU-hour (any currency; needs --train-tokens): the plan adds the run's cost")
    output.add_argument("--exhaustive", action="store_true",
                        help="evaluate every layout and candidate of a search, not only those that could come within "
                             f"{NEAR:.0%}% of the fastest (the recommendation is the same; the layouts table then "
                             "gives every layout's fastest; several times slower)")
    output.add_argument("--top", type=int, default=5, help="candidates to show (default 5; JSON lists them all with --top 0)")
    output.add_argument("--trace", action="store_true",
                        help="also trace the recommendation (or the closest candidate) with HuggingFace transformers on "
                        "the meta device from the model's config.json and say whether it fits with the traced "
                        "activations (needs torch and transformers; --precision fp32 or a bf16 recipe; the "
                        "recommendation on one rank's whole model under none or full checkpointing)")
    output.add_argument("--json", action="store_true", help="print the JSON contract documented in README.md")
    output.add_argument("--export", choices=list(EXPORTERS), metavar="FORMAT",
                        help=f"print the recommendation as settings for {', '.join(EXPORTERS)}: a search then tries "
                             "only the layouts the format can express (the hf format no tp, pp, cp or ep; deepspeed "
                             "and lightning no pp, cp or ep: those axes stay at 1 unless given), and torchtitan, "
                             "megatron and hf plan on that stack unless --stack is given")
    p.set_defaults(handler=run, stack=None)


def global_batch(args: argparse.Namespace) -> int:
    if args.global_batch is not None:
        return args.global_batch
    if args.seq_len <= 0:
        raise ConfigError(f"seq-len must be a positive integer, got {args.seq_len}")
    if args.global_tokens <= 0:
        raise ConfigError(f"--global-tokens must be a positive number of tokens (a multiple of --seq-len "
                          f"{args.seq_len}), got {args.global_tokens}")
    if args.global_tokens % args.seq_len:
        raise ConfigError(
            f"--global-tokens {args.global_tokens} is not a multiple of --seq-len {args.seq_len}; "
            f"use {args.global_tokens // args.seq_len * args.seq_len} or {(args.global_tokens // args.seq_len + 1) * args.seq_len}"
        )
    return args.global_tokens // args.seq_len


def for_export(args: argparse.Namespace) -> tuple[argparse.Namespace, tuple[str, ...]]:
    """The flags as ``--export FORMAT`` plans them: on the stack of the format's name where Headroom has one and
    ``--stack`` is not given (else the reference stack), and, in a search, each layout axis the format cannot
    express (headroom.core.exports.UNEXPRESSED_AXES) held at 1 where the search would choose it; an axis given by
    hand is kept, and its export notes what it cannot carry. (The flags, the axes held.)"""
    resolved = argparse.Namespace(**vars(args))
    fmt = getattr(args, "export", None)
    if resolved.stack is None:
        resolved.stack = (export_stack(fmt) if fmt else None) or "reference"
    if not fmt or args.gpus is None:
        return resolved, ()
    implied = {"cp": ("cp_comm",), "ep": ("ep_comm", "ep_overlap"), "tp": ("tp_overlap", "sp")}
    held = tuple(axis for axis in UNEXPRESSED_AXES[fmt] if getattr(args, axis, None) is None
                 and not any(getattr(args, flag, None) not in (None, "off") for flag in implied.get(axis, ())))
    for axis in held:
        setattr(resolved, axis, 1)
    return resolved, held


def _held(args: argparse.Namespace, request: PlanRequest) -> tuple[str, ...]:
    """The axes ``--export`` held at 1 (`for_export`) that the search would have tried: expert parallelism only for
    a mixture of experts, tensor and pipeline parallelism only where the stack runs them."""
    stack = get_stack(request.train.stack)
    tried = {"ep": request.spec.is_moe, "tp": stack.tensor_parallel, "pp": stack.pipeline_parallel}
    return tuple(axis for axis in for_export(args)[1] if tried.get(axis, True))


def plan_ask(args: argparse.Namespace) -> PlanAsk:
    """The flags as the question every front end asks (headroom.core.planning.ask): None where a flag is left out."""
    args, _ = for_export(args)
    fsdp = needs_fsdp(args.precision, args.fp8)
    sharded = args.fp8_param_gather == "on"
    layout = pinned_layout(layout_values(args), fsdp, sharded) if args.gpus is not None \
        else layout_from_args(args, **ONE_GPU)
    given = read_network_file(args.network) if args.network is not None else NetworkSettings()
    gpus_per_node = args.gpus_per_node if args.gpus_per_node is not None else given.gpus_per_node
    return PlanAsk(
        global_batch=global_batch(args), train=train_config(args, micro_batch=1, recompute="none", layout=layout),
        budget_bytes=None if args.budget is None else parse_budget(args.budget), pinned=pinned_axes(args),
        gpus=args.gpus, gpus_per_node=DEFAULT_GPUS_PER_NODE if gpus_per_node is None else gpus_per_node,
        interconnect=args.interconnect or given.interconnect, intra_node=args.intra_node or given.intra_node,
        allow_offload=args.offload,
        micro_batch=args.micro_batch, accumulation=args.accumulation,
        recompute=None if args.recompute is None else parse_policy(args.recompute),
        train_tokens=args.train_tokens, gpu_hour_price=args.gpu_hour_price, fp8_search=args.fp8 == AUTO,
        precision_search=args.precision == SEARCHED,
    )


def plan_request(args: argparse.Namespace, profile: HardwareProfile, ask: PlanAsk | None = None) -> PlanRequest:
    """The planner's request the flags ask for on ``profile``'s hardware (``ask``: their question, where read).
    An export that plans on another format's stack (`EXPORT_STACKS`: deepspeed on hf) plans on the reference stack
    where that stack does not cover the model (hf: transformers' Llama modules only), unless --stack was given."""
    spec = model_from_args(args)
    ask = ask or plan_ask(args)
    if _borrowed_stack_refuses(args, spec, ask.train.stack):
        ask = replace(ask, train=replace(ask.train, stack="reference"))
    return ask.request(spec, profile)


def _borrowed_stack_refuses(args: argparse.Namespace, spec, stack: str) -> bool:
    fmt = getattr(args, "export", None)
    return args.stack is None and fmt in EXPORT_STACKS and stack == EXPORT_STACKS[fmt] \
        and get_stack(stack).transformers_modules and not hf_stack_covers(spec, stack)


def _recipe(req: PlanRequest, candidate: Candidate) -> str:
    """A candidate's searched recipes as the table shows them: "bf16-pure + te-current", "fp8 off"; "" where the
    plan searched none."""
    if not req.searches_recipes:
        return ""
    config = candidate.config
    fp8 = config.fp8 if config.float8 is not None else "fp8 off"
    return f"{config.precision} + {fp8}" if req.precision_search else fp8


NOTHING_FITS = 3
"""Exit status of a plan in which no candidate fits the budget (its advice says what would)."""


def run(args: argparse.Namespace) -> int:
    if args.top < 0:
        raise ConfigError(f"--top must be 0 (all) or a positive count, got {args.top}")
    profile, calibration = resolve_hardware(args.hardware, args.db)
    ask = plan_ask(args)  # once: it reads --network's file
    if args.nccl_tests:
        measured = read_nccl_tests(args.nccl_tests, ask.gpus_per_node, profile.collectives)
        profile = replace(profile, collectives=measured)
    request = plan_request(args, profile, ask)
    if args.trace:  # a preset, an autocast recipe or a pinned split is refused before planning
        from headroom.cli.trace import traceable

        traceable(args.model, request.train, request.spec)
    status = SearchStatus()
    try:
        result = plan_and_advise(request, profile, calibration, progress=status, prune=not args.exhaustive)
    finally:
        status.close()
    traced = None
    if args.trace:
        from headroom.cli.trace import plan_trace_report, render_plan_trace

        traced = plan_trace_report(args.model, result)
    top = args.top or None
    if args.json:
        payload = plan_to_dict(result, top)
        if traced is not None:
            payload["trace"] = traced
        if args.export:
            best = result.recommendation
            payload["export"] = export(args.export, request, best).to_dict() if best else None
            if payload["export"] is not None:
                payload["export"]["held_at_1"] = list(_held(args, request))
        print(json.dumps(payload, indent=2))
    elif args.export:
        if result.recommendation is None:
            print(f"headroom: nothing fits, so there is nothing to export; {result.advice[-1]}", file=sys.stderr)
            return NOTHING_FITS
        settings = export(args.export, request, result.recommendation)
        print(settings.text)
        if args.stack is None and request.train.stack != export_stack(args.export):
            print(printable(f"note: planned on the reference stack, since the {export_stack(args.export)} stack "
                            "(whose ZeRO-1 and 2 are DeepSpeed's) covers transformers' Llama modules, not "
                            f"{request.spec.name}: a ZeRO-1 here is priced as torch's, not DeepSpeed's"),
                  file=sys.stderr)
        if held := _held(args, request):
            axes = held[0] if len(held) == 1 else f"{', '.join(held[:-1])} and {held[-1]}"
            print(printable(f"note: searched with {axes} at 1: --export {args.export} cannot express "
                            f"{'it' if len(held) == 1 else 'them'} (pin one, e.g. --{held[0]} 2, to plan it anyway)"),
                  file=sys.stderr)
        if not settings.notes_in_text:
            for note in settings.notes:
                print(printable(f"note: {note}"), file=sys.stderr)
    else:
        print(wrap(render(result, top)))
        if traced is not None:
            print("\n" + wrap(render_plan_trace(traced)))
    return 0 if result.recommendation is not None else NOTHING_FITS


def unsearched_text(result: Plan) -> str:
    """What a search cut short by its work bound left out, and how to search the rest."""
    tried = len(result.layouts) + len(result.pruned)
    return (f"the search stopped at its work bound ({search_work.LIMIT:,} candidates) after {tried:,} "
            f"layout{'' if tried == 1 else 's'}, those that could be fastest first; {result.unsearched:,} left untried: pin --tp, "
            "--pp or --cp, or plan fewer GPUs, to search them")


def pruned_text(result: Plan) -> str:
    """How many layouts a search left out by their floors (headroom.core.planning.pruning)."""
    return f"{len(result.pruned):,} more left out: no step of theirs can come within {NEAR:.0%} of the fastest"


def render(result: Plan, top: int | None) -> str:
    req, profile, best = result.request, result.profile, result.recommendation
    spec = req.spec
    unit, reserve = ("GPU", "CUDA context") if profile.device == "cuda" else ("device", "runtime reserve")
    where = (f"{req.gpus} GPUs, every layout searched" + (f" ({', '.join(sorted(p.replace('_', '-') for p in req.pinned))} pinned)" if req.pinned else "")
             if req.gpus is not None else f"layout {req.layout}")
    lines = [
        f"plan: {spec.name} ({spec.parameters / 1e9:.2f}B parameters), seq-len {req.seq_len}, global batch "
        f"{req.global_batch} sequences ({req.global_batch * req.seq_len:,} tokens), {where}, "
        f"{req.precision_text}, {req.train.optimizer}, {req.train.stack} stack",
        f"hardware: {profile.name} ({profile.source})" + (f"; assumed: {'; '.join(profile.assumptions)}" if profile.assumptions else ""),
    ]
    if req.cluster is not None:
        c = req.cluster
        inside = (f"collectives measured {c.measured.source} (groups of {', '.join(map(str, c.measured.group_sizes()))}), "
                  f"else {c.intra.name}" if c.measured_inside else c.intra.name)
        across = c.measured.across_nodes if c.measured else None
        between = (f"collectives measured across nodes ({across.text()}), else {c.inter.name}"
                   if across else c.inter.name)
        if profile.device == "cuda":
            links = "datasheet link inside a node, the network as given" if c.nics_per_node else "datasheet links"
            lines.append(f"cluster: {c.gpus_per_node} GPUs a node on {inside}, nodes on {between} ({links}"
                         + (f"; {c.assumed})" if c.assumed else ")"))
        else:  # a CPU's ranks: no GPU, and no link of its own unless its collectives were measured
            lines.append(f"cluster: {c.gpus_per_node} ranks a node on the CPU {profile.name}, no GPU: "
                         + (inside if c.measured_inside else f"{c.intra.name} assumed between them, a stand-in")
                         + f"; nodes on {between}")
    lines += [
        f"budget: {req.budget_bytes / GB:.1f} GB per {unit} (GB = 1e9 bytes"
        + (f"; {share}" if (share := budget_share(req.budget_bytes, profile)) else "")
        + (f": --budget {whole_device_budget(profile)} for all of it" if req.budget_bytes < profile.memory_bytes
           else "") + "); margin: peak x "
        f"{profile.fragmentation_text()} fragmentation + {req.context_reserve_bytes / GB:.1f} GB {reserve}",
        "confidence:",
        *(f"  {line}" for line in result.calibration.confidence_lines(
            spec.name, req.gpus or req.train.layout.world,
            str((best or result.pinned).config.recompute) if best or result.pinned else None)),
        *(f"note: {note}" for note in (budget_note(req.budget_bytes, profile), *req.notes()) if note),
        "",
    ]
    pinned = result.pinned
    if pinned is not None and pinned.rejection is not None:
        lines += [f"pinned: {pinned.layout}; {pinned.label}: does not fit: {pinned.rejection}",
                  *_performance(pinned, req, unit), "", *(f"  {a}" for a in result.advice)]
        return printable_lines(lines)
    if best is None:
        lines += [f"nothing fits ({len(result.rejected)} candidates rejected)", *(f"  {a}" for a in result.advice)]
        if result.unsearched:
            lines.append(f"  {unsearched_text(result)}")
        return printable_lines(lines)
    world = best.layout.world
    lines += [
        f"{'pinned' if pinned is not None else 'recommendation'}: {best.layout}; micro-batch "
        f"{best.config.micro_batch} x accumulation {best.accumulation_steps}, recompute {best.config.recompute}"
        + (f", fp8 {best.config.fp8}" if best.config.float8 is not None else "")
        + (f", {best.config.precision}" if req.precision_search else ""),
        f"  {best.tokens_per_s:,.0f} tokens/s ({best.tokens_per_s / world:,.0f} per {unit}), {best.step_time_s:.3f} s per step, "
        f"needs {best.required_bytes / GB:.1f} GB of {req.budget_bytes / GB:.1f} GB "
        f"({(req.budget_bytes - best.required_bytes) / GB:.1f} GB headroom)",
        *_performance(best, req, unit)[1:],
        ("  why: the one configuration pinned" if pinned is not None else
         f"  why: the fastest of {len(result.candidates)} fitting candidates"
         + (f" over {sum(o.fits for o in result.layouts)} fitting layouts of {len(result.layouts)} searched"
            + (f" ({pruned_text(result)})" if result.pruned else "") if req.gpus else "")),
        *([f"  forced by {forced}"] if pinned is None and (forced := result.forced_by()) else []),
    ]
    if best.time.communication:
        total = sum(t.seconds for t in best.time.communication)
        moved: dict[tuple[str, str, str], int] = {}  # bytes by axis, op and link, in the order the terms come
        for t in best.time.communication:
            moved[t.axis, t.op, t.link_key] = moved.get((t.axis, t.op, t.link_key), 0) + t.total_bytes
        lines.append(f"  communication: {total:.3f} s of collectives, {best.time.communication_s:.3f} s exposed after overlap: "
                     + "; ".join(f"{axis} {op.replace('_', '-')} {n / GB:.2f} GB on {link}"
                                 for (axis, op, link), n in moved.items()))
        lines += [f"  overlap: {overlap.text()}" for overlap in best.time.overlaps]
    if best.layout.dp * best.layout.cp > 1:
        lines.append(f"  data parallel: {best.config.data_parallel.text(best.layout.zero)}")
    if best.layout.cp > 1:
        given = "as given" if best.layout.cp_comm else f"the {best.config.stack} stack's"
        how = ("gathered once a layer" if best.config.cp_comm == "all-gather" else "passed rank to rank")
        lines.append(f"  context parallel: keys and values {how} ({given})")
    if (hint := dispatch_hint(result)) is not None:
        lines.append(f"  expert parallel: {hint}")
    if best.layout.pp > 1:
        lines.append(f"  pipeline stages: {split_text_for(best.layout, req.spec.n_layers, best.config.stack)}")
    if len(best.estimate.ranks) > 1:
        lines.append("  memory per rank kind: " + ", ".join(
            f"{r.rank.name} {r.peak_bytes / GB:.1f} GB ({float(r.rank.in_flight):g} micro-batches in flight)"
            for r in best.estimate.ranks))
    faster = sorted((c for c in result.rejected if c.tokens_per_s > best.tokens_per_s), key=lambda c: -c.tokens_per_s)
    for c in faster[:3]:
        on = f" on {c.layout}" if req.gpus is not None else ""
        lines.append(f"  faster but rejected: {c.label}{on} ({c.tokens_per_s:,.0f} tokens/s) {c.rejection}")
    shown = result.candidates[:top]
    recipes = [_recipe(req, c) for c in shown]  # the searched precision and fp8 recipe, where searched
    width = max(map(len, recipes), default=0) + 2 if req.searches_recipes else 0
    lines += ["", f"{'#':>3}  {'micro':>5} {'accum':>5}  {'recompute':<13}" + f"{'recipe':<{width}}" * bool(width)
              + f"{'tokens/s':>12}{'step s':>9}{'needs GB':>10}{'headroom GB':>13}"
              + ("  layout" if req.gpus is not None else "")]
    band = result.band
    for i, (c, recipe) in enumerate(zip(shown, recipes, strict=True), 1):
        rank = "1=" if i <= band and band > 1 else str(i)
        lines.append(
            f"{rank:>3}  {c.config.micro_batch:>5} {c.accumulation_steps:>5}  {c.config.recompute!s:<13}"
            f"{recipe:<{width}}{c.tokens_per_s:>12,.0f}"
            f"{c.step_time_s:>9.3f}{c.required_bytes / GB:>10.1f}{(req.budget_bytes - c.required_bytes) / GB:>13.1f}"
            + (f"  {c.layout}" if req.gpus is not None else "")
        )
    if band > 1:
        lines += ["", (f"1=: the {band} within {NEAR:.0%} of the fastest, as fast as the time model can tell; the "
                       "simplest first")]
    if req.gpus is not None:
        lines += ["", f"layouts: {len(result.layouts)} searched; the best of each, and why it lost:"]
        if result.unsearched:
            lines.append(f"  {unsearched_text(result)}")
        for o in result.layouts[: (top or len(result.layouts))]:
            lines.append(f"  {o.layout!s:<52} {o.why_lost(best)}")
        if result.pruned:
            tokens = req.global_batch * req.seq_len
            lines += ["", f"layouts left out: {len(result.pruned):,}; the fastest each could be:"]
            for p in result.pruned[: (top or len(result.pruned))]:
                lines.append(f"  {p.layout!s:<52} {p.why_left_out(tokens, best.tokens_per_s)}")
    lines += ["", f"rejected: {len(result.rejected)} (see --json for every reason)"]
    return printable_lines(lines)


def _performance(c: Candidate, req: PlanRequest, unit: str) -> list[str]:
    """A candidate's speed, utilisation, step time by term (compute and host apart) and, given --train-tokens,
    what the run takes."""
    use = c.utilization
    mfu = (f", MFU {use.mfu:.1%}, HFU {use.hfu:.1%} (of the {use.peak_flop_per_s / 1e12:,.0f} TFLOP/s dense peak)"
           if use.mfu is not None else "")
    bound = "host-bound" if c.time.host_bound else "device-bound"
    lines = [
        f"  {c.tokens_per_s:,.0f} tokens/s ({c.tokens_per_s / c.layout.world:,.0f} per {unit}), "
        f"{c.step_time_s:.3f} s per step",
        f"  {use.tflop_per_s_per_gpu:,.1f} model TFLOP/s per {unit}{mfu}; FLOPs count causal attention in full",
        f"  compute {c.compute_s:.3f} s and host {c.host_s:.3f} s a step ({c.time.launches:,} kernels a micro-batch; "
        f"{bound})",
        "  step time by term: " + ", ".join(f"{k} {v:.3f} s" for k, v in c.time_by_term().items() if v),
    ]
    run = req.run_cost(c)
    if run is not None:
        lines.append(f"  run: {run.describe()}")
    return lines
