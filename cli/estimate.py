"""``headroom estimate``: memory and FLOPs of one training configuration."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from headroom.cli.train_flags import (
    POLICIES_HELP,
    add_train_flags,
    model_from_args,
    train_config,
)
from headroom.cli.wrap import wrap
from headroom.core.measured.calibration import Calibration
from headroom.core.memory.estimate import Estimate, estimate
from headroom.core.memory.ledger import Ledger
from headroom.core.safe_text import printable_lines
from headroom.core.specs.stages import split_text_for
from headroom.core.timing.run_cost import utilization
from headroom.core.timing.step import HardwareProfile, step_time, tokens_per_s
from headroom.core.units import GB, GiB


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "estimate",
        help="memory and FLOPs of one training configuration",
        description="Account memory (per rank) and FLOPs (per micro-batch) of one training step. "
        "Example: headroom estimate --model llama2-7b --seq-len 4096 --recompute full",
        epilog=POLICIES_HELP,
    )
    model = p.add_argument_group("model")
    model.add_argument("--model", required=True, help="preset name (see `headroom models`), a HuggingFace config.json, a model directory holding one, or a HuggingFace model id (org/name[@revision]: the local hub cache, else fetched)")
    training = p.add_argument_group("training")
    layout = p.add_argument_group("layout")
    add_train_flags(p, training=training, axes=layout)
    training.add_argument("--accumulation", type=int, default=1, help="micro-batches per optimizer step: with more than one, gradients exist while the next micro-batch runs (default 1)")
    hardware = p.add_argument_group("hardware")
    hardware.add_argument("--device", default="cuda", choices=("cuda", "cpu", "meta"), help="target device: what autograd saves differs by device (default cuda)")
    hardware.add_argument("--hardware", default=None,
                          help="also predict the step's time on this device: a device measured in the store (its name) "
                               "or a datasheet key from `headroom hardware` (default: memory and FLOPs only)")
    hardware.add_argument("--db", help="result store URL for measured hardware (default: HEADROOM_DB or the default store)")
    output = p.add_argument_group("output")
    output.add_argument("--ledger", action="store_true", help="also print every tensor kept for backward")
    output.add_argument("--trace", action="store_true",
                        help="also build the model from its config.json with HuggingFace transformers on the meta "
                        "device and list what one forward keeps for backward, against the analytic ledger (needs "
                        "torch and transformers; --precision fp32 or a bf16 recipe, --recompute none or full)")
    output.add_argument("--json", action="store_true", help="print the JSON contract documented in README.md")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    spec = model_from_args(args)
    config = train_config(args)
    config.check_sharding()
    timed = None
    if args.hardware is not None:
        from headroom.db.hardware import resolve_hardware

        profile, calibration = resolve_hardware(args.hardware, args.db)
        if args.device != profile.device:
            args.device = profile.device  # the hardware's saving rules: what its time is of
    result = estimate(spec, config, args.device, args.accumulation)
    if args.hardware is not None:
        timed = step_report(result, profile, calibration)
    traced = None
    if args.trace:
        from headroom.cli.trace import render_trace, traced_report

        traced = traced_report(args.model, config, result)
    if args.json:
        report = result.to_dict()
        if args.ledger:
            report["ledger"] = [asdict(t) | {"bytes": t.bytes} for t in result.ledger.tensors]
        if traced is not None:
            report["trace"] = traced
        if timed is not None:
            report["time"] = timed
        print(json.dumps(report, indent=2))
    else:
        print(wrap(render(result)))
        if timed is not None:
            print("\n" + wrap(render_time(timed)))
        if args.ledger:
            print("\n" + wrap(render_ledger(result.ledger)))
        if traced is not None:
            print("\n" + wrap(render_trace(traced)))
    return 0


def render(result: Estimate) -> str:
    spec, cfg, report = result.spec, result.config, result.to_dict()
    memory, flops = report["memory_bytes"], report["flops"]
    capacity = f" at capacity factor {spec.capacity_factor:g}" if spec.capacity_factor else ", dropless"
    experts = (f"; {spec.active_parameters:,} active per token, {spec.experts_per_token} of {spec.n_experts} experts "
               f"in {spec.moe_layers} layers{capacity}") if spec.is_moe else ""
    per_token = spec.active_parameters  # the 6N of a mixture of experts counts the parameters a token uses
    lines = [
        f"{spec.name}: {spec.parameters:,} parameters ({spec.block}, {spec.n_layers} layers, "
        f"hidden {spec.hidden}, {spec.n_heads} heads / {spec.n_kv_heads} kv, vocab {spec.vocab_size:,}{experts})",
        f"seq-len {cfg.seq_len} x micro-batch {cfg.micro_batch} = {cfg.tokens:,} tokens; {cfg.precision}"
        f"{f' + fp8 {cfg.fp8}' if cfg.float8 is not None else ''}, "
        f"{cfg.optimizer}, {cfg.attention} attention, dropout {cfg.dropout:g}, recompute {cfg.recompute}, "
        f"accumulation {result.accumulation_steps}, target {result.device}, {cfg.stack} stack",
        f"layout: {cfg.layout} ({cfg.layout.world} GPUs); memory of the {result.rank.name} rank"
        + (f", the most loaded ({float(result.rank.in_flight):g} micro-batches in flight)" if len(result.ranks) > 1 else ""),
    ]
    if cfg.layout.pp > 1:
        lines.append(f"pipeline stages: {split_text_for(cfg.layout, spec.n_layers, cfg.stack)}")
    lines.append("")
    rows = ("parameters", "gradients", "master_weights", "optimizer_states", "gradient_buckets", "fp8_weights",
            "gathered_parameters_forward", "gathered_parameters_backward", "weight_copies",
            "activations", "activations_per_layer", "activations_host", "logits", "autocast_cache",
            "forward_transient", "backward_transient", "optimizer_transient", "forward_peak", "backward_peak",
            "optimizer_peak", "peak")
    optional = ("master_weights", "gradient_buckets", "fp8_weights", "gathered_parameters_forward",
                "gathered_parameters_backward", "weight_copies", "activations_host", "autocast_cache",
                "optimizer_transient")
    memory_rows: list[tuple[str, tuple[str, ...]] | None] = []
    for key in rows:
        if memory[key] == 0 and key in optional:
            continue
        if key in ("forward_peak", "peak"):
            memory_rows.append(None)
        memory_rows.append((key.replace("_", " "), (f"{memory[key] / GB:,.2f}", f"{memory[key] / GiB:,.2f}")))
    lines += table("memory per rank", ("GB", "GiB"), memory_rows)
    lines += [
        "",
        *table("FLOPs per micro-batch", ("TFLOP",), [
            (label, (f"{flops[key] / 1e12:,.2f}",))
            for label, key in (("forward", "forward"), ("backward", "backward"), ("recompute", "recompute"),
                               ("step (hardware)", "step"))]),
        f"  model FLOPs per token {flops['per_token']:,} ({flops['per_token'] / per_token:.2f} x "
        f"{'active ' if spec.is_moe else ''}parameters)",
        "",
        *([*table("peak per rank kind", ("GB",), [(r["rank"], (f"{r['peak'] / GB:,.2f}",)) for r in report["ranks"]]),
           ""] if len(report["ranks"]) > 1 else []),
        *(f"note: {note}" for note in report["notes"]),
    ]
    return printable_lines(lines)


def step_report(result: Estimate, profile: HardwareProfile, calibration: Calibration | None) -> dict:
    """``time`` of the JSON: the step's predicted time by term on ``profile``, compute and host apart, and MFU."""
    layout = result.config.layout
    cluster = profile.cluster() if layout.world > 1 else None
    time = step_time(result, profile, result.accumulation_steps, cluster)
    factor = calibration.time.correction if calibration is not None else 1.0
    step_s = time.total_s * factor
    peak = profile.peak_flop_per_s.get(result.config.recipe.compute_dtype)
    use = utilization(result, result.accumulation_steps, step_s, peak)
    return {"hardware": profile.name, "source": profile.source, "device": profile.device, "calibration_factor": factor,
            "step_time_s": step_s, "time_s": {k: v * factor for k, v in time.by_term().items()},
            "compute_s": time.step_device_s * factor, "host_s": time.step_host_s * factor,
            "host_bound": time.host_bound, "kernel_launches_per_micro_batch": time.launches,
            "tokens_per_s": tokens_per_s(result.config, time) / factor, "utilization": use.to_dict(),
            "assumptions": list(profile.assumptions)}


def render_time(timed: dict) -> str:
    use = timed["utilization"]
    mfu = f", MFU {use['mfu']:.1%}, HFU {use['hfu']:.1%}" if use["mfu"] is not None else ""
    calibrated = f" (calibrated x{timed['calibration_factor']:.3f})" if timed["calibration_factor"] != 1 else ""
    return printable_lines([
        f"time on {timed['hardware']} ({timed['source']}){calibrated}: {timed['step_time_s']:.4g} s per step, "
        f"{timed['tokens_per_s']:,.0f} tokens/s",
        f"  {use['tflop_per_s_per_gpu']:,.1f} model TFLOP/s per {'device' if timed['device'] == 'cpu' else 'GPU'}"
        f"{mfu}; FLOPs count causal attention in full",
        f"  compute {timed['compute_s']:.4g} s and host {timed['host_s']:.4g} s a step "
        f"({timed['kernel_launches_per_micro_batch']:,} kernels a micro-batch; "
        f"{'host-bound' if timed['host_bound'] else 'device-bound'})",
        "  by term: " + ", ".join(f"{k} {v:.4g} s" for k, v in timed["time_s"].items() if v),
    ])


def table(title: str, units: tuple[str, ...], rows: list[tuple[str, tuple[str, ...]] | None]) -> list[str]:
    """Lines of a table: a title over the labels, a unit over each column of figures, a row per label (None: a
    rule). Labels are left-aligned in at least 22 characters, figures right-aligned in at least 12, and every
    column widens to its longest entry (a space after a label, two before a figure), so a trillion-parameter
    model's figures stay under their units."""
    body = [row for row in rows if row is not None]
    label_width = max(22, *(len(label) + 1 for label, _ in body))
    widths = [max(12, len(unit) + 2, *(len(values[i]) + 2 for _, values in body)) for i, unit in enumerate(units)]
    lines = [f"{title:<{label_width + 2}}" + "".join(f"{unit:>{w}}" for unit, w in zip(units, widths, strict=True))]
    for row in rows:
        if row is None:
            lines.append("  " + "-" * (label_width + sum(widths)))
            continue
        label, values = row
        lines.append(f"  {label:<{label_width}}" + "".join(f"{v:>{w}}" for v, w in zip(values, widths, strict=True)))
    return lines


def render_ledger(ledger: Ledger) -> str:
    """Block 0's tensors, the other blocks by total, then the embedding, head and loss."""
    def shape_of(t) -> str:
        return "x".join(str(d) for d in t.shape) or "scalar"

    # Columns widen to their longest entry (a sequence of 10**6 tokens has shapes and MB past the defaults).
    name_width = max(38, *(len(t.name) + 1 for t in ledger.tensors), 0)
    shape_width = max(24, *(len(shape_of(t)) + 1 for t in ledger.tensors), 0)
    mb_width = max(10, *(len(f"{t.bytes / 1e6:.3f}") + 1 for t in ledger.tensors), 0)
    lines = [f"{'tensor kept for backward':<{name_width + 2}}{'shape':<{shape_width}}{'dtype':<7}{'MB':>{mb_width}}"
             "  where"]

    def row(t) -> str:
        where = t.location + ("" if t.kind == "activation" else f", {t.kind.replace('_', ' ')}")
        return f"  {t.name:<{name_width}}{shape_of(t):<{shape_width}}{t.dtype:<7}{t.bytes / 1e6:>{mb_width}.3f}  {where}"

    by_layer: dict[int | None, list] = {}
    for t in ledger.tensors:
        by_layer.setdefault(t.layer, []).append(t)
    layers = sorted(k for k in by_layer if k is not None)
    if layers:
        first = layers[0]
        lines.append(f" layer {first}:")
        lines += [row(t) for t in by_layer[first]]
        totals = {sum(t.bytes for t in by_layer[k]) for k in layers[1:]}
        if len(totals) == 1:
            lines.append(f" layers {layers[1]}..{layers[-1]}: {len(layers) - 1} more, {totals.pop() / 1e6:,.3f} MB each")
        for k in layers[1:] if len(totals) > 1 else ():
            lines.append(f" layer {k}: {sum(t.bytes for t in by_layer[k]) / 1e6:,.3f} MB")
    lines.append(" embedding, final norm, head and loss:")
    lines += [row(t) for t in by_layer.get(None, [])]
    lines.append(f" backward transient: {ledger.transient_bytes / 1e6:,.3f} MB (MB = 1e6 bytes)")
    return printable_lines(lines)
