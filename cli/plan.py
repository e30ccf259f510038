"""``headroom plan``: micro-batch, accumulation and checkpoint policy for a model, a batch and a budget."""

from __future__ import annotations

import argparse
import json

from core.calibration import Calibration
from core.config import ATTENTIONS
from core.errors import ConfigError
from core.export import EXPORTERS, export
from core.hardware import get_hardware
from core.planner import Plan, PlanRequest, plan, plan_to_dict
from core.precision import OPTIMIZER_STATE_BYTES, PRECISIONS
from core.presets import resolve_model
from core.timing import HardwareProfile, datasheet_profile
from core.units import GB, parse_bytes


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="recommend micro-batch, accumulation and checkpointing for a memory budget",
        description="For a model, a global batch and a per-GPU memory budget, rank every micro-batch x "
        "checkpoint policy by predicted tokens/s, explain the winner and every rejection. "
        "Example: headroom plan --model llama2-7b --seq-len 4096 --global-batch 64 --dp 8 --zero 1",
    )
    p.add_argument("--model", required=True, help="preset name (see `headroom models`) or path to a HuggingFace config.json")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (default 2048)")
    batch = p.add_mutually_exclusive_group(required=True)
    batch.add_argument("--global-batch", type=int, help="sequences per optimizer step, all ranks together")
    batch.add_argument("--global-tokens", type=int, help="tokens per optimizer step, all ranks together (a multiple of --seq-len)")
    p.add_argument("--budget", default="80GB", help="memory per GPU, e.g. 80GB, 80GiB, 81920MiB (GB = 1e9 bytes; default 80GB)")
    p.add_argument("--hardware", default="h100-sxm", help="a device measured in the store (its name) or a datasheet key from `headroom hardware` (default h100-sxm)")
    p.add_argument("--db", help="result store URL for measured hardware and calibration (default: HEADROOM_DB or the default store)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel ranks (default 1)")
    p.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3), help="sharding stage over the ranks (default 0)")
    p.add_argument("--precision", default="amp-bf16", choices=list(PRECISIONS), help="precision recipe (default amp-bf16)")
    p.add_argument("--optimizer", default="adamw", choices=list(OPTIMIZER_STATE_BYTES), help="optimizer (default adamw)")
    p.add_argument("--attention", default="flash", choices=ATTENTIONS, help="attention kernel (default flash)")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability, gpt blocks only (default 0)")
    p.add_argument("--offload", action="store_true", help="also consider offloading activations to host memory")
    p.add_argument("--top", type=int, default=5, help="candidates to show (default 5; JSON lists them all with --top 0)")
    p.add_argument("--json", action="store_true", help="print the JSON contract documented in README.md")
    p.add_argument("--export", choices=list(EXPORTERS), metavar="FORMAT", help=f"print the recommendation as settings for {', '.join(EXPORTERS)}")
    p.set_defaults(handler=run)


def global_batch(args: argparse.Namespace) -> int:
    if args.global_batch is not None:
        return args.global_batch
    if args.global_tokens % args.seq_len:
        raise ConfigError(
            f"--global-tokens {args.global_tokens} is not a multiple of --seq-len {args.seq_len}; "
            f"use {args.global_tokens // args.seq_len * args.seq_len} or {(args.global_tokens // args.seq_len + 1) * args.seq_len}"
        )
    return args.global_tokens // args.seq_len


def load_hardware(name: str, db_url: str | None) -> tuple[HardwareProfile, Calibration | None]:
    """A device measured in the store, else a datasheet row."""
    from db.profiles import measured_profile  # the store is optional: plain datasheet planning needs no database

    measured = measured_profile(name, db_url)
    if measured is not None:
        return measured
    return datasheet_profile(get_hardware(name)), None


def run(args: argparse.Namespace) -> int:
    if args.top < 0:
        raise ConfigError(f"--top must be 0 (all) or a positive count, got {args.top}")
    request = PlanRequest(
        spec=resolve_model(args.model), seq_len=args.seq_len, global_batch=global_batch(args),
        budget_bytes=parse_bytes(args.budget), dp=args.dp, zero=args.zero, precision=args.precision,
        optimizer=args.optimizer, attention=args.attention, dropout=args.dropout, allow_offload=args.offload,
    )
    profile, calibration = load_hardware(args.hardware, args.db)
    result = plan(request, profile, calibration)
    top = args.top or None
    if args.json:
        print(json.dumps(plan_to_dict(result, top), indent=2))
    elif args.export:
        if result.recommendation is None:
            raise ConfigError("nothing fits, so there is nothing to export; " + result.advice[-1])
        print(export(args.export, request, result.recommendation))
    else:
        print(render(result, top))
    return 0


def render(result: Plan, top: int | None) -> str:
    req, profile, best = result.request, result.profile, result.recommendation
    spec = req.spec
    lines = [
        f"plan: {spec.name} ({spec.parameters / 1e9:.2f}B parameters), seq-len {req.seq_len}, global batch "
        f"{req.global_batch} sequences ({req.global_batch * req.seq_len:,} tokens), {req.dp} rank(s), ZeRO-{req.zero}, "
        f"{req.precision}, {req.optimizer}",
        f"hardware: {profile.name} ({profile.source})" + (f"; assumed: {'; '.join(profile.assumptions)}" if profile.assumptions else ""),
        f"budget: {req.budget_bytes / GB:.1f} GB per GPU (GB = 1e9 bytes); margin: peak x {profile.fragmentation:.2f} "
        f"fragmentation + {req.context_reserve_bytes / GB:.1f} GB CUDA context",
        f"confidence: {result.calibration.confidence()}",
        "",
    ]
    if best is None:
        lines += [f"nothing fits ({len(result.rejected)} candidates rejected)", *(f"  {a}" for a in result.advice)]
        return "\n".join(lines)
    lines += [
        f"recommendation: micro-batch {best.config.micro_batch} x accumulation {best.accumulation_steps} x {req.dp} rank(s), "
        f"recompute {best.config.recompute}",
        f"  {best.tokens_per_s:,.0f} tokens/s, {best.step_time_s:.3f} s per step, needs {best.required_bytes / GB:.1f} GB "
        f"of {req.budget_bytes / GB:.1f} GB ({(req.budget_bytes - best.required_bytes) / GB:.1f} GB headroom)",
        f"  why: the fastest of {len(result.candidates)} fitting candidates",
    ]
    faster = sorted((c for c in result.rejected if c.tokens_per_s > best.tokens_per_s), key=lambda c: -c.tokens_per_s)
    for c in faster[:3]:
        lines.append(f"  faster but rejected: {c.label} ({c.tokens_per_s:,.0f} tokens/s) {c.rejection}")
    lines += ["", f"{'#':>3}  {'micro':>5} {'accum':>5}  {'recompute':<13}{'tokens/s':>12}{'step s':>9}{'needs GB':>10}{'headroom GB':>13}"]
    for i, c in enumerate(result.candidates[:top], 1):
        lines.append(
            f"{i:>3}  {c.config.micro_batch:>5} {c.accumulation_steps:>5}  {str(c.config.recompute):<13}{c.tokens_per_s:>12,.0f}"
            f"{c.step_time_s:>9.3f}{c.required_bytes / GB:>10.1f}{(req.budget_bytes - c.required_bytes) / GB:>13.1f}"
        )
    lines += ["", f"rejected: {len(result.rejected)} (see --json for every reason)"]
    return "\n".join(lines)
