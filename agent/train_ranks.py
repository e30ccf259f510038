"""Training steps run by several ranks at once: DDP, ZeRO-1, FSDP2, tensor (+sequence) and pipeline parallelism.

The agent's decoder (agent/model.py) trains on ``tp x dp`` local processes
under torch's own parallelism, as torchtitan applies it to Llama:

- ``zero 0``: ``DistributedDataParallel``; ``zero 1``: DDP with torch's
  ``ZeroRedundancyOptimizer`` (optimizer states sharded over the ranks);
  ``zero 3``: FSDP2 ``fully_shard`` with torchtitan's units (embedding,
  each block, final norm with head) and ``MixedPrecisionPolicy`` (bf16
  gathers and fp32 gradient reductions under amp-bf16, which then runs
  without autocast, as torchtitan's FSDP does), each unit resharded after
  forward or kept gathered to backward as ``reshard_after_forward`` says
  (plain PyTorch's ZeRO-2, FSDP's ``SHARD_GRAD_OP``); ``zero 2`` itself is
  refused, torch has none of its own. Gradients are reduced every
  micro-batch, beside backward, as torchtitan's loop does: a layout asking
  otherwise (``defer_gradient_sync`` on, ``overlap_grad_reduce`` off) or for
  overlapped tensor parallelism is refused, planned but not measured.
- ``tp``: DTensor ``parallelize_module`` over the blocks and the vocabulary
  (headroom.agent.parallel.parallelize_decoder), with sequence parallelism when
  ``sp``; with ``dp`` as well, a 2-D mesh (tp innermost) and FSDP2 over dp.

- ``pp``: the decoder cut into stages and run by torch's GPipe or 1F1B
  schedule (headroom.agent.pipeline_stages), a pipeline alone (tp, cp, dp 1); each
  rank also reports the micro-batches its stage held in flight.

Context parallelism is not run here (the core plans it; the agent measures
it on no box yet): such a layout is refused by name.

Each rank reports its own row: step times, the exposed communication within
a step (headroom.agent.comm_time, from two profiled steps after the timed ones), its
peak memory (CUDA), the bytes one forward keeps for backward (agent/probe.py,
counting a DTensor by its local shard), and its parameter, gradient and
optimizer-state bytes as stored. The parent adds the core's prediction for
that rank, made at measurement time, and stores one row per rank.

A sweep's setups of one world size run in one launch, one after another
(`Launches`): on a GPU box each launch costs seconds of process start,
imports and NCCL initialisation, on a CPU most of a small step's time. A
rank that fails a setup ends its launch; the setups after it get a new one.
Each row says where in its launch it ran (``details.setup_in_launch``).

Rank side: ``python -m headroom.agent.train_ranks`` under torch's launcher; parent
side: `cases`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import itertools
import json
import statistics
import sys
import traceback
from collections.abc import Sequence

import torch

from headroom.agent import bench_train
from headroom.agent.cases import Case, skipped
from headroom.agent.launch import Launch, LaunchFailed, emit
from headroom.agent.rank import RankInfo, add_rank_flags, join, leave, settled
from headroom.core.errors import ConfigError
from headroom.core.memory.estimate import estimate, for_rank
from headroom.core.specs.layout import Layout, split_text
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.run_config import RunConfig
from headroom.core.specs.stack import get_stack
from headroom.core.timing.step import step_time
from headroom.db.models import TrainStepResult

PROFILED_STEPS = 2
STEP_MARK = "headroom.step"
"""The profiler span of one training step: its thread is the training thread."""


def check_layout(layout: Layout, spec: ModelSpec | None = None, micro_batches: int | None = None,
                 stack: str = "reference") -> None:
    """The layouts this trainer runs (for ``spec`` and ``micro_batches`` per step when given, under ``stack``'s
    kernels); any other is refused by name. Its data parallelism is its own (DDP, ZeroRedundancyOptimizer, FSDP2),
    so a stack that replicates or shards otherwise is measured where the two agree: torchtitan at zero 3 only."""
    chosen = get_stack(stack)
    if layout.zero == 2:  # whatever the ranks: the agent would record a zero 2 it did not run
        other = " or zero 1 (DDP + ZeroRedundancyOptimizer)" if 1 in chosen.sharding_stages else ""
        raise ConfigError(f"zero 2: torch has no ZeRO-2 of its own; measure zero 3 (FSDP2), kept gathered from "
                          f"forward to backward with --reshard-after-forward false{other}")
    _check_settings(layout)
    if layout.dp > 1:
        chosen.check_sharding(layout.zero)
        if layout.zero == 0 and chosen.replicates_through_fsdp:
            raise ConfigError(f"--stack {stack} --zero 0: {stack} replicates through FSDP2 (an all-reduce a unit, no "
                              "DDP buckets), which the agent does not run: measure --zero 3, or --stack reference")
    if layout.cp > 1:
        raise ConfigError(f"the agent trains tensor, pipeline and data parallelism; cp {layout.cp} is planned by "
                          "the core but not measured: use cp 1")
    if layout.ep > 1:
        raise ConfigError(f"the agent trains tensor, pipeline and data parallelism; ep {layout.ep} is planned by "
                          "the core but not measured: use ep 1")
    if layout.pp > 1:
        from headroom.agent.pipeline_stages import check_pipeline

        check_pipeline(layout, spec is not None and spec.tied_embeddings, micro_batches)
        return
    if layout.tp > 1 and layout.dp > 1 and layout.zero != 3:
        raise ConfigError(f"tp {layout.tp} with dp {layout.dp} runs as torchtitan does, FSDP2 over dp: use zero 3")
    if layout.tp > 1 and spec is not None:
        if spec.tied_embeddings or not spec.rotary:
            has = "tied embeddings" if spec.tied_embeddings else "learned positions"
            raise ConfigError(f"tp {layout.tp}: {spec.name} has {has}; the agent shards the vocabulary of untied "
                              "rotary (Llama-style) decoders only, as torchtitan does: measure it at tp 1, or plan it "
                              "(headroom plan)")
        if spec.n_heads % layout.tp or spec.n_kv_heads % layout.tp:
            raise ConfigError(f"tp {layout.tp}: {spec.name}'s {spec.n_heads} query and {spec.n_kv_heads} key/value "
                              "heads do not split over it; use a tp that divides both")


def _check_settings(layout: Layout) -> None:
    """The layout's settings the agent does not run, refused by name: it reduces gradients every micro-batch beside
    backward (torchtitan's loop) and runs tensor parallelism without overlap."""
    refused = {"defer_gradient_sync": (True, ("--defer-gradient-sync on: the agent reduces the gradients every "
                                              "micro-batch, as torchtitan's loop does")),
               "overlap_grad_reduce": (False, "--overlap-grad-reduce off: DDP reduces the gradients beside backward"),
               "tp_overlap": (True, "--tp-overlap on: the agent runs tensor parallelism without async TP")}
    for name, (value, why) in refused.items():
        if getattr(layout, name) is value:
            raise ConfigError(f"{why}; it is planned, not measured (headroom plan): leave it out")


# ---- the setup, across the process boundary -----------------------------------------------------


def setup_document(setup: bench_train.TrainSetup) -> dict:
    """``setup`` as JSON-ready data: the model, its run configuration's document, the steps to time."""
    return {"spec": setup.spec.to_dict(), "run": setup.run_config.to_dict(), "warmup_steps": setup.warmup_steps,
            "steps": setup.steps}


def setup_from_document(doc: dict) -> bench_train.TrainSetup:
    run = RunConfig.from_dict(doc["run"])
    return bench_train.TrainSetup(spec=ModelSpec(**doc["spec"]), config=run.train,
                                  accumulation_steps=run.accumulation_steps, warmup_steps=doc["warmup_steps"],
                                  steps=doc["steps"])


# ---- rank side ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Trainer:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    autocast: bool
    vocabulary_parallel: bool

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.autocast:
            with torch.autocast(tokens.device.type, dtype=torch.bfloat16):
                return self.model(tokens, targets)
        return self.model(tokens, targets)

    def context(self):
        """Where forward and backward run: under loss_parallel when the logits are vocabulary-sharded."""
        if self.vocabulary_parallel:
            from headroom.agent.parallel import vocabulary_loss

            return vocabulary_loss()
        return contextlib.nullcontext()

    def forward_backward(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """One step's micro-batches, forward and backward, the gradients accumulated."""
        for tokens, targets in batches:
            with self.context():
                loss = self.loss(tokens, targets) / len(batches)
                loss.backward()


def build(setup: bench_train.TrainSetup, info: RankInfo):
    """This rank's Trainer, or its headroom.agent.pipeline_stages.PipelineTrainer under pipeline parallelism."""
    if setup.config.layout.pp > 1:
        from headroom.agent import pipeline_stages

        return pipeline_stages.build(setup, info.rank, info.device)
    return _build(setup, info)


def _build(setup: bench_train.TrainSetup, info: RankInfo) -> Trainer:
    from torch.distributed.device_mesh import init_device_mesh

    from headroom.agent.parallel import parallelize_decoder, shard_fully

    cfg, layout, device = setup.config, setup.config.layout, info.device
    torch.manual_seed(0)  # every rank starts from the same weights and keeps its shard of them
    model = bench_train.build_model(setup, device)
    if layout.tp > 1 and layout.dp > 1:
        mesh = init_device_mesh(device.type, (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))
        tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
    else:
        mesh = init_device_mesh(device.type, (info.world,))
        tp_mesh = dp_mesh = mesh
    if layout.tp > 1:
        parallelize_decoder(model, tp_mesh, layout.sp)
    autocast = cfg.recipe.autocast
    if layout.dp > 1 and layout.zero == 3:
        bf16 = torch.bfloat16 if autocast else None
        shard_fully(model, dp_mesh, param_dtype=bf16, reduce_dtype=torch.float32 if autocast else None,
                    units="torchtitan", reshard_after_forward=cfg.data_parallel.reshard_after_forward)
        autocast = False  # FSDP's bf16 parameters are the mixed precision
    elif layout.dp > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    if layout.dp > 1 and layout.zero == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer_class = type(bench_train.make_optimizer(cfg.optimizer, [torch.zeros(1)], torch.device("cpu")))
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optimizer_class, lr=1e-4)
    else:
        optimizer = bench_train.make_optimizer(cfg.optimizer, _groups(model), device)
    return Trainer(model, optimizer, autocast, layout.tp > 1)


def _groups(model: torch.nn.Module) -> list[dict]:
    """Parameters in two groups, DTensors and plain tensors: a foreach or fused optimizer step cannot
    mix the two (tensor parallelism without sequence parallelism leaves the norms plain)."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    groups = [[p for p in params if isinstance(p, DTensor)], [p for p in params if not isinstance(p, DTensor)]]
    return [{"params": group} for group in groups if group]


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a DTensor counts its local shard)."""
    from headroom.agent.parallel import local_tensor

    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            storage = local_tensor(t).untyped_storage()
            seen[storage.data_ptr() or id(storage)] = storage.nbytes()
    return sum(seen.values())


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps this rank's shard in .optim
    return _storage_bytes(v for state in inner.state.values() for v in state.values() if torch.is_tensor(v))


def measure(setup: bench_train.TrainSetup, info: RankInfo) -> dict:
    """This rank's row (the fields the rank measures)."""
    from torch.profiler import ProfilerActivity, profile

    from headroom.agent.comm_time import exposed_s
    from headroom.agent.parallel import local_tensor
    from headroom.agent.probe import probe

    cfg, layout, device = setup.config, setup.config.layout, info.device
    trainer = build(setup, info)
    replica = info.rank // layout.tp  # tensor-parallel ranks of one replica read the same tokens
    generator = torch.Generator().manual_seed(1000 + replica)
    shape = (cfg.micro_batch, cfg.seq_len)
    batches = [tuple(torch.randint(0, setup.spec.vocab_size, shape, generator=generator).to(device) for _ in "xy")
               for _ in range(setup.accumulation_steps)]
    clock = bench_train._Clock(device)

    def step() -> tuple:
        with torch.profiler.record_function(STEP_MARK):
            return _step()

    def _step() -> tuple:
        start = clock.mark()
        trainer.forward_backward(batches)
        middle = clock.mark()
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return start, middle, clock.mark()

    cuda = device.type == "cuda"
    for _ in range(setup.warmup_steps):
        step()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    marks = [step() for _ in range(setup.steps)]
    if cuda:
        torch.cuda.synchronize(device)
    samples = [clock.seconds(s, e) for s, _, e in marks]
    row: dict = {
        "samples_s": samples, "median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples),
        "optimizer_median_s": statistics.median(clock.seconds(m, e) for _, m, e in marks),
    }
    if cuda:
        row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        row["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    # At rest between steps: parameters (FSDP's sharded ones) and optimizer states. Gradients exist
    # between backward and the optimizer: read after one more backward, then dropped.
    parameter_bytes = _storage_bytes(trainer.model.parameters())
    state_bytes = _state_bytes(trainer.optimizer)
    tokens, targets = batches[0]
    trainer.forward_backward(batches)
    gradient_bytes = _storage_bytes(p.grad for p in trainer.model.parameters())
    gradient_shards = {n: list(local_tensor(p.grad).shape) for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.optimizer.zero_grad(set_to_none=True)

    pipelined = layout.pp > 1
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with _pipeline_waits(pipelined), profile(activities=activities) as prof:
        for _ in range(PROFILED_STEPS):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    communication = exposed_s(prof, device.type, STEP_MARK) / PROFILED_STEPS

    with trainer.context():
        probed = probe(trainer.model, lambda: settled(trainer.loss(tokens, targets)))
    gathered = _units_gathered(trainer.model)  # before anything runs its backward
    in_flight = trainer.in_flight(batches) if pipelined else None
    row |= {
        "activation_bytes": probed.activation_bytes,
        "communication_median_s": communication,
        "details": {
            "parameter_bytes": parameter_bytes,
            "gradient_bytes": gradient_bytes,
            "gradient_shards": gradient_shards,
            "optimizer_state_bytes": state_bytes,
            "profiled_steps": PROFILED_STEPS,
            "probe": {"device_activation_bytes": probed.device_activation_bytes, "host_bytes": probed.host_bytes,
                      "parameter_copy_bytes": probed.parameter_copy_bytes,
                      # alive after forward though autograd saved none of them (a checkpoint cache, or a
                      # buffer a communication thread still held): where a mismatch would come from
                      "kept_unsaved": [f"{t.op} {list(t.shape)} {t.dtype} {t.nbytes} B in {t.module or 'model'}"
                                       for t in probed.tensors if t.kind == "activation" and not t.saved_by_autograd]},
        } | ({"in_flight": in_flight} if in_flight else {}) | (
            {"fsdp_units_gathered_after_forward": gathered} if gathered is not None else {}),
    }
    return row


def _units_gathered(model: torch.nn.Module) -> list[str] | None:
    """The FSDP units whose parameters are still gathered once a forward ends (those not resharded after it), by
    module name; None without FSDP. Reads FSDP2's own state (``FSDPParamGroup.is_unsharded``, torch/distributed/
    fsdp/_fully_shard/_fsdp_param_group.py)."""
    from torch.distributed.fsdp import FSDPModule

    groups = {name or "model": module._get_fsdp_state()._fsdp_param_group  # FSDP2 has no public one
              for name, module in model.named_modules() if isinstance(module, FSDPModule)}
    if not groups:
        return None
    return sorted(name for name, group in groups.items() if group is not None and group.is_unsharded)


def _pipeline_waits(pipelined: bool):
    if not pipelined:
        return contextlib.nullcontext()
    from headroom.agent.pipeline_stages import profiled_waits

    return profiled_waits()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The ranks of multi-rank training steps (run under torchrun).")
    add_rank_flags(parser)
    parser.add_argument("--setups", required=True,
                        help="the setups as a JSON object of index to setup (setup_document), run in order")
    args = parser.parse_args(argv)
    setups = {int(index): setup_from_document(doc) for index, doc in json.loads(args.setups).items()}
    info = join(args.device_type, args.timeout_s)
    for position, (index, setup) in enumerate(setups.items(), start=1):
        emit(begin_key(index), info.rank, {})
        row = _measured(setup, info)
        if row.get("status", "ok") == "ok":
            row["details"]["setup_in_launch"] = position  # the setups these processes ran before, plus one
        emit(step_key(index), info.rank, row)
        if row.get("status", "ok") != "ok":
            return 1  # the launcher stops the other ranks, which may be waiting on this one
        _release(info)
    leave()
    return 0


def begin_key(index: int) -> str:
    return f"begin {index}"


def step_key(index: int) -> str:
    return f"step {index}"


def _measured(setup: bench_train.TrainSetup, info: RankInfo) -> dict:
    """This rank's row for ``setup``, or an ``oom`` or ``error`` row saying why there is none."""
    try:
        return measure(setup, info)
    except torch.OutOfMemoryError as err:
        row = {"status": "oom", "message": str(err).splitlines()[0][:500]}
        if info.device.type == "cuda":
            row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(info.device)
        return row
    except Exception as err:
        traceback.print_exc(file=sys.stdout)
        return {"status": "error", "message": f"{type(err).__name__}: {str(err).strip()[:400]}"}
    finally:
        gc.collect()


def _release(info: RankInfo) -> None:
    """Between two setups: the last one's memory handed back, and every rank done with it."""
    if info.device.type == "cuda":
        torch.cuda.empty_cache()
    settled(torch.zeros(()))


# ---- parent side --------------------------------------------------------------------------------------


def base_row(setup: bench_train.TrainSetup, rank: int, world: int) -> TrainStepResult:
    return TrainStepResult(
        model_name=setup.spec.name, model_spec=setup.spec.to_dict(), **setup.run_config.columns(), rank=rank,
        world_size=world, layout=dataclasses.asdict(setup.config.layout),
    )


def cases(setups: Sequence[bench_train.TrainSetup], device_type: str, profile=None, timeout_s: float = 600.0,
          expected_s: float = 5.0) -> list[Case]:
    """One case per rank of each setup, in order; a setup whose predicted memory cannot fit is skipped.

    Consecutive setups of one world size are measured by one launch, started with the first of its
    cases: its ranks run them one after another, so a sweep pays for starting processes, importing
    torch and joining a process group once (`Launches`). ``profile`` (a HardwareProfile, or a function
    giving it) predicts the step time and its communication, over the profile's cluster (its measured
    collectives where it has them); without a profile only memory is predicted. ``timeout_s`` bounds
    each setup: a launch with no result for that long is killed.
    """
    from headroom.agent.safety import refusal

    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    planned = []
    for setup in setups:
        check_layout(setup.config.layout, setup.spec, setup.accumulation_steps, setup.config.stack)
        prediction = estimate(setup.spec, setup.config, device_type, setup.accumulation_steps)
        planned.append((setup, prediction, refusal(prediction, device, setup.config.layout.world)))
    launches = Launches({i: setup for i, (setup, _, reason) in enumerate(planned) if not reason}, device_type,
                        timeout_s)
    return [case for index, (setup, prediction, reason) in enumerate(planned)
            for case in _setup_cases(index, setup, prediction, reason, launches, profile, expected_s)]


def _setup_cases(index: int, setup: bench_train.TrainSetup, prediction, reason: str | None, launches: Launches,
                 profile, expected_s: float) -> list[Case]:
    cfg = setup.config
    layout = cfg.layout
    world = layout.world

    def predicted(rank: int) -> TrainStepResult:
        row = base_row(setup, rank, world)
        mine = for_rank(prediction, rank)
        source = profile() if callable(profile) else profile
        timing = step_time(mine, source, setup.accumulation_steps, source.cluster()) if source else None
        row.prediction = mine.to_dict() | {"step_time_s": timing.total_s if timing else None}
        row.predicted_peak_bytes = mine.peak_bytes
        row.predicted_activation_bytes = mine.ledger.saved_bytes
        row.predicted_step_time_s = timing.total_s if timing else None
        row.predicted_communication_s = timing.waiting_s if timing else None
        return row

    def measure_rank(device: torch.device, rank: int) -> TrainStepResult:
        row = predicted(rank)
        if reason:
            return skipped(row, reason)
        found = launches.result(index, rank)
        status = found.pop("status", "ok")
        for name, value in found.items():
            setattr(row, name, value)
        row.status = status
        if status == "ok":
            tokens = cfg.tokens * setup.accumulation_steps * layout.dp
            row.tokens_per_s = tokens / row.median_s
        return row

    label = f"{setup.label} {layout_label(layout)}"
    return [
        Case(kind="train", name=f"{label} rank {rank}", expected_s=expected_s if rank == 0 else 0.1,
             measure=functools.partial(measure_rank, rank=rank),
             failed=lambda status, message, rank=rank: _failed(setup, rank, world, status, message))
        for rank in range(world)
    ]


SETUPS_PER_LAUNCH = 32
"""Setups one launch runs at most: they travel on its command line, about 1 KiB each, and Linux takes
at most 128 KiB in one argument."""


class Launches:
    """The launches that measure a sweep's setups, one at a time.

    A launch runs the setups from the one asked for through the last of the same world size after it.
    A rank that fails a setup (out of memory, an error) reports it and exits, and the launcher stops
    the others; the setups that launch never began get a launch of their own, so a failure costs only
    the setup it happened in. A launch that fails before beginning any setup is not retried: what
    broke it (the environment, the process group) would break the next.
    """

    def __init__(self, setups: dict[int, bench_train.TrainSetup], device_type: str, timeout_s: float,
                 module: str = "headroom.agent.train_ranks") -> None:
        self.setups, self.device_type, self.timeout_s, self.module = setups, device_type, timeout_s, module
        self.launch: Launch | None = None
        self.indices: list[int] = []
        """The setups the current launch runs, in order."""

    def result(self, index: int, rank: int) -> dict:
        """Rank ``rank``'s row for setup ``index``; LaunchFailed when it cannot come."""
        try:
            return self._result(index, rank)
        finally:
            if index == self.indices[-1] and rank == self.setups[index].config.layout.world - 1:
                self.launch.close()

    def _result(self, index: int, rank: int) -> dict:
        if index not in self.indices:
            self._start(index)
        try:
            return self.launch.result(step_key(index), rank)
        except LaunchFailed:
            began = [i for i in self.indices if self.launch.reported(begin_key(i))]
            if index in began or not began:
                raise
        self._start(index)  # the launch ended in an earlier setup, before this one began
        return self.launch.result(step_key(index), rank)

    def run_of(self, index: int) -> list[int]:
        """The setups a launch started at setup ``index`` runs: it and those after it of its world size, at
        most `SETUPS_PER_LAUNCH`."""
        world = self.setups[index].config.layout.world
        same_world = itertools.takewhile(lambda i: self.setups[i].config.layout.world == world,
                                         (i for i in self.setups if i >= index))
        return list(itertools.islice(same_world, SETUPS_PER_LAUNCH))

    def _start(self, index: int) -> None:
        if self.launch is not None:
            self.launch.close()
        self.indices = self.run_of(index)
        documents = json.dumps({i: setup_document(self.setups[i]) for i in self.indices})
        world = self.setups[index].config.layout.world
        self.launch = Launch(self.module, world, ["--device-type", self.device_type, "--setups", documents],
                             timeout_s=self.timeout_s,
                             env={"OMP_NUM_THREADS": "1"} if self.device_type == "cpu" else None)


def _failed(setup: bench_train.TrainSetup, rank: int, world: int, status: str, message: str) -> TrainStepResult:
    row = base_row(setup, rank, world)
    row.status, row.message = status, message
    return row


def layout_label(layout: Layout) -> str:
    parts = [f"tp{layout.tp}" + ("-sp" if layout.sp else "")] if layout.tp > 1 else []
    if layout.pp > 1:
        parts.append(f"pp{layout.pp} {layout.schedule}"
                     + (f" stages {split_text(layout.stage_layers)}" if layout.stage_layers is not None else ""))
    if layout.dp > 1:
        parts.append(f"dp{layout.dp} zero{layout.zero}")
    return " ".join(parts) or "1 rank"


if __name__ == "__main__":
    raise SystemExit(main())
