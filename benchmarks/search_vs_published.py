"""Does the layout search rank like reality? Each published run searched with only its GPU count given.

    python benchmarks/search_vs_published.py          # Narayanan et al.'s and torchtitan's runs
    python benchmarks/search_vs_published.py --all    # and llm-foundry's 209 (tens of minutes on 2 cores)
    python benchmarks/search_vs_published.py --pin-recompute  # each run's checkpointing kept
    python benchmarks/search_vs_published.py --as-published   # and its sharding stage, and sp where it had none

For each run of benchmarks/published_runs.py: the search over every layout of its GPUs (`headroom plan --gpus N`),
with the model, sequence, global batch, precision, optimizer, attention, dropout, stack, hardware and network as
published, the budget all the device holds (as the published run had; `headroom plan`'s default is 80 GB at most),
and everything else free (tp, sp, pp, schedule, cp, dp, sharding, micro-batch, accumulation,
checkpointing). It prints the pick, then two ratios, against the targets of the layout-search issue, and the pick's predicted MFU
(headroom.core.timing.run_cost: model FLOPs, causal attention counted in full, over the dense peak) to hold against
what later runs measured with the techniques the pick uses:

- pick / measured: the pick's predicted throughput over what the published run measured (target: at most 1.1,
  a search never promising much more than the best known run delivers);
- published / pick: the published configuration's predicted throughput over the pick's, by the model's own
  numbers (target: 0.95 or more, the published layout the pick or within 5% of it);
- model / measured: the published configuration's predicted throughput over its measurement (benchmarks/
  validation.py's row). pick / measured is this over published / pick: the time model's error on the published
  configuration, and the ranking's.

``--as-published`` searches only what the published run's software ran: its checkpointing and sharding stage
kept (FSDP's resharding too), and sequence parallelism held off where the run had none (Narayanan et al.'s 2021
Megatron-LM had neither it nor selective recomputation, both from Korthikanti et al. 2022, nor a ZeRO). The axes,
the schedule, the micro-batch and the accumulation stay free: the layout search alone is ranked against reality.

Uncalibrated, as benchmarks/validation.py: datasheet peaks and the cited curves only; nothing here is fitted.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from published_runs import LLM_FOUNDRY, RUNS, PublishedRun, megatron_eq3_flops
from validation import predict

from headroom.core.planning.planner import Candidate, PlanRequest, plan
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.interconnect import default_cluster
from headroom.core.specs.layout import Layout
from headroom.core.timing.step import HardwareProfile, datasheet_profile

PICK_OVER_MEASURED = 1.1
PUBLISHED_OVER_PICK = 0.95


def _profile(run: PublishedRun) -> HardwareProfile:
    """The run's profile as benchmarks/validation.py prices it (its attention kernel's rate where it ran another)."""
    profile = datasheet_profile(get_hardware(run.hardware))
    if run.attention_efficiency is not None:
        executed = profile.peak_flop_per_s["bf16"] * run.attention_efficiency
        profile = dataclasses.replace(profile, attention_flop_per_s=2 * executed)
    return profile


def _figure(run: PublishedRun, pick: Candidate) -> float:
    """The pick's throughput in the run's published unit."""
    if run.unit == "tflop_per_s_per_gpu":
        return megatron_eq3_flops(run.spec, run.global_batch, run.config.seq_len) / pick.step_time_s / run.gpus / 1e12
    return run.global_batch * run.config.seq_len / pick.step_time_s / run.gpus


def published_techniques(run: PublishedRun) -> dict[str, object]:
    """The layout settings ``--as-published`` keeps: the sharding stage, FSDP's resharding as the run did it (its
    setting, else its stack's default), and sequence parallelism off where the run had none (on, it is the
    search's wherever tp > 1)."""
    layout = run.config.layout
    kept: dict[str, object] = {"zero": layout.zero}
    if layout.zero == 3 and layout.dp * layout.cp > 1:  # as set, or the stack's default: resharded or kept
        kept["reshard_after_forward"] = run.config.data_parallel.reshard_after_forward
    if not layout.sp:
        kept["sp"] = False
    return kept


def search(run: PublishedRun, pin_recompute: bool = False, as_published: bool = False) -> tuple[Candidate | None, float]:
    """The search's pick for ``run`` with its layout, micro-batch and checkpointing free (``pin_recompute``: the
    checkpointing as published; ``as_published``: that and `published_techniques`), and its seconds."""
    kept = published_techniques(run) if as_published else {}
    train = dataclasses.replace(run.config, layout=Layout(**kept))
    cluster = default_cluster(run.hardware, inter=run.inter)
    profile = _profile(run)
    request = PlanRequest(spec=run.spec, train=train, global_batch=run.global_batch, gpus=run.gpus, cluster=cluster,
                          recompute=run.config.recompute if pin_recompute or as_published else None,
                          pinned=frozenset(kept), budget_bytes=profile.memory_bytes)
    start = time.perf_counter()
    result = plan(request, profile)
    return result.recommendation, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="also llm-foundry's runs (tens of minutes on 2 cores)")
    parser.add_argument("--pin-recompute", action="store_true", help="keep each run's published checkpointing")
    parser.add_argument("--as-published", action="store_true",
                        help="keep each run's checkpointing and sharding stage, and sequence parallelism off where it "
                             "had none: the layout search alone ranked")
    args = parser.parse_args()
    runs = [run for run in RUNS if args.all or not run.source.startswith(LLM_FOUNDRY)]
    over, under, seconds = [], [], []
    print(f"{'run':<32} {'GPUs':>5} {'search s':>8}  {'pick':<60} {'pick/meas':>9} {'pub/pick':>8} "
          f"{'model/meas':>10} {'pick MFU':>8}")
    for run in runs:
        pick, took = search(run, args.pin_recompute, args.as_published)
        seconds.append(took)
        if pick is None:
            print(f"{run.name:<32} {run.gpus:>5} {took:>8.1f}  nothing fits")
            continue
        figure, published = _figure(run, pick), predict(run)
        over.append(figure / run.published)
        under.append(published / figure)
        label = f"{pick.estimate.config.layout}; micro {pick.estimate.config.micro_batch} x{pick.accumulation_steps}, " \
                f"{pick.estimate.config.recompute}"
        mfu = pick.utilization.mfu
        print(f"{run.name:<32} {run.gpus:>5} {took:>8.1f}  {label[:60]:<60} {over[-1]:>9.2f} {under[-1]:>8.2f} "
              f"{published / run.published:>10.2f} {mfu:>8.1%}")
    if not over:
        return
    print(f"\npick / measured: median {statistics.median(over):.2f}, highest {max(over):.2f}; "
          f"{sum(r <= PICK_OVER_MEASURED for r in over)} of {len(over)} at {PICK_OVER_MEASURED} or less")
    print(f"published / pick: median {statistics.median(under):.2f}, lowest {min(under):.2f}; "
          f"{sum(r >= PUBLISHED_OVER_PICK for r in under)} of {len(under)} at {PUBLISHED_OVER_PICK} or more")
    print(f"search: median {statistics.median(seconds):.1f} s, longest {max(seconds):.1f} s")


if __name__ == "__main__":
    main()
