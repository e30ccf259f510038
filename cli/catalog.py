"""``headroom models`` and ``headroom hardware``: what the core knows about."""

from __future__ import annotations

import argparse
import json

from headroom.core.errors import ConfigError
from headroom.core.specs.hardware import (
    DTYPES,
    HARDWARE,
    HardwareSpec,
    keys_containing,
    match_device,
)
from headroom.core.specs.presets import PRESETS
from headroom.core.units import GB


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    models = subparsers.add_parser("models", help="list model presets", description="List the model presets.")
    models.add_argument("--json", action="store_true", help="a JSON list: every field of each preset and its parameters")
    models.set_defaults(handler=run_models)
    hardware = subparsers.add_parser(
        "hardware", help="list datasheet specs, or match a device name",
        description="List the datasheet table (dense peaks), or say which row a device name matches.",
    )
    hardware.add_argument("--match", metavar="NAME", help='a device name as torch reports it, e.g. "NVIDIA H100 80GB HBM3"')
    hardware.add_argument("--json", action="store_true",
                          help="JSON: a list of datasheet rows (FLOP/s, bytes/s, bytes), or the match as an object")
    hardware.set_defaults(handler=run_hardware)


def run_models(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps([spec.to_dict() | {"parameters": spec.parameters} for spec in PRESETS.values()],
                         indent=2))
        return 0
    print(f"{'preset':<20}{'block':<7}{'layers':>7}{'hidden':>8}{'heads':>7}{'kv':>5}{'ffn':>8}{'vocab':>9}{'parameters':>17}")
    for spec in PRESETS.values():
        print(
            f"{spec.name:<20}{spec.block:<7}{spec.n_layers:>7}{spec.hidden:>8}{spec.n_heads:>7}{spec.n_kv_heads:>5}"
            f"{spec.ffn_hidden:>8}{spec.vocab_size:>9}{spec.parameters:>17,}"
        )
    return 0


def run_hardware(args: argparse.Namespace) -> int:
    if args.match:
        found = match_device(args.match)
        if found.spec is None and len(rows := keys_containing(args.match)) > 1:
            raise ConfigError(f"{args.match!r} could be any of {', '.join(rows)}; give the device name as torch "
                              "reports it, e.g. 'NVIDIA H100 80GB HBM3'")
        if args.json:
            print(json.dumps({"name": args.match, "key": found.key,
                              "datasheet": hardware_document(found.spec) if found.spec else None}, indent=2))
        else:
            print(f"{args.match!r} -> {found.key}" + (f" ({found.spec.name})" if found.spec else " (no datasheet row)"))
        return 0 if found.spec else 1
    if args.json:
        print(json.dumps([hardware_document(hw) for hw in HARDWARE], indent=2))
        return 0
    header = "".join(f"{d + ' TF/s':>12}" for d in DTYPES)
    print(f"{'key':<16}{header}{'HBM TB/s':>10}{'mem GB':>8}  source")
    for hw in HARDWARE:
        peaks = "".join(
            f"{hw.peak_flop_per_s[d] / 1e12:>12,.1f}" if d in hw.peak_flop_per_s else f"{'-':>12}" for d in DTYPES
        )
        print(f"{hw.key:<16}{peaks}{hw.hbm_bytes_per_s / 1e12:>10.2f}{hw.memory_bytes / GB:>8.0f}  {hw.source}")
    return 0


def hardware_document(hw: HardwareSpec) -> dict:
    """A datasheet row as JSON: dense peaks in FLOP/s by dtype, bandwidth in bytes/s, memory in bytes."""
    return {"key": hw.key, "name": hw.name, "peak_flop_per_s": hw.peak_flop_per_s,
            "hbm_bytes_per_s": hw.hbm_bytes_per_s, "memory_bytes": hw.memory_bytes, "source": hw.source}
