"""``headroom agent run``: benchmark this box into the result store."""

from __future__ import annotations

import argparse
import sys

from cli.train_flags import add_train_flags, train_config
from core.errors import ConfigError

SUITE_NAMES = ("smoke", "quick", "standard", "full")
KIND_NAMES = ("matmul", "elementwise", "attention", "train")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    agent = subparsers.add_parser("agent", help="benchmark this box into the result store",
                                  description="The benchmark agent: run it on every GPU box.")
    commands = agent.add_subparsers(dest="agent_command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run", help="run a benchmark suite",
        description="Run a benchmark suite and record every result, with the box's fingerprint, in the store. "
        "Example: headroom agent run --suite quick --device cuda:0",
    )
    run.add_argument("--suite", default="quick", choices=SUITE_NAMES,
                     help="smoke (<60 s on a CPU, for tests), quick (<3 min on an H100), standard (<10 min), full (default quick)")
    run.add_argument("--device", default=None, help="cuda:N, cuda, all (every visible GPU, one run each) or cpu (default: cuda:0 if present, else cpu)")
    run.add_argument("--db", help="result store URL (default: HEADROOM_DB or the default SQLite file; see `headroom db info`)")
    run.add_argument("--only", default=",".join(KIND_NAMES), help=f"comma-separated kinds to run: {','.join(KIND_NAMES)} (default all)")
    run.add_argument("--label", action="append", default=[], metavar="K=V", help="tag the run, e.g. --label rack=b7 (repeatable)")
    run.add_argument("--quiet", action="store_true", help="no progress output; print only the summary")
    run.set_defaults(handler=run_agent)

    train = commands.add_parser(
        "train", help="benchmark training steps: one configuration or a sweep",
        description="Train a model for a few steps per configuration and record step time, memory and the core's "
        "predictions. Comma-separated --micro-batch and --recompute make a sweep. "
        "Example: headroom agent train --model llama3.2-1b --seq-len 2048 --micro-batch 1,2,4 --recompute none,full",
    )
    train.add_argument("--model", required=True, help="preset name or path to a HuggingFace config.json")
    add_train_flags(train, micro_batch="list", recompute="list", layout="none", precision_default=None)
    train.add_argument("--accumulation", type=int, default=1, help="micro-batches per optimizer step (default 1)")
    train.add_argument("--steps", type=int, default=5, help="timed steps after two warm-up steps (default 5)")
    train.add_argument("--device", default=None, help="cuda:N or cpu (default: cuda:0 if present, else cpu)")
    train.add_argument("--db", help="result store URL (default: HEADROOM_DB or the default SQLite file)")
    train.add_argument("--label", action="append", default=[], metavar="K=V", help="tag the run (repeatable)")
    train.add_argument("--quiet", action="store_true", help="no progress output; print only the summary")
    train.set_defaults(handler=run_train)


def parse_labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"label {item!r} is not KEY=VALUE, e.g. --label rack=b7")
        labels[key.strip()] = value.strip()
    return labels


def devices(spec: str | None):
    import torch

    if spec is None:
        return [torch.device("cuda:0" if torch.cuda.is_available() else "cpu")]
    if spec == "cpu":
        return [torch.device("cpu")]
    count = torch.cuda.device_count()
    if count == 0:
        raise ConfigError(f"--device {spec}: no CUDA device is visible here; use --device cpu")
    if spec == "all":
        return [torch.device(f"cuda:{i}") for i in range(count)]
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ConfigError(f"--device {spec!r} is not cpu, cuda, cuda:N or all") from None
    if device.type != "cuda" or (device.index or 0) >= count:
        raise ConfigError(f"--device {spec!r}: valid are cpu, all, and cuda:0 .. cuda:{count - 1}")
    return [device]


def run_agent(args: argparse.Namespace) -> int:
    from agent.runner import DeviceLost, run_suite
    from agent.summary import summarize
    from db.store import open_store

    only = tuple(k.strip() for k in args.only.split(",") if k.strip())
    labels = parse_labels(args.label)
    targets = devices(args.device)
    with open_store(args.db, mode="write") as store:
        if not args.quiet:
            print(f"recording into {store.url}", file=sys.stderr)
        for device in targets:
            try:
                report = run_suite(store, device, args.suite, only=only, labels=labels, quiet=args.quiet)
            except KeyboardInterrupt:
                print(f"\ninterrupted: the run on {device} is marked aborted; its finished results are kept in {store.url}",
                      file=sys.stderr)
                return 130
            except DeviceLost as lost:
                return device_lost(lost, device, store.url)
            print(summarize(report))
    return 0


def device_lost(lost, device, url: str) -> int:
    """The run broke the CUDA context: show what it recorded, say why it stopped, exit 1."""
    from agent.summary import summarize

    if lost.report is not None:
        print(summarize(lost.report))
    print(f"headroom: {device}: {lost}; the run is marked failed in {url}. Restart the process to measure again.",
          file=sys.stderr)
    return 1


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r} is not a comma-separated list of integers, e.g. 1,2,4") from None
    if not values or min(values) <= 0:
        raise ConfigError(f"{flag} {text!r} must list positive integers")
    return values


def run_train(args: argparse.Namespace) -> int:
    from agent import bench_train
    from agent.runner import DeviceLost, profile_from_store, run_suite
    from agent.summary import summarize
    from core.presets import resolve_model
    from db.store import open_store

    (device,) = devices(args.device) if args.device != "all" else (None,)
    if device is None:
        raise ConfigError("--device all is for `agent run`; train one device at a time")
    if args.steps <= 0 or args.accumulation <= 0:
        raise ConfigError(f"--steps and --accumulation must be positive, got {args.steps} and {args.accumulation}")
    spec = resolve_model(args.model)
    precision = args.precision or ("amp-bf16" if device.type == "cuda" else "fp32")
    setups = [
        bench_train.TrainSetup(
            spec=spec,
            config=train_config(args, precision=precision, micro_batch=micro, recompute=policy),
            accumulation_steps=args.accumulation, steps=args.steps,
        )
        for micro in _ints(args.micro_batch, "--micro-batch")
        for policy in (p.strip() for p in args.recompute.split(",") if p.strip())
    ]
    for setup in setups:
        setup.config.check_model(spec)
    with open_store(args.db, mode="write") as store:
        from agent.fingerprint import device_name

        provider = profile_from_store(store, device_name(device))
        cases = [bench_train.case(setup, provider) for setup in setups]
        try:
            report = run_suite(store, device, "train", labels=parse_labels(args.label), quiet=args.quiet, cases=cases)
        except KeyboardInterrupt:
            print(f"\ninterrupted: the run is marked aborted; its finished results are kept in {store.url}", file=sys.stderr)
            return 130
        except DeviceLost as lost:
            return device_lost(lost, device, store.url)
        print(summarize(report))
    return 0
