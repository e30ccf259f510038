"""The time model's validation: every published run pinned to its configuration, and the H200 reference run.

    python benchmarks/validation.py            # the table docs/time-model.md shows, the targets, the independent check
    python benchmarks/validation.py --markdown # the table alone, as docs/time-model.md holds it

Uncalibrated throughout: datasheet peaks and the cited curves of headroom.core.timing.device_curves; the kernel gap and host
costs of headroom.core.timing.op_time (fitted to the H200 reference run only). tests/test_time_model.py recomputes every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from h200_reference import h200_profile, label, predicted_s, regrets, train_steps
from published_runs import (
    GRAND_TETON,
    INDEPENDENT,
    KORTHIKANTI,
    LLM_FOUNDRY,
    NARAYANAN_TABLE_2,
    RUNS,
    TORCHTITAN_A100,
    PublishedRun,
    megatron_eq3_flops,
    megatron_model_flops,
)

from headroom.core.memory.estimate import estimate
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.interconnect import default_cluster
from headroom.core.timing.step import datasheet_profile, step_time


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    source: str
    configuration: str
    published: float
    predicted: float
    unit: str

    @property
    def ratio(self) -> float:
        return self.predicted / self.published

    @property
    def error(self) -> float:
        return self.ratio - 1


def predict(run: PublishedRun, kernel_term: bool = True, compute_scale: float = 1.0) -> float:
    """The run's published figure as the time model predicts it, uncalibrated; ``kernel_term=False`` prices its
    attention at the device curves' rate whatever kernel it ran; ``compute_scale`` scales the device's GEMM and
    attention rates (its peaks)."""
    profile = datasheet_profile(get_hardware(run.hardware))
    if compute_scale != 1.0:
        profile = dataclasses.replace(
            profile, peak_flop_per_s={d: p * compute_scale for d, p in profile.peak_flop_per_s.items()},
            attention_flop_per_s=profile.attention_flop_per_s * compute_scale)
    if kernel_term and run.attention_efficiency is not None:
        # Counted in full, a causal kernel's rate is twice what it executes (headroom.core.timing.step.datasheet_profile).
        executed = profile.peak_flop_per_s["bf16"] * run.attention_efficiency
        profile = dataclasses.replace(profile, attention_flop_per_s=2 * executed)
    accumulation = run.global_batch // run.config.dp // run.config.micro_batch
    predicted = estimate(run.spec, run.config, profile.device, accumulation)
    cluster = default_cluster(run.hardware, inter=run.inter) if run.gpus > 1 else None
    step_s = step_time(predicted, profile, accumulation, cluster).total_s
    if run.unit == "tflop_per_s_per_gpu":
        return megatron_eq3_flops(run.spec, run.global_batch, run.config.seq_len) / step_s / run.gpus / 1e12
    if run.unit == "mfu":
        return (megatron_model_flops(run.spec, run.global_batch, run.config.seq_len) / step_s / run.gpus
                / profile.peak_flop_per_s["bf16"])
    return run.global_batch * run.config.seq_len / step_s / run.gpus


def _configuration(run: PublishedRun) -> str:
    lay = run.config.layout
    schedule = f" v{lay.virtual_stages}" if lay.virtual_stages > 1 else ""
    return (f"{run.gpus:,} x {run.hardware}, tp {lay.tp}{' +sp' if lay.sp else ''} pp {lay.pp}{schedule} dp {lay.dp} "
            f"zero {lay.zero}{' no reshard' if lay.reshard_after_forward is False else ''}, "
            f"micro {run.config.micro_batch}, batch {run.global_batch}, {run.config.recompute}, {run.config.stack}, "
            f"{run.config.precision}" + (f" + fp8 {run.config.fp8}" if run.config.float8 is not None else "")
            + (" (fp8 param gather)" if run.config.fp8_params else "")
            + (" (first and last blocks bf16)" if run.config.first_last_bf16 else "")
            + (f", {run.inter}" if run.gpus > 8 else "")
            + (f", {run.attention_kernel} attention" if run.attention_kernel else ""))


UNITS = {"tflop_per_s_per_gpu": "TFLOP/s per GPU", "tokens_per_s_per_gpu": "tokens/s per GPU", "mfu": "MFU"}
"""How the tables name each PublishedRun.unit."""


def _rows(runs: tuple[PublishedRun, ...]) -> list[Row]:
    return [Row(run.name, run.source, _configuration(run), run.published, predict(run), UNITS[run.unit])
            for run in runs]


def published_rows() -> list[Row]:
    return _rows(RUNS)


def independent_rows() -> list[Row]:
    """Published runs outside the validation sets (published_runs.INDEPENDENT), predicted the same way."""
    return _rows(INDEPENDENT)


def h200_rows() -> list[Row]:
    profile = h200_profile()
    return [Row(label(r), "H200 reference run (tests/data/reference)", "1 x h200, llama3.2-1b, s 2048, amp-bf16",
                r["median_s"], predicted_s(r, profile), "s per step") for r in train_steps()]


def spearman(xs: list[float], ys: list[float]) -> float:
    """Rank correlation (no ties expected)."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        for rank, i in enumerate(order):
            out[i] = rank
        return out
    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    return 1 - 6 * sum((a - b) ** 2 for a, b in zip(rx, ry, strict=True)) / (n * (n * n - 1))


def model_groups(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    """The published rows of one model in one table (llm-foundry's sweeps: sequence length, GPUs, micro-batch),
    three or more."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for run, row in zip(RUNS, rows, strict=True):
        groups.setdefault((run.source, run.spec.name), []).append(row)
    return {key: group for key, group in groups.items() if len(group) >= 3}


def group_rank_correlations(rows: list[Row]) -> dict[tuple[str, str], float]:
    """Rank correlation of predicted and published throughput within each model group."""
    return {key: spearman([r.predicted for r in group], [r.published for r in group])
            for key, group in model_groups(rows).items()}


@dataclass(frozen=True)
class DevicePairs:
    """llm-foundry's runs of one configuration (model, sequence, micro-batch, GPUs, checkpointing, precision,
    sharding) on both the H100 and the A100 80GB: how much faster the H100 ran, and how much faster the model
    says it runs, pair by pair."""

    measured: tuple[float, ...]
    predicted: tuple[float, ...]

    @property
    def ratios(self) -> list[float]:
        """Measured over predicted speed-up, pair by pair."""
        return [m / p for m, p in zip(self.measured, self.predicted, strict=True)]

    def text(self) -> str:
        ratios = self.ratios
        return (f"llm-foundry, the same configuration on the H100 and the A100 80GB ({len(ratios)} pairs): the H100 "
                f"measured a median {statistics.median(self.measured):.2f}x the A100, the model says "
                f"{statistics.median(self.predicted):.2f}x; measured / predicted speed-up median "
                f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})")


def device_pairs(rows: list[Row]) -> DevicePairs:
    """The H100 / A100 80GB pairs of llm-foundry's tables (`DevicePairs`)."""
    by_config: dict[tuple, dict[str, Row]] = {}
    for run, row in zip(RUNS, rows, strict=True):
        if run.hardware not in ("h100-sxm", "a100-sxm-80gb") or not run.source.startswith(LLM_FOUNDRY):
            continue
        c = run.config
        key = (run.spec.name, c.seq_len, c.micro_batch, run.gpus, str(c.recompute), c.precision, c.layout.zero)
        by_config.setdefault(key, {})[run.hardware] = row
    pairs = [(found["h100-sxm"], found["a100-sxm-80gb"]) for found in by_config.values() if len(found) == 2]
    return DevicePairs(tuple(h.published / a.published for h, a in pairs),
                       tuple(h.predicted / a.predicted for h, a in pairs))


def markdown(rows: list[Row]) -> str:
    lines = ["| run | source | configuration | published | predicted | error |", "|---|---|---|---|---|---|"]
    for r in rows:
        fmt = {"s per step": ".3f", "MFU": ".1%"}.get(r.unit, ",.0f")
        lines.append(f"| {r.name} | {r.source} | {r.configuration} | {r.published:{fmt}} {r.unit} | "
                     f"{r.predicted:{fmt}} | {r.error:+.1%} |")
    return "\n".join(lines)


def _errors(rows: list[Row]) -> str:
    errors = [abs(r.error) for r in rows]
    return f"median {statistics.median(errors):.1%}, worst {max(errors):.1%} over {len(rows)}"


H100_NVL_OVER_SXM = 835.5 / 989.4
"""The H100 NVL's dense bf16 peak over the SXM's (NVIDIA's H100 datasheet, sparse figures halved): torchtitan puts
its 500 W Grand Teton part's "between SXM and NVL" (docs/performance.md)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", action="store_true", help="print only the markdown table of every row")
    args = parser.parse_args()
    published, h200 = published_rows(), h200_rows()
    if args.markdown:
        print(markdown(published + h200))
        return
    print(markdown(published))
    print()
    for source in sorted({r.source for r in published}):
        print(f"{source}: {_errors([r for r in published if r.source == source])}")
    print(f"all published runs: {_errors(published)}")
    print(device_pairs(published).text())
    mpt = [run for run in RUNS if run.source.startswith(LLM_FOUNDRY)]
    without = [Row(run.name, run.source, "", run.published, predict(run, kernel_term=False), "") for run in mpt]
    print(f"llm-foundry runs with their attention at the device curves' rate (FlashAttention-2's on the A100, "
          f"cuDNN's on Hopper): {_errors(without)}")
    titan = [run for run in RUNS if run.hardware == GRAND_TETON]
    low = [Row(run.name, run.source, "", run.published, predict(run, compute_scale=H100_NVL_OVER_SXM), "")
           for run in titan]
    print(f"torchtitan's runs with the 500 W part's GEMMs and attention at the H100 NVL's peak over the SXM's "
          f"({H100_NVL_OVER_SXM:.3f}, the low end torchtitan gives): {_errors(low)}")
    print(f"H200 reference steps (step time, uncalibrated): {_errors(h200)}")
    print(f"rank correlation of predicted and measured step time over the H200 run's 22 configurations: "
          f"{spearman([r.predicted for r in h200], [r.published for r in h200]):.3f}")
    correlations = sorted(group_rank_correlations(published).values())
    print(f"rank correlation of predicted and published throughput within each model's sweep ({len(correlations)} "
          f"groups of 3-11 runs): median {statistics.median(correlations):.2f}, "
          f"{sum(c >= 0.9 for c in correlations)} of {len(correlations)} at 0.9 or more, lowest {correlations[0]:.2f}")
    for budget, outcome in regrets(h200_profile()).items():
        shown = f"{outcome.regret:.1%}" if outcome.regret is not None else outcome.outcome
        print(f"H200 regret at {budget}: {shown} (picked {outcome.recommended}; best measured that fit "
              f"{outcome.best})")
    print(_pinned_plan_timing())
    independent = independent_rows()
    print()
    print("Independent check, nothing fitted to it (docs/time-model.md):")
    print(markdown(independent))
    table_2 = [r for r in independent if r.source == NARAYANAN_TABLE_2]
    for scheme in ("ZeRO-3", "PTD-P"):
        rows = [r for r in table_2 if f", {scheme}," in r.name]
        print(f"{NARAYANAN_TABLE_2}, {scheme}: {_errors(rows)}; predicted / published "
              f"{min(r.ratio for r in rows):.2f}-{max(r.ratio for r in rows):.2f}")
    titan = [r for r in independent if r.source == TORCHTITAN_A100]
    print(f"{TORCHTITAN_A100}: {_errors(titan)}; predicted / published "
          f"{min(r.ratio for r in titan):.2f}-{max(r.ratio for r in titan):.2f}")
    selective, full = (next(r for r in independent if r.source == KORTHIKANTI and what in r.name)
                       for what in ("selective", "full"))
    print(f"{KORTHIKANTI}: selective recomputation with sequence parallelism over every layer recomputed, "
          f"measured {selective.published / full.published:.3f}x, the model {selective.predicted / full.predicted:.3f}x")


def _pinned_plan_timing() -> str:
    """A pinned plan in process: llama3-70b at 8,192 tokens on tp 8 x pp 4 x dp 2 (64 H100s), micro-batch 1 under
    full recompute, the first time (nothing cached for it) and the best of ten more."""
    from headroom.core.planning.planner import PlanRequest, plan
    from headroom.core.specs.config import TrainConfig
    from headroom.core.specs.layout import Layout
    from headroom.core.specs.presets import get_preset
    from headroom.core.specs.recompute import parse_policy

    request = PlanRequest(spec=get_preset("llama3-70b"), global_batch=64, micro_batch=1,
                          recompute=parse_policy("full"),
                          train=TrainConfig(seq_len=8192, layout=Layout(tp=8, sp=True, pp=4, dp=2)))
    profile = datasheet_profile(get_hardware("h100-sxm"))
    started = time.perf_counter()
    first = plan(request, profile)
    cold = time.perf_counter() - started
    warm = []
    for _ in range(10):
        started = time.perf_counter()
        plan(request, profile)
        warm.append(time.perf_counter() - started)
    assert first.pinned is not None
    return (f"pinned plan, llama3-70b on 64 H100s (tp 8, pp 4, dp 2): {cold * 1e3:.1f} ms the first time, "
            f"{min(warm) * 1e3:.1f} ms after (target: under 50 ms)")


if __name__ == "__main__":
    main()
