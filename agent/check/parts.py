"""The parts of the GPU check (benchmarks/gpu_check.py), each a function of a `Context`.

Each part runs in a process of its own (a part that overruns its time or
breaks the CUDA context costs only itself), records real measurements into
the check's result store, and returns a JSON-able summary. The same code
runs on a CPU at toy sizes.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from sqlalchemy import select

from headroom.agent import bench_matmul, bench_train
from headroom.agent.check import masked_sdpa
from headroom.agent.clocks import read_clocks
from headroom.agent.compiled import inductor_kernels
from headroom.agent.fingerprint import datasheet_spec, device_name, fingerprint
from headroom.agent.ledger_check import LedgerCase, build, check
from headroom.agent.runner import profile_from_store, run_suite
from headroom.agent.sdpa import kernel_label, kernels_run
from headroom.agent.suites import GPU_TRAIN, SMOKE_TRAIN, TrainSweep
from headroom.core.errors import ConfigError
from headroom.core.planning.planner import PlanRequest, plan
from headroom.core.planning.regret import MeasuredConfig, regret, tight_budget
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.layout import Layout
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.timing.step_ops import forward_ops, ops_config
from headroom.core.units import GB
from headroom.db.models import TrainStepResult
from headroom.db.profiles import build_profile, calibration_for
from headroom.db.store import Store, open_store
from headroom.db.validate import record_values

POLICIES = ("none", "full", "every-2", "selective", "op-selective", "offload")
PRECISIONS = ("fp32", "amp-bf16", "bf16-pure")
FUSED_BACKENDS = ("flash", "efficient", "cudnn")
REPEATS = 5
"""Extra measurements of the suite's largest bf16 matmul, to judge its stability."""


@dataclass(frozen=True, slots=True)
class Context:
    device: torch.device
    store_url: str
    deadline: float
    """``time.perf_counter()`` after which the part starts nothing new."""

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"

    def left_s(self) -> float:
        return self.deadline - time.perf_counter()

    def store(self) -> Store:
        return open_store(self.store_url, mode="write")


def train_sweep(ctx: Context) -> TrainSweep:
    """The suite's training sweep: a ~1B llama at s=2048 on a GPU, the toy llama on a CPU."""
    return GPU_TRAIN if ctx.gpu else SMOKE_TRAIN


# ---- environment ------------------------------------------------------------------------------


def sdpa_choice(device: torch.device, dtype: torch.dtype, gqa: bool) -> str:
    """The kernel SDPA runs by itself for a causal (b=1, 32 heads, d=128) input; ``gqa``: 8 key/value heads."""
    s = 2048 if device.type == "cuda" else 128
    q = torch.randn(1, 32, s, 128, device=device, dtype=dtype)
    k, v = (torch.randn(1, 8 if gqa else 32, s, 128, device=device, dtype=dtype) for _ in range(2))
    try:
        _, ops = kernels_run(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa))
    except RuntimeError as err:
        return f"error: {str(err).splitlines()[0][:200]}"
    return kernel_label(ops)


def environment(ctx: Context) -> dict[str, Any]:
    fp = fingerprint(ctx.device)
    return {
        "fingerprint": {k: v for k, v in record_values(fp).items() if k != "digest"},
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "clocks": read_clocks(ctx.device),
        "sdpa": {
            "bf16 GQA causal": sdpa_choice(ctx.device, torch.bfloat16, gqa=True),
            "fp32 causal": sdpa_choice(ctx.device, torch.float32, gqa=False),
        },
        "sdpa_masked": masked_sdpa.probes(ctx.device),
    }


# ---- the ledger against the probe -------------------------------------------------------------


def ledger_cases(gpu: bool) -> list[LedgerCase]:
    """Full-size layers first (the most telling), then the small-model matrix, then forced backends."""
    # torchtitan's checkpointing (headroom.core.specs.stack): its per-op policy caches the CUDA attention kernels, not the CPU's.
    titan = [LedgerCase("llama3.2-1b" if gpu else "bench-llama-tiny", 2 if gpu else 4, 2048 if gpu else 32,
                        1 if gpu else 2, "flash", 0.0, p, x, stack="torchtitan")
             for p in ("full", "op-selective") for x in ("amp-bf16", "bf16-pure")]
    if not gpu:
        small = [LedgerCase("bench-llama-tiny", 4, 32, 2, "flash", 0.0, p, x) for p in POLICIES for x in PRECISIONS]
        small += [LedgerCase("bench-gpt-tiny", 4, 32, 2, "standard", 0.1, p, x) for p in POLICIES for x in PRECISIONS]
        forced = [LedgerCase("bench-llama-tiny", 4, 32, 2, "flash", 0.0, "none", "fp32", b) for b in ("flash", "math")]
        return small + titan + forced
    full = [
        LedgerCase(model, 2, seq, 1, attention, dropout, policy, precision)
        for model, seq, dropout in (("llama3.2-1b", 2048, 0.0), ("gpt2-xl", 1024, 0.1))
        for attention, policy, precision in itertools.product(("flash", "standard"), POLICIES, PRECISIONS)
    ]
    matrix = [
        LedgerCase(f"bench-{block}-tiny", 4, 64, 2, attention, dropout, policy, precision)
        for block, attention, dropout, policy, precision in itertools.product(
            ("gpt", "llama"), ("standard", "flash"), (0.0, 0.1), POLICIES, PRECISIONS)
        if not (block == "llama" and dropout)
    ]
    forced = [dataclasses.replace(c, backend=b) for b in FUSED_BACKENDS for c in matrix if c.attention == "flash"]
    return full + titan + matrix + forced


def ledger(ctx: Context) -> dict[str, Any]:
    checks = []
    for case in ledger_cases(ctx.gpu):
        if ctx.left_s() <= 0:
            checks.append({"label": case.label, "case": dataclasses.asdict(case), "status": "not run",
                           "message": "the part's time budget was spent"})
            continue
        checks.append(check(case, ctx.device).to_dict())
        if ctx.gpu:
            torch.cuda.empty_cache()
    return {"checks": checks}


# ---- measurements into the store ---------------------------------------------------------------


def _record(ctx: Context, suite: str, cases=None) -> dict[str, Any]:
    """Run ``cases`` (None: the suite's own; a function: built from the open store) into the check's
    store; the run's summary."""
    with ctx.store() as store:
        cases = cases(store) if callable(cases) else cases
        report = run_suite(store, ctx.device, suite, cases=cases, deadline=ctx.deadline, quiet=False)
    by_kind: dict[str, float] = {}
    for (case, _), seconds in zip(report.rows, report.case_seconds, strict=True):
        by_kind[case.kind] = by_kind.get(case.kind, 0.0) + seconds
    return {"run_id": report.run_id, "seconds": report.seconds, "seconds_by_kind": by_kind,
            "statuses": {s: report.count(s) for s in ("ok", "oom", "error", "skipped") if report.count(s)}}


def suite(ctx: Context) -> dict[str, Any]:
    """The quick suite as `headroom agent run --suite quick` runs it (smoke sizes on a CPU)."""
    return _record(ctx, "quick")


def _train_cases(ctx: Context, setups: list[bench_train.TrainSetup], store: Store):
    provider = profile_from_store(store, device_name(ctx.device))
    return [bench_train.case(setup, provider) for setup in setups]


def offload(ctx: Context) -> dict[str, Any]:
    """The sweep's offload configurations (host copies are slow: the two smallest micro-batches)."""
    base = train_sweep(ctx)
    sweep = dataclasses.replace(base, micro_batches=base.micro_batches[:2], policies=("offload",))
    with ctx.store() as store:
        cases = _train_cases(ctx, sweep.setups(), store)
    return _record(ctx, "gpu-check", cases)


def repeat(ctx: Context) -> dict[str, Any]:
    """The suite's largest square matmul (bf16 on a GPU, fp32 on a CPU), measured again REPEATS times."""
    dtype, size = ("bf16", 8192) if ctx.gpu else ("fp32", 512)
    cases = [bench_matmul.case(dtype, size, size, size, label=f"repeat {i + 1}", budget_s=0.5) for i in range(REPEATS)]
    return _record(ctx, "gpu-check", cases) | {"dtype": dtype, "size": size}


# ---- FP8 training ------------------------------------------------------------------------------

FP8_RECIPES = ("off", "torchao-tensorwise", "torchao-rowwise")
"""bf16 and the float8 recipes; a Blackwell GPU runs MXFP8 too (its tensor cores; llama3.2-1b's widths and the
sweep's tokens divide by its blocks)."""
FP8_POLICIES = ("none", "full")


def fp8(ctx: Context) -> dict[str, Any]:
    """The sweep's model (on a CPU the toy llama: torch's CPU float8 GEMM takes seconds at the sweep's sizes)
    trained in bf16 and under each torchao float8 recipe (the reference stack, bf16-pure, no checkpointing and
    full), each step against its prediction: peak, saved bytes, step time. The store has no column for an FP8
    recipe, so these steps stay in the part's summary and are not stored."""
    hw = datasheet_spec(ctx.device)
    recipes = FP8_RECIPES + (("torchao-mxfp8",) if hw is not None and hw.mx_formats else ())
    return _variant_steps(ctx, {f"{recipe} {policy}": {"fp8": recipe, "recompute": parse_policy(policy)}
                                for recipe, policy in itertools.product(recipes, FP8_POLICIES)})


def compiled(ctx: Context) -> dict[str, Any]:
    """The same model and shape as the fp8 part (whose ``off`` rows are its eager steps), its blocks compiled as
    torchtitan compiles them (headroom.agent.compiled), without checkpointing and under full: peak, saved bytes
    (autograd's hooks alone), step time against the prediction, and the first step's time, which includes the
    compile. First one block compiled alone (`block_kernels`, seconds: the only measure of inductor's fusion
    here, so it runs before the steps can spend the part's time): what inductor fuses, beside the memory-bound ops
    the time model enumerates for the eager block. Not stored (the store has no column for it)."""
    spec, seq_len, micro = _variant_shape(ctx)
    kernels = block_kernels(ctx, spec, seq_len, micro)
    result = _variant_steps(ctx, {f"compiled {policy}": {"compile": True, "recompute": parse_policy(policy)}
                                  for policy in FP8_POLICIES})
    return result | {"kernels": kernels}


def block_kernels(ctx: Context, spec: ModelSpec, seq_len: int, micro: int) -> dict[str, Any]:
    """One torchtitan block of ``spec`` (bf16-pure, uncheckpointed) compiled alone on the device: inductor's
    generated kernels and extern kernels with their bytes, forward and backward graphs
    (headroom.agent.compiled.inductor_kernels), and the memory-bound ops and bytes (written and read) the time model
    enumerates for the same block run eagerly (headroom.core.timing.step_ops): the fusion a compiled plan's time
    does not model yet, measured."""
    config = TrainConfig(seq_len=seq_len, micro_batch=micro, precision="bf16-pure", stack="torchtitan")
    try:
        block = build(spec, config, ctx.device)[0].blocks[0]
        x = torch.randn(micro, seq_len, spec.hidden, device=ctx.device, dtype=next(block.parameters()).dtype,
                        requires_grad=True)
        graphs = inductor_kernels(block, x)
    except (RuntimeError, ConfigError) as err:  # out of memory, a compile that fails on this box
        return {"status": "error", "message": str(err).splitlines()[0][:300]}
    memory = [op for op in forward_ops(spec, ops_config(config), "cuda" if ctx.gpu else "cpu", 1).dense_block
              if op.kind == "memory"]
    return {"status": "ok", "model": spec.name, "graphs": graphs, "eager_memory_ops": len(memory),
            "eager_memory_bytes": sum(op.bytes + op.read_bytes for op in memory)}


def block(ctx: Context) -> dict[str, Any]:
    """The same model and shape as the fp8 part, under Megatron-LM's block recompute as the reference stack runs it
    (headroom.agent.recompute: a stage's first K blocks checkpointed one by one, the rest kept whole): a quarter and
    half of the ~1B llama's 16 blocks (the toy llama's first of its 2 on a CPU), beside none and full, against the
    prediction: peak, saved bytes, step time. Not stored: the regret part weighs the policies the sweep measured."""
    policies = ("none", "block-4", "block-8", "full") if ctx.gpu else ("none", "block-1", "full")
    return _variant_steps(ctx, {policy: {"recompute": parse_policy(policy)} for policy in policies})


def _variant_shape(ctx: Context) -> tuple[ModelSpec, int, int]:
    """The fp8, compile and block parts' model, sequence and micro-batch: the sweep's model at its sequence,
    micro-batch 2; on a CPU the toy llama, 32 tokens, one sequence."""
    sweep = train_sweep(ctx)
    return (get_preset(sweep.model), sweep.seq_len, 2) if ctx.gpu else (get_preset("bench-llama-tiny"), 32, 1)


def _variant_steps(ctx: Context, variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The sweep's model (on a CPU the toy llama) at the sweep's sequence, micro-batch 2 (1 on a CPU), bf16-pure on
    the reference stack, once for each of ``variants`` (a label -> the TrainConfig fields it sets), until the part's
    time is spent."""
    sweep = train_sweep(ctx)
    spec, seq_len, micro = _variant_shape(ctx)
    runs = {"steps": sweep.steps} if ctx.gpu else {"steps": 2, "warmup_steps": 1}
    steps = []
    with ctx.store() as store:
        provider = profile_from_store(store, device_name(ctx.device))
        for label, fields in variants.items():
            config = TrainConfig(seq_len=seq_len, micro_batch=micro, precision="bf16-pure", **fields)
            if ctx.left_s() <= 0:
                steps.append({"label": label, "status": "not run", "message": "the part's time budget was spent"})
                continue
            try:
                row = bench_train.measure(ctx.device, bench_train.TrainSetup(spec=spec, config=config, **runs),
                                          provider)
            except (RuntimeError, ConfigError) as err:  # no torchao, a recipe the device cannot run, a failed compile
                steps.append({"label": label, "status": "error", "message": str(err).splitlines()[0][:300]})
                continue
            steps.append({"label": label, "status": row.status or "ok", "message": row.message,
                          "predicted_peak_bytes": row.predicted_peak_bytes,
                          "peak_allocated_bytes": row.peak_allocated_bytes,
                          "predicted_activation_bytes": row.predicted_activation_bytes,
                          "activation_bytes": row.activation_bytes,
                          "predicted_step_time_s": row.predicted_step_time_s, "median_s": row.median_s,
                          "first_step_s": (row.details or {}).get("first_step_s")})
            if ctx.gpu:
                torch.cuda.empty_cache()
    return {"model": spec.name, "seq_len": seq_len, "micro_batch": micro, "steps": steps}


# ---- regret ---------------------------------------------------------------------------------


def _measured(store: Store, sweep: TrainSweep) -> list[MeasuredConfig]:
    """Every configuration of the sweep's model, sequence and global batch the store holds (the latest of each)."""
    query = select(TrainStepResult).where(
        TrainStepResult.model_name == sweep.model, TrainStepResult.seq_len == sweep.seq_len,
        TrainStepResult.precision == sweep.precision).order_by(TrainStepResult.id)
    with store.session() as session:
        rows = session.scalars(query).all()
    latest = {}
    for row in rows:
        if row.micro_batch * row.accumulation_steps != sweep.global_batch:
            continue
        try:
            run = row.run_config
        except ConfigError:  # written by an older Headroom in terms today's cannot read: no plan can choose it
            continue
        latest[run.choice] = MeasuredConfig(run, row.status, row.tokens_per_s, row.peak_reserved_bytes)
    return list(latest.values())


def regret_part(ctx: Context) -> dict[str, Any]:
    """Plans from this box's own measurements at 80 GB and at a budget that forces checkpointing.

    A recommendation the sweep did not measure is measured now, so every plan is judged by what
    really happened.
    """
    sweep = train_sweep(ctx)
    name = device_name(ctx.device)
    request = PlanRequest(spec=get_preset(sweep.model), train=sweep.base, global_batch=sweep.global_batch,
                          allow_offload=True)
    with ctx.store() as store:
        with store.session() as session:
            profile = build_profile(session, name)
            calibration = calibration_for(session, name, profile)

        def judge(label: str, budget: int):
            result = plan(dataclasses.replace(request, budget_bytes=budget), profile, calibration)
            measured = _measured(store, sweep)
            choice = result.recommendation
            if choice is not None and ctx.left_s() > 0:
                key = (choice.config.micro_batch, choice.accumulation_steps, str(choice.config.recompute))
                if key not in {m.key for m in measured}:
                    setup = bench_train.TrainSetup(spec=request.spec, config=choice.config,
                                                   accumulation_steps=choice.accumulation_steps, steps=sweep.steps)
                    _record(ctx, "gpu-check", _train_cases(ctx, [setup], store))
                    measured = _measured(store, sweep)
            outcome = regret(result, measured)
            entry = {"budget": label, **dataclasses.asdict(outcome), "regret": outcome.regret,
                     "predicted_tokens_per_s": choice.tokens_per_s if choice else None}
            return result, measured, entry

        roomy, measured, entry = judge("80 GB", 80 * GB)
        plans = [entry]
        tight = tight_budget(roomy, measured)
        if tight is None:
            plans.append({"budget": "tight", "outcome": "no budget here rules out every configuration without "
                                                         "checkpointing while another fits"})
        else:
            plans.append(judge(f"{tight / GB:.3f} GB (tight)", tight)[2])
    return {"plans": plans, "calibration": calibration.to_dict()}


def multi_rank(ctx: Context) -> dict[str, Any]:
    """Collectives over every GPU, a 2-rank FSDP2 step and a 2-stage 1F1B pipeline of 4 micro-batches where
    there are two or more GPUs; with one GPU (or a CPU) only the 1-rank variant: a training step through
    torch's launcher, as multi-rank steps run."""
    from headroom.agent import bench_collectives, train_ranks

    gpus = torch.cuda.device_count() if ctx.gpu else 0
    ranks = gpus if gpus > 1 else 1
    spec = get_preset("llama3.2-1b" if ctx.gpu else "bench-llama-tiny")
    seq_len = 2048 if ctx.gpu else 64
    layout = Layout(dp=2, zero=3) if ranks > 1 else Layout()
    setup = bench_train.TrainSetup(spec=spec, steps=3, config=TrainConfig(
        seq_len=seq_len, micro_batch=1, precision="amp-bf16" if ctx.gpu else "fp32", layout=layout))

    setups = [setup]
    if ranks > 1:  # an untied model: a pipeline of a tied one is not built (headroom.agent.pipeline_stages)
        setups.append(bench_train.TrainSetup(spec=get_preset("bench-llama-small"), steps=3, accumulation_steps=4,
                                             config=TrainConfig(seq_len=512, micro_batch=1, precision="amp-bf16",
                                                                layout=Layout(pp=2))))

    def cases(store: Store) -> list:
        profile = profile_from_store(store, device_name(ctx.device))
        found = train_ranks.cases(setups, ctx.device.type, profile)  # one launch: both have 2 ranks
        return found + (bench_collectives.cases(ctx.device.type, ranks) if ranks > 1 else [])

    ran = [f"training step, {train_ranks.layout_label(s.config.layout)}" for s in setups]
    not_run = []
    if ranks > 1:
        ran.append(f"collectives over {ranks} GPUs")
    else:
        not_run.append(f"collectives and sharded steps: {gpus or 'no'} GPU(s) here, they need 2 or more")
    return {"ranks": ranks, "ran": ran, "not_run": not_run, **_record(ctx, "multi-rank", cases)}


PARTS: dict[str, tuple[Callable[[Context], dict[str, Any]], float, float]] = {
    # name: (function, seconds on a GPU, seconds on a CPU); the GPU budgets sum to 9 min 20 s (most parts end well
    # inside theirs). A budget is a deadline: the CPU's quick suite takes 32 s on a quiet 2-core box and more than 60 s beside a busy test worker,
    # whose lost training steps would leave the regret part nothing to judge.
    "environment": (environment, 20, 10),
    "ledger": (ledger, 60, 20),
    "suite": (suite, 160, 120),
    "offload": (offload, 45, 10),
    "repeat": (repeat, 20, 5),
    "fp8": (fp8, 30, 15),
    "compile": (compiled, 60, 30),
    "block": (block, 25, 10),
    "regret": (regret_part, 50, 10),
    "multi-rank": (multi_rank, 90, 30),
}
