"""What every exporter shares: the recommendation reduced to a `Run`, and the `Export` it returns.

A framework's settings rarely express a plan exactly. Each writer sets what its
format can say and returns a note, one sentence each, for what it cannot: the
setting it wrote instead and which way that moves memory or time. Formats with
comments (TOML, Python) also carry the notes as comments, so a saved file keeps
them; for the others (JSON, a command line) the caller shows them apart
(``headroom plan --export`` prints them to stderr).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from headroom.core.divisors import divisors
from headroom.core.errors import ConfigError
from headroom.core.planning.planner import Candidate, PlanRequest
from headroom.core.specs.config import cp_comm
from headroom.core.specs.data_parallel import (
    DataParallelSchedule,
    data_parallel_schedule,
)
from headroom.core.specs.layout import OVERLAP_STAGES, Layout
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.recompute import RecomputePolicy
from headroom.core.specs.stack import get_stack
from headroom.core.specs.stages import chunk_layers
from headroom.core.timing.expert_dispatch import HIERARCHICAL


@dataclass(frozen=True, slots=True)
class Export:
    """A recommendation as one framework's settings."""

    format: str
    """The exporter's name: a key of ``headroom.core.exports.EXPORTERS``."""
    text: str
    """The settings in the framework's own syntax; parses as that format with no pre-processing."""
    notes: tuple[str, ...]
    """What the format cannot express, or expresses differently from the plan: one sentence each."""
    notes_in_text: bool
    """The format has comments and ``text`` carries every note as one; otherwise show ``notes`` beside it."""
    unexpressed: tuple[str, ...] = ()
    """The layout's parallel axes (of tp, pp, cp, ep) the format has no setting for, each named in a note; empty
    when it carries the whole layout."""

    def __str__(self) -> str:
        return self.text

    def to_dict(self) -> dict[str, Any]:
        """The ``export`` entry of ``headroom plan --json --export FORMAT``."""
        return {"format": self.format, "text": self.text, "notes": list(self.notes),
                "unexpressed": list(self.unexpressed)}


@dataclass(frozen=True, slots=True)
class Run:
    """One recommended candidate, reduced to what a framework's settings need."""

    spec: ModelSpec
    seq_len: int
    global_batch: int
    """Sequences per optimizer step, all data-parallel ranks: dp x micro-batch x accumulation."""
    micro_batch: int
    accumulation_steps: int
    """Micro-batches per rank per optimizer step (under pipeline parallelism: those in one pipeline flush)."""
    layout: Layout
    """The candidate's layout (a layout search's winner, not the request's starting layout)."""
    precision: str
    optimizer: str
    attention: str
    dropout: float
    policy: RecomputePolicy
    stack: str
    gpus_per_node: int = 8
    """GPUs a node: the request's cluster's, else headroom.core.specs.interconnect.default_cluster's 8."""
    fp8: str = "off"
    """The FP8 recipe of the block linears (headroom.core.specs.float8), or ``off``."""
    fp8_params: bool = False
    """The block weights are held and gathered in fp8 (Megatron-LM's ``--fp8-param-gather``)."""
    first_last_bf16: bool = False
    """The model's first and last blocks outside the FP8 recipe (Megatron-LM's ``--first-last-layers-bf16``)."""
    compile: bool = False
    """Each block compiled with torch.compile (TrainConfig.compile)."""

    @classmethod
    def of(cls, request: PlanRequest, best: Candidate) -> Run:
        run = best.run_config
        cfg = run.train
        if cfg.layout.dp * run.sequences_per_rank != request.global_batch:
            raise ConfigError(
                f"the candidate's dp {cfg.layout.dp} x micro-batch {cfg.micro_batch} x accumulation "
                f"{best.accumulation_steps} is not the request's global batch {request.global_batch}; "
                "export a candidate of this request's plan"
            )
        return cls(spec=request.spec, seq_len=cfg.seq_len,
                   global_batch=request.global_batch, micro_batch=cfg.micro_batch,
                   accumulation_steps=run.accumulation_steps, layout=cfg.layout, precision=cfg.precision,
                   optimizer=cfg.optimizer, attention=cfg.attention, dropout=cfg.dropout, policy=cfg.recompute,
                   stack=cfg.stack, gpus_per_node=request.cluster.gpus_per_node if request.cluster else 8,
                   fp8=cfg.fp8, fp8_params=cfg.fp8_params, first_last_bf16=cfg.first_last_bf16,
                   compile=cfg.compile)

    @property
    def model(self) -> str:
        return self.spec.name

    @property
    def n_layers(self) -> int:
        return self.spec.n_layers

    def axes_among(self, names: Sequence[str]) -> tuple[str, ...]:
        """Those of ``names`` (layout axes: tp, pp, cp, ep) the run's layout uses, a size above 1, in that order."""
        return tuple(name for name in names if getattr(self.layout, name) > 1)

    def axes_text(self, names: Sequence[str]) -> str:
        """`axes_among` with their sizes: "pp 2, cp 4"."""
        return ", ".join(f"{name} {getattr(self.layout, name)}" for name in self.axes_among(names))

    @property
    def counted_data_parallel(self) -> int:
        """The ranks a framework without pipeline or context parallelism counts as data-parallel: every rank
        outside a tensor-parallel group (the plan's dp where pp and cp are 1)."""
        return self.layout.world // self.layout.tp

    @property
    def per_rank_batch(self) -> int:
        """Sequences per data-parallel rank per optimizer step: micro-batch x accumulation."""
        return self.micro_batch * self.accumulation_steps

    @property
    def data_parallel(self) -> DataParallelSchedule:
        """How the plan's data-parallel ranks run: its settings, else its stack's (headroom.core.specs.data_parallel)."""
        return data_parallel_schedule(self.layout, self.stack)

    @property
    def overlaps(self) -> dict[str, bool]:
        """Each data-parallel overlap setting that applies to the plan (Layout.OVERLAP_STAGES, with ranks to
        reduce over; not the parameter gather of a ZeRO that gathers inside its step,
        DataParallelSchedule.gathers_in_step) -> whether the plan overlaps it."""
        layout, schedule = self.layout, self.data_parallel
        if layout.dp * layout.cp == 1:
            return {}
        return {name: getattr(schedule, name) for name, stages in OVERLAP_STAGES.items() if layout.zero in stages
                and not (name == "overlap_param_gather" and schedule.gathers_in_step(layout.zero))}

    @property
    def cp_comm(self) -> str:
        """How the plan's context-parallel ranks exchange keys and values: its setting, else its stack's."""
        return cp_comm(self.layout, self.stack)

    @property
    def chunk_layers(self) -> tuple[int, ...]:
        """Blocks in each pipeline chunk, first to last (headroom.core.specs.stages)."""
        return chunk_layers(self.layout, self.n_layers, self.stack)

    @property
    def layers_per_chunk(self) -> int:
        """Blocks in the largest pipeline chunk (every chunk's where they split evenly)."""
        return max(self.chunk_layers)

    def summary(self) -> str:
        return (f"headroom plan: {self.model}, seq-len {self.seq_len}, global batch {self.global_batch}; "
                f"{self.layout}; micro-batch {self.micro_batch} x accumulation {self.accumulation_steps}, "
                f"recompute {self.policy}, {self.precision}")


def data_parallel_batch(run: Run, framework: str, notes: list[str]) -> tuple[int, int]:
    """(micro-batch, accumulation) for a framework that counts every rank outside a tensor-parallel group as
    data-parallel, having no pipeline or context parallelism (the HF Trainer, Lightning): where the plan has
    pipeline or context ranks, its global batch split over the framework's count instead, so the run trains
    the batch asked for; a note says so, or, where the batch does not split, what the run trains instead."""
    layout = run.layout
    counted = run.counted_data_parallel
    if counted == layout.dp:
        return run.micro_batch, run.accumulation_steps
    counting = (f"{framework} counts the {layout.world:,} ranks as {counted:,}-way data-parallel (it has no setting "
                f"for {run.axes_text(('pp', 'cp'))})")
    if run.global_batch % counted:
        notes.append(f"{counting}: the global batch {run.global_batch:,} does not split over them, and micro-batch "
                     f"{run.micro_batch} x accumulation {run.accumulation_steps} trains "
                     f"{run.per_rank_batch * counted:,} sequences a step; plan a multiple of {counted:,}")
        return run.micro_batch, run.accumulation_steps
    per_rank = run.global_batch // counted
    micro = max(d for d in divisors(per_rank) if d <= run.micro_batch)
    notes.append(f"{counting}: micro-batch {micro} x accumulation {per_rank // micro} a rank keeps the global batch "
                 f"of {run.global_batch:,}; the plan's memory and time are for its own layout, not this one")
    return micro, per_rank // micro


def commented(fmt: str, lines: list[str], notes: list[str], run: Run, header: tuple[str, ...] = (),
              unexpressed: tuple[str, ...] = ()) -> Export:
    """``lines`` under '#' comments: the plan's summary, ``header``, then every note."""
    top = [f"# {run.summary()}", *(f"# {h}" for h in header), *(f"# note: {n}" for n in notes)]
    return Export(fmt, "\n".join([*top, "", *lines]), tuple(notes), notes_in_text=True, unexpressed=unexpressed)


def ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def offload_note(framework: str, aside: str = "") -> str:
    return (f"{framework} has no activation-offload setting{aside}: none is set; 'offload' keeps every saved "
            "tensor in host memory, so wrap the blocks in torch.autograd.graph.save_on_cpu in your model code, "
            "or re-plan without --offload")


def capacity_note(run: Run, framework: str) -> str | None:
    """When the plan caps the experts' capacity (ModelSpec.capacity_factor) and the framework's experts are
    dropless."""
    factor = run.spec.capacity_factor
    if not factor:
        return None
    return (f"planned at capacity factor {factor:g} (each expert padded to ceil(t k / E x {factor:g}) rows), but "
            f"{framework}'s experts are dropless: each keeps the rows the router sends it; re-plan without "
            "--capacity-factor for its activation memory and time")


def overlap_note(run: Run, framework: str) -> str | None:
    """When the plan reduces gradients after backward, or gathers ZeRO-1/2's parameters after the step (Megatron-LM's
    defaults), and the framework always overlaps them (torch's DDP and FSDP)."""
    what = {"overlap_grad_reduce": "reduces the gradients while backward runs",
            "overlap_param_gather": "gathers the updated parameters during the next forward"}
    late = [what[name] for name, overlapped in run.overlaps.items() if not overlapped]
    if not late:
        return None
    return (f"{framework} {' and '.join(late)}, where the plan waits for it (the {run.stack} stack's or the "
            "layout's setting): faster than planned")


def tp_overlap_note(run: Run, framework: str) -> str | None:
    """When the plan overlaps the blocks' tensor-parallel collectives with their GEMMs (Layout.tp_overlap) and the
    framework cannot."""
    return _unrun_overlap(framework, "tensor-parallel collectives with the GEMMs", "--tp-overlap") \
        if run.layout.tp_overlap else None


def ep_overlap_note(run: Run, framework: str) -> str | None:
    """When the plan runs the expert all-to-alls beside another micro-batch's compute (Layout.ep_overlap) and the
    framework cannot."""
    return _unrun_overlap(framework, "the expert all-to-alls with another micro-batch's compute", "--ep-overlap") \
        if run.layout.ep_overlap else None


def ep_comm_note(run: Run, framework: str) -> str | None:
    """When the plan sends the experts' tokens across nodes by DeepEP or HybridEP (Layout.ep_comm) and the framework
    exchanges them by all-to-all."""
    comm = run.layout.ep_comm
    if comm not in HIERARCHICAL:
        return None
    return (f"{framework} exchanges the experts' tokens by all-to-all, not {comm}: every copy of a token crosses "
            "nodes on its own, slower than planned where experts span nodes; re-plan with --ep-comm all-to-all for "
            "its step time")


def regather_note(run: Run, zero_3: str) -> str | None:
    """When the plan keeps FSDP's parameters from forward to backward (gathered, FSDP1's SHARD_GRAD_OP, or a shard
    over k ranks) and the framework's ZeRO-3 (``zero_3``) gathers them again in backward."""
    kept = run.data_parallel.reshard_after_forward
    if run.layout.zero != 3 or kept is True:
        return None
    how = "kept gathered from forward to backward (FSDP's SHARD_GRAD_OP)" if kept is False else \
        f"kept as a shard over {kept} ranks from forward to backward"
    return (f"the plan's FSDP units are {how}; {zero_3} frees each after its forward and gathers it again over "
            "every rank in backward, which has no setting to keep them: more traffic and less memory than planned; "
            "re-plan with --reshard-after-forward true for its step")


def _unrun_overlap(framework: str, what: str, flag: str) -> str:
    return (f"{framework} has no overlap of {what}: they run exposed, slower than planned; re-plan with {flag} off "
            "for its step time")


def compile_note(run: Run, framework: str, how: str) -> str | None:
    """A plan of compiled blocks (TrainConfig.compile) exported to a framework whose settings here do not compile
    them: ``how`` says how to, in its terms."""
    if not run.compile:
        return None
    return (f"the plan compiles each block with torch.compile (what inductor keeps for backward, as torchtitan's "
            f"--compile.enable); these {framework} settings do not: {how}, or plan with --compile off")


def stack_note(run: Run, framework: str, stack: str) -> str | None:
    """When the plan follows another stack's saving rules (headroom.core.specs.stack) than the framework runs: its kernels
    (RMSNorm, RoPE, SwiGLU, cross-entropy), or under sequence parallelism what backward keeps of a gathered input."""
    planned, runs = get_stack(run.stack), get_stack(stack)
    kernels = planned.kernels(run.layout.tp) != runs.kernels(run.layout.tp)
    gathered = run.layout.sp and planned.sp_keeps_gathered_input != runs.sp_keeps_gathered_input
    if not (kernels or gathered):
        return None
    what = " and ".join(w for w, differs in (("kernels", kernels), ("sequence-parallel saving rules", gathered))
                        if differs)
    return (f"planned with the {run.stack} stack's {what}, but {framework} follows the {stack} stack's: "
            f"re-plan with --stack {stack} for its activation memory")
