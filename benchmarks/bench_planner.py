"""Planner speed: candidates evaluated per second on full llama3-70b plans.

    python benchmarks/bench_planner.py [--search-only]

First, one fixed layout at a time: varies data-parallel ranks and sharding
stages at s=8192 and prints, per plan, the candidates evaluated, the wall time
and the rate. Then the targets (best of 5, in process, with and without the
advice a plan prints): llama3-70b over every policy (under 20 ms), a 200-layer
model (under 100 ms) and a llama3-70b plan in which nothing fits (under 100
ms); and the process time of `headroom plan` over `headroom estimate` (within
1.3x; with a store present, the H200 reference imported, within 1.5x). Then the cluster search: llama3-70b over 64 H100s with every axis free
(tp x pp x cp x dp x sharding stage x micro-batch x recompute), and 512 GPUs,
printing the layouts searched, the candidates evaluated, the seconds per plan
and milliseconds per layout, and the seconds its JSON takes; then GPT-3 175B
over 1,536 and 16,384 A100s against the layout search's targets, and the same searches exhaustive (``prune=False``:
every candidate of every layout, as ``headroom plan --exhaustive``), with the ratio.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from headroom.core.planning.advice import plan_and_advise
from headroom.core.planning.planner import PlanRequest, plan, plan_to_dict
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.interconnect import default_cluster
from headroom.core.specs.layout import Layout
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.presets import get_preset
from headroom.core.timing.step import datasheet_profile

REFERENCE_BUNDLE = Path(__file__).resolve().parents[1] / "tests" / "data" / "reference" / "nvidia-h200-2026-11-30.json.gz"


def main() -> None:
    profile = datasheet_profile(get_hardware("h100-sxm"))
    spec = get_preset("llama3-70b")
    print(f"{'dp':>4} {'zero':>4} {'candidates':>10} {'fitting':>8} {'seconds':>8} {'cand/s':>8}")
    total_candidates, total_s = 0, 0.0
    for dp in (16, 32, 64, 128):
        for zero, kept in ((1, None), (3, False), (3, None)):  # "3k": FSDP kept gathered, plain PyTorch's ZeRO-2
            layout = Layout(dp=dp, zero=zero, reshard_after_forward=kept)
            request = PlanRequest(spec=spec, train=TrainConfig(seq_len=8192, layout=layout), global_batch=2 * dp * 8)
            start = time.perf_counter()
            result = plan(request, profile)
            elapsed = time.perf_counter() - start
            n = len(result.candidates) + len(result.rejected)
            total_candidates, total_s = total_candidates + n, total_s + elapsed
            print(f"{dp:>4} {str(zero) + ('k' if kept is False else ''):>4} {n:>10} {len(result.candidates):>8} {elapsed:>8.3f} {n / elapsed:>8.0f}")
    print(f"all: {total_candidates} candidates in {total_s:.2f} s = {total_candidates / total_s:.0f} candidates/s, "
          f"{total_s / 12:.3f} s per plan")


def _best_s(fn, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def targets() -> None:
    """The issue's targets, in process and per process."""
    profile = datasheet_profile(get_hardware("h100-sxm"))
    spec = get_preset("llama3-70b")
    deep = dataclasses.replace(spec, name="llama3-70b x 200 layers", n_layers=200)
    print(f"\n{'plan':<36}{'candidates':>11}{'plan ms':>9}{'+ advice ms':>13}{'target ms':>11}")
    for label, model, layout, batch, target in (
        ("llama3-70b, dp 8 zero 3", spec, Layout(dp=8, zero=3), 64, 20),
        ("200 layers, dp 8 zero 3", deep, Layout(dp=8, zero=3), 64, 100),
        ("llama3-70b on one GPU (nothing fits)", spec, Layout(), 32, 100),
    ):
        request = PlanRequest(spec=model, train=TrainConfig(seq_len=4096, layout=layout), global_batch=batch)
        result = plan(request, profile)
        bare = _best_s(lambda request=request: plan(request, profile))
        advised = _best_s(lambda request=request: plan_and_advise(request, profile))
        n = len(result.candidates) + len(result.rejected)
        print(f"{label:<36}{n:>11}{bare * 1e3:>9.1f}{advised * 1e3:>13.1f}{target:>11}")
    cli = [sys.executable, "-m", "headroom.cli.main"]
    estimate_s = _best_s(lambda: subprocess.run([*cli, "estimate", "--model", "llama3-8b"], capture_output=True))
    plan_s = _best_s(lambda: subprocess.run([*cli, "plan", "--model", "llama3-8b", "--dp", "8", "--zero", "3",
                                             "--global-batch", "64", "--hardware", "h100-sxm"], capture_output=True))
    print(f"process: headroom estimate {estimate_s:.3f} s, headroom plan {plan_s:.3f} s, "
          f"ratio {plan_s / estimate_s:.2f} (target 1.3)")
    with tempfile.TemporaryDirectory() as folder:  # a store present, as after the quick start: the H200 reference
        store = f"sqlite:///{folder}/results.db"
        subprocess.run([*cli, "db", "import", str(REFERENCE_BUNDLE), "--db", store], capture_output=True, check=True)
        env = os.environ | {"HEADROOM_DB": store}
        stored_s = _best_s(lambda: subprocess.run([*cli, "plan", "--model", "llama3-8b", "--dp", "8", "--zero", "3",
                                                   "--global-batch", "64", "--hardware", "h100-sxm"],
                                                  capture_output=True, env=env))
    print(f"process with a store present: headroom plan --hardware h100-sxm {stored_s:.3f} s, "
          f"ratio {stored_s / estimate_s:.2f} to estimate (target 1.5)")


def search() -> None:
    """llama3-70b, s=8192, every axis free: 64 GPUs at a global batch of 512 sequences (4M tokens) and 512 GPUs at
    2,048 (16M tokens, Llama 3's); then the plan's JSON (`headroom plan --json`) of each."""
    profile = datasheet_profile(get_hardware("h100-sxm"))
    for gpus, batch in ((64, 512), (512, 2048)):
        request = PlanRequest(spec=get_preset("llama3-70b"), train=TrainConfig(seq_len=8192), global_batch=batch,
                              gpus=gpus)
        start = time.perf_counter()
        result = plan(request, profile)
        elapsed = time.perf_counter() - start
        start = time.perf_counter()
        plan_to_dict(result)
        as_json = time.perf_counter() - start
        n = len(result.candidates) + len(result.rejected)
        layouts = len(result.layouts) + len(result.pruned)
        best = result.recommendation
        print(f"\nsearch: llama3-70b on {gpus} GPUs: {layouts} layouts ({len(result.layouts)} searched, "
              f"{sum(o.fits for o in result.layouts)} fit, {len(result.pruned)} left out by their floors), {n} "
              f"candidates evaluated, {elapsed:,.2f} s per plan, {elapsed * 1000 / layouts:.1f} ms per layout; its "
              f"JSON {as_json:,.2f} s")
        if best is not None:
            print(f"  recommended: {best.layout}; {best.label}; {best.tokens_per_s / gpus:,.0f} tokens/s per GPU")


def _peak_rss_mb() -> float:
    """This process's peak resident memory: Linux's VmHWM (ru_maxrss keeps the high-water mark of the process that
    forked this one across exec), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gpt_175b() -> None:
    """GPT-3 175B (Narayanan et al. 2021's 96 layers of 12,288, sequence 2048) on A100s, every axis free under
    Megatron-LM: 1,536 GPUs at a global batch of 1,536 (the paper's run) and 16,384 at 16,384, against the layout
    search's targets (under 1 s and under 3 s on 2 cores, peak memory under 300 MB: the peak RSS of a process of
    its own so far, imports included)."""
    spec = ModelSpec(name="gpt-175b", block="gpt", n_layers=96, hidden=12288, n_heads=96, n_kv_heads=96,
                     ffn_hidden=4 * 12288, vocab_size=51200, max_seq_len=2048, tied_embeddings=True, bias="all")
    profile = datasheet_profile(get_hardware("a100-sxm-80gb"))
    train = TrainConfig(seq_len=2048, precision="bf16-master", optimizer="adam", attention="standard", dropout=0.1,
                        stack="megatron")
    for gpus, target in ((1536, 1.0), (16384, 3.0)):
        request = PlanRequest(spec=spec, train=train, global_batch=gpus, gpus=gpus,
                              cluster=default_cluster("a100-sxm-80gb", inter="ib-hdr"))
        start = time.perf_counter()
        result = plan(request, profile)
        elapsed = time.perf_counter() - start
        peak_mb = _peak_rss_mb()
        n = len(result.candidates) + len(result.rejected)
        print(f"\nsearch: gpt-175b on {gpus:,} A100s: {len(result.layouts)} layouts searched, {len(result.pruned)} left "
              f"out by their floors, {n} candidates, {elapsed:,.2f} s (target {target:g} s); the process's peak RSS so "
              f"far {peak_mb:,.0f} MB (target 300)")
        start = time.perf_counter()
        whole = plan(request, profile, prune=False)
        exhaustive = time.perf_counter() - start
        same = (whole.recommendation.layout, whole.recommendation.config) == (result.recommendation.layout,
                                                                             result.recommendation.config)
        print(f"  exhaustive (--exhaustive): {len(whole.layouts)} layouts, "
              f"{len(whole.candidates) + len(whole.rejected)} candidates, {exhaustive:,.2f} s: pruning "
              f"{exhaustive / elapsed:,.1f}x faster; the same recommendation: {same}")


if __name__ == "__main__":
    if "--gpt-175b" in sys.argv:  # in a process of its own, so that its peak RSS is its own
        gpt_175b()
        sys.exit()
    if "--search-only" not in sys.argv:
        main()
        targets()
    search()
    subprocess.run([sys.executable, __file__, "--gpt-175b"], check=True)
