"""Pipeline parallelism for the agent's decoder with ``torch.distributed.pipelining``.

The decoder is cut into ``pp`` stages of consecutive blocks, as many on each
as the layout's split gives (headroom.core.specs.stages: ``n/pp`` each, the
way torchtitan's manual split cuts Llama, or the counts ``--stage-layers``
gives), the first stage also the embedding, the last the final norm and the
head. Each rank builds the whole decoder from the same
seed and keeps its stage (`Stage`), so the stages together hold the one
model a single device would train.

A step runs ``m`` micro-batches (the accumulation steps) through torch's
``ScheduleGPipe``, ``Schedule1F1B`` or ``ScheduleZBVZeroBubble``: the first
stage is given the step's ``m x micro_batch`` sequences and the last their
targets, and the schedule splits them into micro-batches, sends activations
forward and gradients back between neighbouring stages (point-to-point), runs
the loss on the last stage and scales the gradients by 1/m. Under zbv the
decoder is cut into 2 pp chunks and rank i holds chunks i and 2 pp - 1 - i
(`VStages`; headroom.core.specs.schedule_order), so rank 0 is given both the
sequences and the targets. The interleaved schedule is not run here.

`SavedLive` counts the activation bytes autograd holds at each moment of a
step, so the micro-batches a stage keeps in flight (the schedule's memory
claim: all m under GPipe, pp - i under 1F1B, about pp under ZB-V, headroom.core.memory.pipeline) are
measured, not assumed.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from headroom.agent import bench_train
from headroom.agent.model import Decoder, embed_tokens, token_loss
from headroom.agent.probe import storage_key
from headroom.agent.recompute import apply_blocks
from headroom.core.errors import ConfigError
from headroom.core.specs.layout import Layout
from headroom.core.specs.stages import rank_chunks

SCHEDULES = ("gpipe", "1f1b", "zbv")
"""The pipeline schedules the agent runs (torch's ScheduleGPipe, Schedule1F1B and ScheduleZBVZeroBubble)."""


def check_pipeline(layout: Layout, tied_embeddings: bool, micro_batches: int | None = None) -> None:
    """The pipelines this module runs (over ``micro_batches`` per step, when given); any other is
    refused by name."""
    if layout.schedule not in SCHEDULES:
        raise ConfigError(f"the agent runs the {', '.join(SCHEDULES)} pipeline schedules, not "
                          f"{layout.schedule}: use --schedule 1f1b, gpipe or zbv")
    if layout.world != layout.pp:
        raise ConfigError(f"the agent runs a pipeline alone (tp 1, cp 1, dp 1), not {layout}: measure pp and the "
                          "other axes separately")
    if tied_embeddings:
        raise ConfigError("a model with tied embeddings would need its head's copy of the embedding on the last "
                          "stage (Megatron-LM's word-embedding copy), which the agent does not build: use an "
                          "untied model with --pp")
    if layout.schedule == "1f1b" and micro_batches is not None and micro_batches < layout.pp:
        raise ConfigError(f"torch's 1F1B runs at least one micro-batch per stage: --accumulation {micro_batches} "
                          f"is fewer than pp {layout.pp}; use --accumulation {layout.pp} or more, or --schedule gpipe")


class Stage(nn.Module):
    """One pipeline stage of a Decoder: its blocks, with the embedding on the first stage and the final
    norm and head on the last. Takes token ids (first stage) or the previous stage's hidden states and
    returns hidden states, or the logits on the last stage (the schedule runs the loss, headroom.agent.model.token_loss)."""

    def __init__(self, decoder: Decoder, index: int, layers: tuple[int, ...], autocast: bool) -> None:
        super().__init__()
        if sum(layers) != len(decoder.blocks):
            raise ConfigError(f"{decoder.spec.name}: stages of {','.join(map(str, layers))} blocks do not hold its "
                              f"{len(decoder.blocks)} layers")
        self.first, self.last = index == 0, index == len(layers) - 1
        self.embed = decoder.embed if self.first else None
        self.positions = decoder.positions if self.first else None
        start = sum(layers[:index])
        self.blocks = nn.ModuleList(decoder.blocks[start:start + layers[index]])
        self.final_norm = decoder.final_norm if self.last else None
        self.lm_head = decoder.lm_head if self.last else None
        self.recompute, self.stack, self.dropout = decoder.recompute, decoder.stack, decoder.dropout
        self.autocast = autocast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.autocast:
            return self._forward(x)
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = embed_tokens(self.embed, self.positions, x, self.dropout, self.training)
        x = apply_blocks(self.blocks, x, self.recompute, self.stack)
        return self.lm_head(self.final_norm(x)) if self.last else x


class VStages(nn.Module):
    """A zbv rank's two chunks: ``down`` (chunk i, the embedding's on rank 0) and ``up`` (chunk 2 pp - 1 - i,
    the head's on rank 0)."""

    def __init__(self, down: Stage, up: Stage) -> None:
        super().__init__()
        self.down, self.up = down, up
        self.first, self.last = down.first, up.last


def schedule(stage_module: Stage | VStages, index: int, stages: int, device: torch.device, name: str,
             micro_batches: int):
    """torch's PipelineStage for ``stage_module`` (both of a zbv rank's chunks) and the named schedule over
    ``micro_batches``.

    Every stage is given the loss, not only the last: a schedule without one runs forward only, and
    the first stage would then never wait for its gradients.
    """
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleZBVZeroBubble,
    )

    if isinstance(stage_module, VStages):
        chunks = 2 * stages
        pair = [PipelineStage(stage_module.down, index, chunks, device),
                PipelineStage(stage_module.up, chunks - 1 - index, chunks, device)]
        return ScheduleZBVZeroBubble(pair, micro_batches, loss_fn=token_loss)
    stage = PipelineStage(stage_module, index, stages, device)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    return kind(stage, micro_batches, loss_fn=token_loss)


@dataclasses.dataclass
class PipelineTrainer:
    """This rank's stage, its optimizer and the schedule that runs a step's micro-batches through it.

    The same surface as headroom.agent.train_ranks.Trainer: ``model`` (the stage), ``optimizer``,
    ``forward_backward`` (one step's micro-batches, forward and backward) and ``loss`` (one micro-batch
    through this stage alone, for the saved-tensor probe).
    """

    model: Stage | VStages
    optimizer: torch.optim.Optimizer
    schedule: object
    hidden: int
    _joined: tuple = ()
    """The step's micro-batches and their token ids and targets joined into one batch, kept: the
    schedule splits the batch again into views of it."""

    def joined(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._joined or self._joined[0] is not batches:
            self._joined = (batches, torch.cat([t for t, _ in batches]), torch.cat([t for _, t in batches]))
        return self._joined[1], self._joined[2]

    def forward_backward(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        stage = self.model
        tokens, targets = self.joined(batches)
        if stage.first and stage.last:  # zbv's rank 0: the first chunk and the last
            self.schedule.step(tokens, target=targets, losses=[])
        elif stage.first:
            self.schedule.step(tokens)
        elif stage.last:
            self.schedule.step(target=targets, losses=[])
        else:
            self.schedule.step()

    def stage_input(self, tokens: torch.Tensor, stage: Stage | None = None) -> torch.Tensor:
        """One micro-batch of what ``stage`` (this rank's) receives: token ids, or the previous stage's hidden
        states (fp32 when the parameters are, as the residual stream is under amp-bf16), which carry a
        gradient."""
        stage = stage or self.model
        if stage.first:
            return tokens
        dtype = next(self.model.parameters()).dtype
        return torch.randn(*tokens.shape, self.hidden, dtype=dtype, device=tokens.device, requires_grad=True)

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """One micro-batch through this stage alone: the loss on the last stage, else its output; through
        both of a zbv rank's chunks, both."""
        if isinstance(self.model, VStages):
            return tuple(self._through(stage, tokens, targets) for stage in (self.model.down, self.model.up))
        return self._through(self.model, tokens, targets)

    def _through(self, stage: Stage, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        out = stage(self.stage_input(tokens, stage))
        return token_loss(out, targets) if stage.last else out

    def context(self):
        return contextlib.nullcontext()

    def in_flight(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
        """The activation bytes this stage holds at once during one step, over one micro-batch's: the
        micro-batches the schedule keeps in flight here, measured."""
        tokens, targets = batches[0]
        step_inputs = {storage_key(t) for t in self.joined(batches)}
        during_step = SavedLive(ignore=step_inputs)
        with during_step.hooks(self.model.parameters()):
            self.forward_backward(batches)
        self.optimizer.zero_grad(set_to_none=True)
        one = SavedLive(ignore={storage_key(tokens), storage_key(targets)})
        with one.hooks(self.model.parameters()):
            out = self.loss(tokens, targets)
        del out
        return {"saved_peak_bytes": during_step.peak, "saved_micro_batch_bytes": one.peak,
                "micro_batches_in_flight": during_step.peak / one.peak if one.peak else None}


def build(setup: bench_train.TrainSetup, rank: int, device: torch.device) -> PipelineTrainer:
    """Stage ``rank`` of the setup's pipeline, from the whole decoder every rank builds from one seed."""
    cfg, layout = setup.config, setup.config.layout
    check_pipeline(layout, setup.spec.tied_embeddings)
    torch.manual_seed(0)
    decoder = bench_train.build_model(setup, device)
    chunks, autocast = cfg.chunk_layers(setup.spec), cfg.recipe.autocast
    if layout.schedule == "zbv":
        down, up = rank_chunks(layout, rank)
        stage = VStages(Stage(decoder, down, chunks, autocast), Stage(decoder, up, chunks, autocast))
    else:
        stage = Stage(decoder, rank, chunks, autocast=autocast)
    del decoder  # the other stages' blocks go with it
    optimizer = bench_train.make_optimizer(cfg.optimizer, stage.parameters(), device)
    return PipelineTrainer(stage, optimizer, schedule(stage, rank, layout.pp, device, layout.schedule,
                                                      setup.accumulation_steps), setup.spec.hidden)


@contextlib.contextmanager
def profiled_waits() -> Iterator[None]:
    """The schedule's waits on its point-to-point sends and receives, as ``c10d::`` profiler spans.

    torch's schedules wait on gloo's send and receive handles without a profiler event, so the host
    view of headroom.agent.comm_time would see no communication; on CUDA the NCCL kernels show it already.
    """
    from torch.distributed.pipelining import schedules

    wait = schedules._wait_batch_p2p

    def recorded(work):
        with torch.profiler.record_function("c10d::pipeline_wait"):
            return wait(work)

    schedules._wait_batch_p2p = recorded
    try:
        yield
    finally:
        schedules._wait_batch_p2p = wait


@dataclasses.dataclass
class SavedLive:
    """Activation bytes autograd holds right now, and the most it held, while active.

    Every tensor autograd saves is counted once per storage from the moment it is saved until the graph
    that saved it lets it go (backward frees it, or the graph is dropped); parameters and the storages
    in ``ignore`` (the step's token ids and targets, held whole for the step) are not activations.
    """

    ignore: set[int] = dataclasses.field(default_factory=set)
    live: int = 0
    peak: int = 0
    _holders: dict[int, int] = dataclasses.field(default_factory=dict)

    def hooks(self, parameters: Iterable[torch.Tensor]):
        ignore = self.ignore | {storage_key(p) for p in parameters}
        return torch.autograd.graph.saved_tensors_hooks(lambda t: self._pack(t, ignore), _Held.unpack)

    def _pack(self, t: torch.Tensor, ignore: set[int]) -> object:
        key = storage_key(t)
        if key in ignore:
            return t.detach()
        count = self._holders.get(key, 0)
        if count == 0:
            self.live += t.untyped_storage().nbytes()
            self.peak = max(self.peak, self.live)
        self._holders[key] = count + 1
        return _Held(t.detach(), key, t.untyped_storage().nbytes(), self)

    def _release(self, key: int, nbytes: int) -> None:
        self._holders[key] -= 1
        if self._holders[key] == 0:
            del self._holders[key]
            self.live -= nbytes


class _Held:
    """A saved tensor as autograd keeps it under `SavedLive`: telling the counter when it is let go."""

    __slots__ = ("tensor", "key", "nbytes", "counter")

    def __init__(self, tensor: torch.Tensor, key: int, nbytes: int, counter: SavedLive) -> None:
        self.tensor, self.key, self.nbytes, self.counter = tensor, key, nbytes, counter

    @staticmethod
    def unpack(held: object) -> torch.Tensor:
        return held.tensor if isinstance(held, _Held) else held

    def __del__(self) -> None:
        self.counter._release(self.key, self.nbytes)
