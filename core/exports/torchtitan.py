"""torchtitan 0.3 launch command: a recipe named by ``--module`` and ``--config``, its fields overridden.

torchtitan 0.3 configures a run in Python (pytorch/torchtitan#2386, Feb 2026):
``--module llama3 --config llama3_8b`` names a ``config_registry`` function
returning a ``Trainer.Config``, and ``--section.field value`` flags override
its fields (parsed by tyro; the activation-checkpoint policy is a subcommand
and comes last). Names checked against torchtitan 0.3.0's
``config/configs.py``, ``config/manager.py``, ``trainer.py`` and
``distributed/activation_checkpoint.py``:

- ``parallelism``: ``data_parallel_replicate_degree`` (DDP/HSDP replicas),
  ``data_parallel_shard_degree`` (FSDP), ``tensor_parallel_degree``,
  ``enable_sequence_parallel`` (on by default), ``pipeline_parallel_degree``,
  ``pipeline_parallel_schedule`` (``1F1B``, ``Interleaved1F1B``, ``GPipe``),
  ``pipeline_parallel_microbatch_size``, ``pipeline_parallel_layers_per_stage``,
  ``pipeline_parallel_first_stage_less_layers`` and ``_last_stage_less_layers``
  (the blocks the embedding and the head count as when it splits the layers
  itself, 1 each), ``module_fqns_per_model_part`` (each chunk's modules, a
  comma-separated list each; ``distributed/pipeline_parallel.py``),
  ``context_parallel_degree``, ``expert_parallel_degree`` (ranks borrowed from
  ``dp_shard x cp``, experts sharded over the rest). FSDP spans ``dp_shard x cp`` ranks; replication
  without FSDP (DDP) runs only when data parallelism is the sole axis.
- ``training``: ``local_batch_size`` (per data-parallel rank; under pipeline
  parallelism split into ``local_batch_size / pipeline_parallel_microbatch_size``
  pipeline micro-batches), ``global_batch_size`` (gradient accumulation is
  ``global / (local x dp)``), ``seq_len``, ``mixed_precision_param`` (FSDP's
  param dtype, or autocast under DDP), ``dtype`` (``bfloat16`` puts parameters,
  gradients and optimizer state all in bf16), ``disable_cuda_graphs`` (required
  with pipeline parallelism).
- ``activation-checkpoint:none|full|selective``: ``selective`` is per-op SAC,
  which keeps compute-heavy op outputs but recomputes every second matmul;
  there is no per-layer option any more.
- The optimizer is the recipe's (AdamW ``param_groups``, set in Python only).
- A recipe fixes the model: ``RECIPES`` lists those whose architecture equals
  a headroom model (tests/test_export_frameworks.py builds each on the meta
  device and counts its parameters).
"""

from __future__ import annotations

from headroom.core.exports.run import (
    Export,
    Run,
    capacity_note,
    commented,
    ep_overlap_note,
    offload_note,
    overlap_note,
    ranks,
    stack_note,
)
from headroom.core.specs.float8 import FLOAT8_RECIPES
from headroom.core.specs.layout import MULTI_CHUNK
from headroom.core.specs.stages import weighted_split
from headroom.core.timing.expert_dispatch import HIERARCHICAL

SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe", "zbv": "ZBVZeroBubble"}
"""headroom's pipeline schedule -> torch.distributed.pipelining's schedule name."""

RECIPES = {
    # (layers, hidden, heads, kv heads, ffn hidden, vocab): torchtitan.models.llama3's "8B" and "70B" flavours
    (32, 4096, 32, 8, 14336, 128256): ("llama3", "llama3_8b"),
    (80, 8192, 64, 8, 28672, 128256): ("llama3", "llama3_70b"),
}
"""A llama architecture -> (torchtitan module, config_registry function) whose model it is."""
STAND_IN = ("llama3", "llama3_8b")


def _stages(run: Run) -> list[str]:
    """The plan's split of the layers into pipeline chunks (headroom.core.specs.stages): torchtitan's own where it
    is (its ``_generate_llm_fqn_per_model_part``, one chunk a rank, two under a multi-stage schedule: looped, or
    in a V under ZBVZeroBubble, torchtitan placing chunk i on the rank the schedule says), an even one by
    ``pipeline_parallel_layers_per_stage`` with the embedding and head counted as no layer, any other module by
    module (``module_fqns_per_model_part``, one comma-separated list a chunk)."""
    layout, chunks = run.layout, run.chunk_layers
    default_chunks = layout.pp * (2 if layout.schedule in MULTI_CHUNK else 1)
    if layout.chunks == default_chunks and chunks == weighted_split(run.n_layers, layout.chunks):
        return []
    if len(set(chunks)) == 1:
        return [f"--parallelism.pipeline_parallel_layers_per_stage {chunks[0]}",
                "--parallelism.pipeline_parallel_first_stage_less_layers 0",
                "--parallelism.pipeline_parallel_last_stage_less_layers 0"]
    parts, start = [], 0
    for i, n in enumerate(chunks):
        modules = [f"layers.{layer}" for layer in range(start, start + n)]
        start += n
        modules = (["tok_embeddings"] if i == 0 else []) + modules + (["norm", "lm_head"] if i == len(chunks) - 1 else [])
        parts.append(",".join(modules))
    return ["--parallelism.module_fqns_per_model_part " + " ".join(parts)]


def _recipe(run: Run, notes: list[str]) -> tuple[str, str]:
    spec = run.spec
    shape = (spec.n_layers, spec.hidden, spec.n_heads, spec.n_kv_heads, spec.ffn_hidden, spec.vocab_size)
    if spec.block == "llama" and not spec.tied_embeddings and shape in RECIPES:
        return RECIPES[shape]
    notes.append(f"torchtitan 0.3 has no recipe for {spec.name}'s architecture; the command starts from "
                 f"{STAND_IN[1]}'s, which trains Llama 3 8B: write a config_registry function with this model "
                 f"({spec.n_layers} layers, dim {spec.hidden}, {spec.n_heads} heads, {spec.n_kv_heads} kv heads, "
                 f"ffn {spec.ffn_hidden}, vocab {spec.vocab_size}) and name it with --module and --config")
    return STAND_IN


def _launch(run: Run, notes: list[str]) -> str:
    world, per_node = run.layout.world, run.gpus_per_node
    if world <= per_node:
        return f"torchrun --nproc-per-node {world}"
    if world % per_node:
        notes.append(f"{world} ranks do not fill whole nodes of {per_node} GPUs: launch them as your cluster "
                     "places them")
        return f"torchrun --nproc-per-node {world}"
    return f"torchrun --nnodes {world // per_node} --nproc-per-node {per_node}"


def _data_parallel(run: Run, notes: list[str]) -> tuple[int, int]:
    """(replicate degree, shard degree) for the run's dp and ZeRO stage."""
    layout = run.layout
    if layout.dp == 1:
        return 1, 1
    if layout.zero == 3:
        return 1, layout.dp
    if layout.zero in (1, 2):
        notes.append(f"torchtitan has no ZeRO-{layout.zero}: its data-parallel ranks either replicate the optimizer "
                     f"state whole (DDP) or shard parameters, gradients and optimizer state (FSDP); set: FSDP over "
                     f"the {layout.dp} ranks, less memory than planned and a parameter all-gather in forward and "
                     "backward; re-plan with --zero 3 for its step time")
        return 1, layout.dp
    if layout.world > layout.dp and layout.cp == 1:  # with cp > 1, FSDP over the cp ranks makes it HSDP
        notes.append("torchtitan runs DDP only when data parallelism is its one axis ('DDP has not supported > 1D "
                     f"parallelism'); set: FSDP over the {layout.dp} data-parallel ranks (ZeRO-3), less memory "
                     "than planned with --zero 0 and more communication; re-plan with --zero 3 for its step time")
        return 1, layout.dp
    return layout.dp, 1


def _precision(run: Run, notes: list[str]) -> list[str]:
    if run.precision == "fp32":
        return ["--training.mixed_precision_param float32"]
    if run.precision == "bf16-pure":
        notes.append("torchtitan's training.dtype bfloat16 keeps the optimizer state in bf16 too (Adam: 4 bytes a "
                     "parameter instead of the planned 8)")
        return ["--training.dtype bfloat16"]
    if run.precision in ("bf16-master", "bf16-fp32grad"):
        notes.append(f"torchtitan has no {run.precision} recipe (bf16 parameters with an fp32 master copy); set: "
                     "mixed precision over fp32 parameters and gradients (amp-bf16: "
                     + ("the same" if run.precision == "bf16-master" else "2 bytes a parameter fewer")
                     + " static bytes with Adam, plus the bf16 weight copies of each unit's forward)")
    return ["--training.mixed_precision_param bfloat16"]


def _checkpointing(run: Run, notes: list[str]) -> str:
    """The activation-checkpoint subcommand."""
    policy = run.policy
    if policy.kind == "full" and run.stack != "torchtitan":
        notes.append("torchtitan's full checkpointing reruns each block whole (no early stop): its down projection "
                     "too, a little more recompute than planned: re-plan with --stack torchtitan")
    if policy.kind in ("none", "full"):
        return f"activation-checkpoint:{policy.kind}"
    if policy.kind == "every":
        notes.append(f"torchtitan has no every-{policy.every} segments; set: full, the same recompute but every "
                     "block's input kept, more memory than planned: check with headroom estimate --recompute full")
        return "activation-checkpoint:full"
    if policy.kind == "block":
        notes.append(f"torchtitan has no block-{policy.every} (its selective layer option checkpoints every n-th "
                     "block, not the first K); set: full, which recomputes every block: less memory and more "
                     "recompute than planned: check with headroom estimate --recompute full")
        return "activation-checkpoint:full"
    if policy.kind == "op-selective":
        if run.stack != "torchtitan":
            notes.append("torchtitan's selective (per-op SAC) also recomputes every second matmul: less memory and "
                         "more recompute than the planned op-selective, which keeps every matmul output: re-plan "
                         "with --stack torchtitan")
        return "activation-checkpoint:selective"
    if policy.kind == "selective":
        notes.append("torchtitan cannot recompute the attention core alone; its fused SDPA attention keeps no "
                     "s x s tensor, which is all that selective recompute removes, so none is set")
        return "activation-checkpoint:none"
    notes.append(offload_note("torchtitan"))
    return "activation-checkpoint:none"


def _other_notes(run: Run, notes: list[str]) -> None:
    layout = run.layout
    if layout.cp > 1 and run.cp_comm == "ring":
        notes.append("torchtitan 0.3 has no setting for how context-parallel ranks exchange keys and values and runs "
                     "torch's default, an all-gather a layer; for the planned ring call torch.distributed.tensor."
                     "experimental._attention.set_rotate_method('alltoall') before training")
    if layout.cp > 1:
        notes.append(f"torchtitan's FSDP spans the dp x cp ranks: parameters, gradients and optimizer state are "
                     f"sharded over the {layout.cp} context-parallel ranks too, less memory than planned")
    for note in (stack_note(run, "torchtitan", "torchtitan"), capacity_note(run, "torchtitan"),
                 overlap_note(run, "torchtitan's DDP")):
        if note is not None:
            notes.append(note)
    if run.attention == "standard" and run.policy.kind != "selective":  # else the checkpointing note says it
        notes.append("torchtitan runs fused SDPA attention, which keeps no s x s tensor: less memory than planned "
                     "with --attention standard")
    if run.dropout > 0:
        notes.append("torchtitan's models have no dropout")
    if run.optimizer != "adamw":
        notes.append(f"torchtitan's recipes build AdamW (param_groups, in Python), not {run.optimizer}"
                     + (": the same 8 bytes of state a parameter" if run.optimizer == "adam" else
                        ": 8 bytes of state a parameter"))


def _data_parallel_settings(run: Run, notes: list[str]) -> list[str]:
    """FSDP's resharding as torchtitan's ``fsdp_reshard_after_forward`` policy (``always``, ``never``; left out,
    its ``default``: kept under a pipeline), and what its policy and training loop cannot say."""
    layout = run.layout
    kept = layout.reshard_after_forward
    flags = []
    if kept is not None and not isinstance(kept, bool):
        notes.append(f"torchtitan's fsdp_reshard_after_forward is always, never or default: it cannot keep a shard "
                     f"over {kept} ranks; its default policy is used")
    elif kept is not None:
        flags.append(f"--parallelism.fsdp_reshard_after_forward {'always' if kept else 'never'}")
    if layout.defer_gradient_sync is not None and layout.defer_gradient_sync != (layout.pp > 1):
        notes.append("torchtitan reduces gradients every micro-batch, and once per step under a pipeline; no setting "
                     f"changes that, so the plan's {'deferred' if layout.defer_gradient_sync else 'every-micro-batch'} "
                     "reduction is not what it runs")
    return flags


def _float8_note(run: Run, module: str, recipe: str) -> str:
    """torchtitan 0.3 converts linears in a recipe's Python only (``Trainer.Config.model_spec`` is suppressed from
    its command line): the converter a recipe function adds, as its own ``llama3_405b`` (float8) and
    ``llama3_8b_mxfp8`` (MXFP8) add theirs."""
    fp8 = FLOAT8_RECIPES[run.fp8]
    converter = ("MXFP8LinearConverter.Config(model_compile_enabled=True)" if fp8.block else
                 f"Float8LinearConverter.Config(recipe_name=\"{fp8.torchao_recipe}\", filter_fqns=[\"lm_head\"])")
    return (f"--fp8 {run.fp8}: torchtitan converts linears only in a recipe's Python (model_spec is not a flag); "
            f"in a copy of {module}.{recipe} set config.model_spec = model_registry(\"{recipe.split('_')[-1].upper()}\", "
            f"converters=[{converter}]) and name it in --config; this command as written trains in bf16. torchao asks "
            "for --compile.enable for competitive speed (its casts fused), which the plan does not model: the plan "
            "prices the casts as fused kernels and the dispatch as eager")


def torchtitan(run: Run) -> Export:
    layout = run.layout
    notes: list[str] = []
    module, recipe = _recipe(run, notes)
    launch = _launch(run, notes)
    replicate, shard = _data_parallel(run, notes)
    # Under pipeline parallelism one optimizer step is one pipeline flush of every micro-batch.
    training = [
        f"--training.local_batch_size {run.per_rank_batch if layout.pp > 1 else run.micro_batch}",
        f"--training.global_batch_size {run.global_batch}",
        f"--training.seq_len {run.seq_len}",
        *_precision(run, notes),
    ]
    if layout.pp > 1:
        training.append("--training.disable_cuda_graphs")  # "CUDA graphs do not support pipeline parallelism yet"
    parallelism = [
        f"--parallelism.data_parallel_replicate_degree {replicate}",
        f"--parallelism.data_parallel_shard_degree {shard}",
        f"--parallelism.tensor_parallel_degree {layout.tp}",
        f"--parallelism.pipeline_parallel_degree {layout.pp}",
        f"--parallelism.context_parallel_degree {layout.cp}",
    ]
    if layout.ep > 1:  # borrowed from data_parallel_shard_degree x cp (its efsdp x ep sparse mesh)
        parallelism.append(f"--parallelism.expert_parallel_degree {layout.ep}")
        if layout.ep_comm in HIERARCHICAL:
            notes.append(f"torchtitan 0.3 takes its token dispatcher from the recipe's config function: call it with "
                         f"moe_comm_backend=\"{layout.ep_comm}\" (torchtitan/models/common/config_utils.py, "
                         "make_token_dispatcher_config; the default, \"standard\", is an all-to-all); DeepEP must "
                         "be installed")
        if (note := ep_overlap_note(run, "torchtitan 0.3")) is not None:
            notes.append(note)
    if layout.tp > 1 and not layout.sp:
        parallelism.append("--parallelism.no-enable-sequence-parallel")
    parallelism += _data_parallel_settings(run, notes)
    if run.compile or layout.tp_overlap:  # its apply_compile: each block (torchtitan/distributed/compile.py)
        # the blocks alone, as planned (its default compiles the loss too, which the plan counts eager)
        parallelism += ["--compile.enable", "--compile.components model"]
    if layout.tp_overlap:  # inductor's micro-pipelined TP (torchtitan/distributed/compile.py)
        parallelism.append("--compile.enable_async_tensor_parallel")
        if not run.compile:
            notes.append("async tensor parallelism runs under torch.compile (--compile.enable), whose blocks save "
                         "other tensors than the eager ones planned: plan with --compile on for what they keep")
    if layout.pp > 1:
        parallelism += [f"--parallelism.pipeline_parallel_schedule {SCHEDULES[layout.schedule]}",
                        f"--parallelism.pipeline_parallel_microbatch_size {run.micro_batch}", *_stages(run)]
    checkpoint = _checkpointing(run, notes)
    if run.fp8 != "off":
        notes.append(_float8_note(run, module, recipe))
    _other_notes(run, notes)
    command = [f"{launch} -m torchtitan.train", f"--module {module} --config {recipe}", *training, *parallelism,
               checkpoint]
    lines = [line + " \\" for line in command[:-1]] + [command[-1]]
    lines[1:] = [f"  {line}" for line in lines[1:]]
    header = (f"torchtitan 0.3: recipe {module}.{recipe} with its fields overridden; {ranks(layout.world)}",)
    return commented("torchtitan", lines, notes, run, header)
