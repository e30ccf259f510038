"""``headroom agent run``: benchmark this box into the result store."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from headroom.agent.names import KINDS, SUITES
from headroom.cli.stop import Stopped, stoppable
from headroom.cli.train_flags import (
    POLICIES_HELP,
    add_train_flags,
    layout_from_args,
    model_from_args,
    train_config,
)
from headroom.cli.wrap import wrap
from headroom.core.errors import ConfigError
from headroom.core.safe_text import MAX_LABELS, text_problem
from headroom.core.specs.float8 import FLOAT8_RECIPES
from headroom.core.specs.layout import Layout
from headroom.core.specs.stack import STACKS, get_stack

MAX_LOCAL_RANKS = 64
"""Processes the agent starts on one box, one per rank: more than the GPUs of any node, and more CPU processes
than gloo measures anything with. Checked before anything is launched."""
MAX_STEPS = 1000
"""Timed steps per configuration: past a few, more only take longer."""
MAX_SWEEP = 256
"""Configurations one ``agent train`` measures (micro-batches x policies, each listed once)."""
MAX_ACCUMULATION = 4096
"""Micro-batches per optimizer step: 4,096 micro-batches of one sequence each is 4,096 sequences per rank per
step, more than training runs accumulate."""





def add_parser(subparsers: argparse._SubParsersAction) -> None:
    agent = subparsers.add_parser("agent", help="benchmark this box into the result store",
                                  description="The benchmark agent: run it on every GPU box.")
    commands = agent.add_subparsers(dest="agent_command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run", help="run a benchmark suite",
        description="Run a benchmark suite and record every result, with the box's fingerprint, in the store. "
        "Example: headroom agent run --suite quick --device cuda:0",
    )
    run.add_argument("--suite", default="quick", choices=SUITES,
                     help="smoke (<60 s on a CPU, for tests), quick (<3 min on an H100), standard (<10 min), full (default quick)")
    run.add_argument("--device", default=None, help="cuda:N, cuda, all (every visible GPU, one run each) or cpu (default: cuda:0 if present, else cpu)")
    run.add_argument("--db", help="result store URL (default: HEADROOM_DB or the default SQLite file; see `headroom db info`)")
    run.add_argument("--only", default=None,
                     help=f"comma-separated kinds to run: {','.join(KINDS)} (default all; collectives when "
                     "there are ranks to measure them over, see --nproc)")
    run.add_argument("--nproc", type=int, default=None,
                     help="processes for the collective benchmarks, one per device (default: every visible GPU "
                     "when there are two or more; on a CPU none unless given, e.g. --nproc 2 for gloo)")
    run.add_argument("--label", action="append", default=[], metavar="K=V", help="tag the run, e.g. --label rack=b7 (repeatable)")
    run.add_argument("--settle", type=float, default=0, metavar="SECONDS",
                     help="on a shared box or a laptop: first wait up to SECONDS for other processes to leave the "
                          "CPUs (at most 25%% of them, looked at each second), then measure; results taken while the "
                          f"host is busy are kept but flagged noisy (default 0: start at once; at most {MAX_SETTLE_S:,})")
    run.add_argument("--quiet", action="store_true", help="no progress output; print only the summary")
    run.add_argument("--json", action="store_true",
                     help="print what was measured as a bundle (the format of `headroom db export`) instead of the summary")
    run.set_defaults(handler=run_agent)

    train = commands.add_parser(
        "train", help="benchmark training steps: one configuration or a sweep, on one device or several ranks",
        description="Train a model for a few steps per configuration and record step time, memory and the core's "
        "predictions. Comma-separated --micro-batch and --recompute make a sweep. With --nproc (or --tp/--dp/--pp) "
        "the step runs on several local ranks under torch's own parallelism (DDP, ZeRO-1, FSDP2, tensor "
        "parallelism, a pipeline alone under --schedule 1f1b, gpipe or zbv with --accumulation micro-batches) and every "
        "rank is recorded; --cp, --ep, --zero 2 and the interleaved schedule are planned by the core but not measured "
        "here, and refused. On one device --fp8 runs torchao's float8 linears and --compile on compiles each block, as "
        "torchtitan does. A step the core predicts cannot fit is skipped, not run. "
        "Example: headroom agent train --model llama3.2-1b --seq-len 2048 --micro-batch 1,2,4 --recompute none,full; "
        "headroom agent train --model bench-llama-small --device cpu --nproc 2 --dp 2 --zero 3",
        epilog=POLICIES_HELP,
    )
    train.add_argument("--model", required=True, help="preset name, a HuggingFace config.json, a model directory holding one, or a HuggingFace model id (org/name[@revision])")
    add_train_flags(train, micro_batch="list", recompute="list", layout="fixed", precision_default=None, fp8="one")
    train.add_argument("--nproc", type=int, default=None,
                       help="local processes, one per GPU (default: tp x dp x pp x cp; --nproc alone means --dp)")
    train.add_argument("--accumulation", type=int, default=1, help="micro-batches per optimizer step: a pipeline's micro-batches under --pp (default 1)")
    train.add_argument("--steps", type=int, default=5, help="timed steps after two warm-up steps (default 5)")
    train.add_argument("--device", default=None, help="cuda:N or cpu (default: cuda:0 if present, else cpu)")
    train.add_argument("--db", help="result store URL (default: HEADROOM_DB or the default SQLite file)")
    train.add_argument("--label", action="append", default=[], metavar="K=V", help="tag the run (repeatable)")
    train.add_argument("--quiet", action="store_true", help="no progress output; print only the summary")
    train.add_argument("--json", action="store_true",
                       help="print what was measured as a bundle (the format of `headroom db export`) instead of the summary")
    train.set_defaults(handler=run_train)


def parse_labels(items: list[str]) -> dict[str, str]:
    """``--label K=V`` as a run's labels, checked as the store checks them (headroom.core.safe_text) before anything
    runs."""
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"label {item[:80]!r} is not KEY=VALUE, e.g. --label rack=b7")
        for part, text in (("key", key.strip()), ("value", value.strip())):
            if text and (problem := text_problem(text)):
                raise ConfigError(f"label {part} {text[:80]!r} {problem}")
        labels[key.strip()] = value.strip()
    if len(labels) > MAX_LABELS:
        raise ConfigError(f"{len(labels)} labels: a run carries at most {MAX_LABELS}")
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


def parse_kinds(text: str | None) -> tuple[str, ...]:
    """``--only``: the kinds named, each known; None: all of them."""
    if text is None:
        return KINDS
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = sorted(set(kinds) - set(KINDS))
    if not kinds or unknown:
        what = f"unknown kind(s) {', '.join(unknown)}" if unknown else "names no kind"
        raise ConfigError(f"--only {text!r}: {what}; valid: {','.join(KINDS)}")
    return kinds


def collective_ranks(nproc: int | None, targets: list, explicit: bool) -> int:
    """Processes for the collective benchmarks: ``--nproc``, else every visible GPU; 1 means none run."""
    import torch

    gpus = torch.cuda.device_count() if targets[0].type == "cuda" else 0
    if nproc is not None and nproc > MAX_LOCAL_RANKS:
        raise ConfigError(f"--nproc {nproc:,}: the agent starts one process per rank on this box, at most "
                          f"{MAX_LOCAL_RANKS}")
    if nproc is None:
        ranks = gpus if gpus > 1 else 1
    elif nproc < 2:
        raise ConfigError(f"--nproc {nproc}: collectives need at least 2 processes")
    elif gpus and nproc > gpus:
        raise ConfigError(f"--nproc {nproc}: this box shows {gpus} GPU(s); one process per GPU, so 2..{gpus}")
    else:
        ranks = nproc
    if explicit and ranks < 2:
        where = f"this box shows {gpus} GPU" if targets[0].type == "cuda" else "a CPU runs none unless asked"
        raise ConfigError(f"--only collectives needs 2 or more processes ({where}); "
                          "give --nproc 2 (or more) to measure gloo on the CPU")
    return ranks


def interrupted(stop: KeyboardInterrupt, run: str, url: str) -> int:
    """Ctrl-C or a stop signal ended ``run``, which the store marked aborted: say so; 130 for Ctrl-C, else
    128 + the signal."""
    how = f" by {stop}" if isinstance(stop, Stopped) else ""
    print(f"\ninterrupted{how}: {run} is marked aborted; its finished results are kept in {url}", file=sys.stderr)
    return stop.status if isinstance(stop, Stopped) else 130


@stoppable
def run_agent(args: argparse.Namespace) -> int:
    from headroom.agent import bench_collectives
    from headroom.agent.runner import DeviceLost, run_suite
    from headroom.agent.summary import summarize
    from headroom.db.store import open_store

    only = parse_kinds(args.only)
    labels = parse_labels(args.label)
    targets = devices(args.device)
    ranks = collective_ranks(args.nproc, targets, explicit=args.only is not None and "collectives" in only)
    per_device = tuple(kind for kind in only if kind != "collectives")
    jobs = [(device, None) for device in targets if per_device]
    if "collectives" in only and ranks > 1:  # one run over the box's devices, filed under the first
        jobs.append((targets[0], bench_collectives.cases(targets[0].type, ranks)))
    if not 0 <= args.settle <= MAX_SETTLE_S:
        raise ConfigError(f"--settle must be 0 to {MAX_SETTLE_S:,} seconds, got {args.settle:g}")
    failed, reports = False, []
    with open_store(args.db, mode="write") as store:
        if not args.quiet:
            print(f"recording into {store.url}", file=sys.stderr)
        if args.settle:
            settle(args.settle, args.quiet)
        for device, cases in jobs:
            try:
                report = run_suite(store, device, args.suite, only=per_device, labels=labels, quiet=args.quiet,
                                   cases=cases)
            except KeyboardInterrupt as stop:
                return interrupted(stop, f"the run on {device}", store.url)
            except DeviceLost as lost:
                return device_lost(lost, device, store.url)
            reports.append(report)
            if not args.json:
                print(wrap(summarize(report)))
            failed |= nothing_measured(report)
        if args.json:
            print_runs(store, reports)
    return 1 if failed else 0


MAX_SETTLE_S = 3600
"""The longest ``--settle`` waits for a quiet host: an hour."""


def settle(limit_s: float, quiet: bool) -> None:
    """Wait up to ``limit_s`` for other processes to leave the CPUs (headroom.agent.host_load), saying what it found."""
    from headroom.agent.host_load import BUSY_OTHER_FRACTION, wait_until_quiet

    if not quiet:
        print(f"waiting up to {limit_s:g} s for other processes to use at most {BUSY_OTHER_FRACTION:.0%} of the "
              "CPUs", file=sys.stderr)
    calm, waited, share = wait_until_quiet(limit_s)
    if not quiet or not calm:
        what = f"other processes used {share:.0%} of the CPUs" if share is not None else "its load cannot be read"
        print(f"host {'quiet' if calm else 'still busy'} after {waited:.0f} s ({what})"
              + ("" if calm else ": measuring anyway, and what the host disturbs is flagged noisy"), file=sys.stderr)


def print_runs(store, reports) -> None:
    """``--json``: the runs just measured, as `headroom db export` writes them."""
    from headroom.db.bundle import print_runs

    print_runs(store, [r.run_id for r in reports], sys.stdout)


def nothing_measured(report) -> bool:
    """Say so when a run measured nothing (every result skipped or failed): the caller exits 1."""
    if not report.rows or report.count("ok"):
        return False
    print(f"headroom: run {report.run_id} measured nothing: {report.count('skipped')} skipped, "
          f"{report.count('oom')} out of memory, {report.count('error')} failed", file=sys.stderr)
    return True


def device_lost(lost, device, url: str) -> int:
    """The run broke the CUDA context: show what it recorded, say why it stopped, exit 1."""
    from headroom.agent.summary import summarize

    if lost.report is not None:
        print(wrap(summarize(lost.report)))
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
    return list(dict.fromkeys(values))  # each once, in the order given


def _policies(text: str) -> list[str]:
    """``--recompute``: one or more policy names; a list that names none is refused (it would record an empty run)."""
    policies = [p.strip() for p in text.split(",") if p.strip()]
    if not policies:
        raise ConfigError(f"--recompute {text!r} names no policy; e.g. none,full or every-2")
    return list(dict.fromkeys(policies))


@stoppable
def run_train(args: argparse.Namespace) -> int:
    from headroom.agent import bench_train
    from headroom.agent.runner import DeviceLost, profile_from_store, run_suite
    from headroom.agent.summary import summarize
    from headroom.db.store import open_store

    if not get_stack(args.stack).measured:
        measured = " or ".join(s.name for s in STACKS.values() if s.measured)
        raise ConfigError(f"--stack {args.stack}: the agent's decoder runs the reference stack's kernels, not "
                          f"{args.stack}'s, so it measures --stack {measured}; {args.stack} is planned, not measured "
                          f"(headroom plan --stack {args.stack})")
    (device,) = devices(args.device) if args.device != "all" else (None,)
    if device is None:
        raise ConfigError("--device all is for `agent run`; train one device at a time")
    if not 0 < args.steps <= MAX_STEPS or not 0 < args.accumulation <= MAX_ACCUMULATION:
        raise ConfigError(f"--steps must be 1 to {MAX_STEPS} and --accumulation 1 to {MAX_ACCUMULATION:,}, got "
                          f"{args.steps:,} and {args.accumulation:,}")
    labels = parse_labels(args.label)
    micro_batches, policies = _ints(args.micro_batch, "--micro-batch"), _policies(args.recompute)
    if len(micro_batches) * len(policies) > MAX_SWEEP:
        raise ConfigError(f"--micro-batch x --recompute is {len(micro_batches):,} x {len(policies):,} configurations; "
                          f"a sweep measures at most {MAX_SWEEP}")
    spec = model_from_args(args)
    precision = args.precision or ("amp-bf16" if device.type == "cuda" else "fp32")
    layout = train_layout(args, device)
    if get_stack(args.stack).loss_at(layout.tp) != "log-softmax":
        raise ConfigError(f"--stack {args.stack} --tp {layout.tp}: under tensor parallelism {args.stack} computes its "
                          "loss with its own function, which the agent's decoder does not run (its loss is torch's "
                          f"loss_parallel, the reference's); measure --stack reference, or plan it (headroom plan "
                          f"--stack {args.stack})")
    _check_recipe(args, layout)
    if layout.world > 1:  # what the agent cannot run is refused first, by name
        from headroom.agent import train_ranks

        train_ranks.check_layout(layout, spec, args.accumulation, args.stack)
    setups = [
        bench_train.TrainSetup(
            spec=spec,
            config=train_config(args, precision=precision, micro_batch=micro, recompute=policy, layout=layout),
            accumulation_steps=args.accumulation, steps=args.steps,
        )
        for micro in micro_batches
        for policy in policies
    ]
    for setup in setups:
        setup.config.check_model(spec)
    with open_store(args.db, mode="write") as store:
        from headroom.agent.fingerprint import device_name

        provider = profile_from_store(store, device_name(device))
        if layout.world == 1:
            cases = [bench_train.case(setup, provider) for setup in setups]
        else:
            from headroom.agent import train_ranks

            cases = train_ranks.cases(setups, device.type, provider)  # one launch for them all
        if not args.quiet:
            print(f"measuring {len(setups)} configurations (micro-batch {','.join(map(str, micro_batches))} x "
                  f"recompute {','.join(policies)}), {args.steps} steps each, into {store.url}", file=sys.stderr)
        try:
            report = run_suite(store, device, "train", labels=labels, quiet=args.quiet, cases=cases)
        except KeyboardInterrupt as stop:
            return interrupted(stop, "the run", store.url)
        except DeviceLost as lost:
            return device_lost(lost, device, store.url)
        if args.json:
            print_runs(store, [report])
        else:
            print(wrap(summarize(report)))
        return 1 if nothing_measured(report) else 0


def _check_recipe(args: argparse.Namespace, layout: Layout) -> None:
    """The FP8 recipes and compilation the agent's decoder runs: torchao's float8 (headroom.agent.float8) and
    torch.compile'd blocks (headroom.agent.compiled), on one device."""
    recipe = FLOAT8_RECIPES.get(args.fp8)
    if recipe is not None and recipe.library != "torchao":
        runs = ", ".join(name for name, r in FLOAT8_RECIPES.items() if r.library == "torchao")
        raise ConfigError(f"--fp8 {args.fp8}: Transformer Engine's recipes run inside Megatron-LM on CUDA, not in the "
                          f"agent's decoder, which runs torchao's ({runs}); plan it: headroom plan --stack megatron "
                          f"--fp8 {args.fp8}")
    ran = [flag for flag, on in (("--fp8", recipe is not None), ("--compile on", args.compile == "on")) if on]
    if ran and layout.world > 1:
        raise ConfigError(f"{' and '.join(ran)}: the agent measures them on one device; drop --nproc and the "
                          "parallel axes (headroom plan plans them on any layout)")


def _check_local_ranks(ranks: int) -> None:
    if ranks > MAX_LOCAL_RANKS:
        raise ConfigError(f"{ranks:,} ranks: the agent starts one process per rank on this box, at most "
                          f"{MAX_LOCAL_RANKS}")


def train_layout(args: argparse.Namespace, device) -> Layout:
    """The layout of ``agent train``: the axis flags, with ``--nproc`` alone meaning data parallelism (the
    layouts the agent cannot run are refused by run_train, which knows the model)."""
    layout = layout_from_args(args)
    if args.nproc is not None:
        if args.nproc < 1:
            raise ConfigError(f"--nproc {args.nproc}: give 1 or more processes")
        _check_local_ranks(args.nproc)  # before a layout of that many ranks is made
        if layout.world == 1 and args.nproc > 1:
            layout = dataclasses.replace(layout, dp=args.nproc)
        elif layout.world != args.nproc:
            raise ConfigError(f"--nproc {args.nproc} but the layout has tp x dp x pp x cp = {layout.world} ranks; "
                              "give one process per rank")
    _check_local_ranks(layout.world)
    if layout.world > 1 and device.type == "cuda":
        import torch

        if layout.world > torch.cuda.device_count():
            raise ConfigError(f"{layout.world} ranks, one per GPU, but this box shows {torch.cuda.device_count()}")
    return layout
