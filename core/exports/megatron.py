"""Megatron-LM command-line arguments (for ``pretrain_gpt.py``), one line, no comments.

Flag names checked by building Megatron-LM's own parser
(``megatron.training.arguments.add_megatron_arguments``, main of 2026-08-22)
and against its docs (``docs/user-guide/features/dist_optimizer.md``,
``megatron_fsdp.md``):

- layout: ``--tensor-model-parallel-size``, ``--sequence-parallel``,
  ``--pipeline-model-parallel-size``, ``--num-layers-per-virtual-pipeline-stage``
  (interleaved 1F1B; Megatron has no GPipe or zero-bubble schedule: zbv is
  exported as interleaved over its two chunks, with a note), ``--context-parallel-size``;
  the data-parallel size is what the world size leaves. An uneven split: ``--account-for-embedding-in-pipeline-split
  --account-for-loss-in-pipeline-split`` where the layers with the embedding and the loss counted a layer each
  divide over the chunks (then ``--virtual-pipeline-model-parallel-size`` names the chunks a rank), else
  ``--decoder-first-pipeline-num-layers`` and ``--decoder-last-pipeline-num-layers`` (the middle stages alike).
- batch: ``--micro-batch-size``, ``--global-batch-size`` (micro-batches per
  step = global / (micro x dp)), ``--seq-length``.
- precision: ``--bf16`` is bf16 parameters, fp32 main gradients and an fp32
  master copy (headroom's bf16-fp32grad); ``--grad-reduce-in-bf16`` keeps the
  gradients in bf16 (bf16-master). The optimizer always steps fp32 main params.
- sharding: ``--use-distributed-optimizer`` shards the optimizer state and the
  master copy over data-parallel ranks (ZeRO-1: 6 + 12/d bytes a parameter for
  bf16 with fp32 gradients); Megatron-FSDP (``--use-megatron-fsdp
  --data-parallel-sharding-strategy optim_grads|optim_grads_params``, with
  ``--ckpt-format fsdp_dtensor``) is ZeRO-2/3.
- recompute: ``--recompute-granularity full --recompute-method uniform
  --recompute-num-layers K`` checkpoints segments of K layers of each model
  chunk (headroom's every-K; K = 1 is full); ``--recompute-granularity
  selective --recompute-modules core_attn`` is the attention core.
- FP8 (Transformer Engine's recipes, headroom.core.specs.float8): ``--fp8-format
  hybrid`` (e4m3 forward, e5m2 gradients) and ``--fp8-recipe delayed`` or
  ``tensorwise`` (current scaling); megatron-core's ``TransformerConfig.fp8``
  (``--fp8-format``) and ``fp8_recipe``, whose default is ``delayed``, so the
  recipe is always written. The amax history keeps its default length, 1.
  ``--fp8-param-gather`` holds the block weights in fp8 (it needs the
  distributed optimizer: ZeRO 1 or more). ``--first-last-layers-bf16`` with
  ``--num-layers-at-start-in-bf16 1 --num-layers-at-end-in-bf16 1`` keeps the
  model's first and last blocks out of the recipe.
- ``--attention-dropout`` and ``--hidden-dropout`` default to 0.1, so both are
  always written.
"""

from __future__ import annotations

import shlex

from headroom.core.exports.run import (
    Export,
    Run,
    compile_note,
    offload_note,
    ranks,
    regather_note,
    stack_note,
)
from headroom.core.specs.config import BF16_END_BLOCKS
from headroom.core.specs.float8 import FLOAT8_RECIPES, OFF
from headroom.core.specs.layout import MULTI_CHUNK
from headroom.core.specs.stages import accounts_for_ends, weighted_split
from headroom.core.timing.expert_dispatch import HIERARCHICAL

SHARDING = {2: "optim_grads", 3: "optim_grads_params"}
"""ZeRO stage -> Megatron-FSDP's --data-parallel-sharding-strategy."""


def _precision(run: Run, notes: list[str]) -> list[str]:
    if run.precision == "fp32":
        return []
    if run.precision == "amp-bf16":
        notes.append("Megatron-LM has no autocast over fp32 parameters; set: --bf16, bf16 parameters with fp32 "
                     "main gradients and master copy (bf16-fp32grad: 18 bytes a parameter with Adam before "
                     "sharding, against the planned 16)")
        return ["--bf16"]
    if run.precision == "bf16-pure":
        notes.append("Megatron-LM always keeps an fp32 master copy of bf16 parameters; set: bf16-master "
                     "(--grad-reduce-in-bf16), 4 bytes a parameter more than planned")
        return ["--bf16", "--grad-reduce-in-bf16"]
    if run.precision == "bf16-master":
        return ["--bf16", "--grad-reduce-in-bf16"]
    return ["--bf16"]


def _overlaps(run: Run) -> list[str]:
    """Megatron-LM's DDP reduces gradients after backward and gathers ZeRO-1's parameters after the step unless
    told to overlap them (DistributedDataParallelConfig, both off by default): the plan's choice, said."""
    return [f"--{name.replace('_', '-')}" for name, overlapped in run.overlaps.items() if overlapped]


def _sharding(run: Run, notes: list[str]) -> list[str]:
    zero = run.layout.zero
    if zero == 0:
        return []
    if zero == 1:
        return ["--use-distributed-optimizer"]
    notes.append(f"Megatron-LM's distributed optimizer alone is ZeRO-1 (the optimizer state and master copy "
                 f"sharded, gradients and parameters whole); ZeRO-{zero} is Megatron-FSDP, set here, which needs "
                 "the fsdp_dtensor checkpoint format")
    if (note := regather_note(run, "Megatron-FSDP's optim_grads_params")) is not None:
        notes.append(note)
    return ["--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
            SHARDING[zero], "--ckpt-format", "fsdp_dtensor"]


def _recompute(run: Run, notes: list[str]) -> list[str]:
    policy = run.policy
    if policy.kind in ("full", "every"):
        k = policy.segment_layers(run.n_layers)
        if k > run.layers_per_chunk:
            notes.append(f"Megatron-LM recomputes segments within one model chunk of {run.layers_per_chunk} "
                         f"layers, so every-{k} runs as every-{run.layers_per_chunk}: one segment input kept "
                         "per chunk")
            k = run.layers_per_chunk
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", str(k)]
    if policy.kind == "block":
        return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
                str(policy.every)]
    if policy.kind == "selective":
        return ["--recompute-granularity", "selective", "--recompute-modules", "core_attn"]
    if policy.kind == "op-selective":
        notes.append("Megatron-LM has no op-level selective recompute; set: --recompute-modules layernorm, which "
                     "recomputes the norms but keeps the MLP activation's tensors, more memory than planned")
        return ["--recompute-granularity", "selective", "--recompute-modules", "layernorm"]
    if policy.kind == "offload":
        notes.append(offload_note("Megatron-LM's command line"))
    return []


def _optimizer(run: Run, notes: list[str]) -> list[str]:
    if run.optimizer in ("adam", "adamw"):
        if run.optimizer == "adam":
            notes.append("Megatron-LM's adam is AdamW (decoupled weight decay); with --weight-decay 0 they agree")
        return ["--optimizer", "adam"]
    if run.optimizer == "sgd":
        return ["--optimizer", "sgd", "--sgd-momentum", "0"]
    if run.optimizer == "sgd-momentum":
        return ["--optimizer", "sgd"]
    notes.append(f"Megatron-LM has no {run.optimizer} optimizer: its default adam keeps 8 bytes of state a "
                 "parameter, more than planned")
    return []


def _stages(run: Run, notes: list[str]) -> list[str]:
    """An uneven split of the layers (headroom.core.specs.stages): Megatron-LM counts the embedding and the loss as
    a layer each (``--account-for-embedding-in-pipeline-split``, ``--account-for-loss-in-pipeline-split``), or
    gives its first and last stages their own counts (``--decoder-first-pipeline-num-layers``,
    ``--decoder-last-pipeline-num-layers``) and splits the rest evenly over the middle ones; any other split it
    cannot take, said in a note."""
    chunks, pp = run.chunk_layers, run.layout.pp
    if len(set(chunks)) == 1:
        return []
    if accounts_for_ends(sum(chunks), len(chunks)) and chunks == weighted_split(sum(chunks), len(chunks)):
        return ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    # Under virtual stages Megatron-LM splits each stage's count evenly over its chunks (get_transformer_layer_offset).
    stages = tuple(sum(chunks[s::pp]) for s in range(pp))
    even = run.layout.schedule != "zbv" and all(chunks[c] == chunks[c % pp] for c in range(len(chunks)))
    if even and len(set(stages[1:-1])) <= 1:
        return ["--decoder-first-pipeline-num-layers", str(stages[0]),
                "--decoder-last-pipeline-num-layers", str(stages[-1])]
    notes.append(f"Megatron-LM cannot split the layers {','.join(map(str, chunks))} over the pipeline "
                 f"{'chunks' if run.layout.schedule in MULTI_CHUNK else 'stages'}: it gives the first and last "
                 "stages their own counts (--decoder-first-pipeline-num-layers, --decoder-last-pipeline-num-layers) "
                 "and the middle ones the rest evenly: plan with --stage-layers whose middle stages hold the same "
                 "number of blocks")
    return []


def megatron(run: Run) -> Export:
    layout = run.layout
    notes: list[str] = [(f"launch {ranks(layout.world)}: Megatron-LM derives the data-parallel size "
                         f"{layout.dp} as world / (tp {layout.tp} x pp {layout.pp} x cp {layout.cp})")]
    args = ["--tensor-model-parallel-size", str(layout.tp)]
    if layout.sp:
        args.append("--sequence-parallel")
    if layout.tp_overlap:  # Transformer Engine's userbuffers (megatron/training/arguments.py)
        args.append("--tp-comm-overlap")
    args += ["--pipeline-model-parallel-size", str(layout.pp)]
    stages = _stages(run, notes)
    args += stages
    if layout.schedule in MULTI_CHUNK and stages:
        # Chunks of unequal blocks: the virtual stages by their count (megatron/training/arguments.py)
        args += ["--virtual-pipeline-model-parallel-size", str(layout.virtual_stages)]
    elif layout.schedule in MULTI_CHUNK:
        args += ["--num-layers-per-virtual-pipeline-stage", str(run.layers_per_chunk)]
    if layout.schedule == "zbv":
        notes.append("Megatron-LM has no zero-bubble schedule: these flags run interleaved 1F1B over the same two "
                     "chunks a rank, placed in a loop (rank i: chunks i and i + pp) rather than a V, with the "
                     "weights' gradients in backward: a longer bubble than planned; plan with --schedule "
                     "interleaved --stack megatron for its own figures")
    elif layout.schedule == "gpipe" and layout.pp > 1:
        notes.append("Megatron-LM has no GPipe schedule; it runs 1F1B, which keeps at most pp micro-batches in "
                     "flight: less activation memory than planned, the same bubble")
    if layout.ep > 1:  # expert-parallel ranks come out of the data-parallel ones (megatron/core/parallel_state.py)
        # The all-to-all dispatcher, or the flex one's DeepEP or HybridEP backend, is what headroom.core.timing.comm
        # times; Megatron's default gathers every token instead.
        args += ["--expert-model-parallel-size", str(layout.ep)]
        if layout.ep_comm in HIERARCHICAL:
            args += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", layout.ep_comm]
        else:
            args += ["--moe-token-dispatcher-type", "alltoall"]
        if layout.ep_overlap:  # combined 1F1B (megatron/core/pipeline_parallel/combined_1f1b.py)
            args.append("--overlap-moe-expert-parallel-comm")
    if run.spec.capacity_factor:
        args += ["--moe-expert-capacity-factor", f"{run.spec.capacity_factor:g}", "--moe-pad-expert-input-to-capacity"]
    if layout.cp > 1 and run.cp_comm == "all-gather":  # its default is p2p, the ring
        args += ["--cp-comm-type", "allgather"]
    args += ["--context-parallel-size", str(layout.cp),
             "--micro-batch-size", str(run.micro_batch),
             "--global-batch-size", str(run.global_batch),
             "--seq-length", str(run.seq_len)]
    args += _precision(run, notes)
    if run.fp8 != OFF:  # only Transformer Engine's recipes reach here (headroom.core.exports.fp8_refusal)
        recipe = FLOAT8_RECIPES[run.fp8]
        args += ["--fp8-format", recipe.megatron_format, "--fp8-recipe", recipe.megatron_recipe]
        if run.fp8_params:
            args.append("--fp8-param-gather")
            if recipe.block:  # MXFP8's parameters gathered in bf16 through the gradient buffer, as NeMo's recipe
                args.append("--reuse-grad-buf-for-mxfp8-param-ag")
        if run.first_last_bf16:  # megatron/training/arguments.py; megatron/core/fp8_utils.py
            args += ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16", str(BF16_END_BLOCKS),
                     "--num-layers-at-end-in-bf16", str(BF16_END_BLOCKS)]
    args += _sharding(run, notes)
    args += _overlaps(run)
    args += _recompute(run, notes)
    args += ["--attention-dropout", f"{run.dropout:g}", "--hidden-dropout", f"{run.dropout:g}",
             "--attention-backend", "flash" if run.attention == "flash" else "unfused"]
    args += _optimizer(run, notes)
    if (note := stack_note(run, "Megatron-LM", "megatron")) is not None:
        notes.append(note)
    if (note := compile_note(run, "Megatron-LM", "Megatron-LM has no torch.compile of its blocks")) is not None:
        notes.append(note)
    return Export("megatron", shlex.join(args), tuple(notes), notes_in_text=False)
