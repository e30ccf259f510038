"""torchtitan job config (TOML), as torchtitan v0.2.x reads it (``--job.config_file``).

Names checked against torchtitan v0.2.2's ``torchtitan/config/job_config.py``
(the last release that reads TOML; pytorch/torchtitan#2386, Feb 2026, moved
the configuration to Python ``Trainer.Config`` functions with token-counted
batches), its ``distributed/parallel_dims.py``, ``pipeline_parallel.py`` and
``activation_checkpoint.py``:

- ``[parallelism]``: ``data_parallel_replicate_degree`` (DDP/HSDP replicas),
  ``data_parallel_shard_degree`` (FSDP), ``tensor_parallel_degree`` (sequence
  parallelism always on with it), ``pipeline_parallel_degree``,
  ``pipeline_parallel_schedule`` (``1F1B``, ``Interleaved1F1B``, ``GPipe``),
  ``pipeline_parallel_microbatch_size``, ``pipeline_parallel_layers_per_stage``,
  ``context_parallel_degree``. FSDP spans ``dp_shard x cp`` ranks; replication
  without FSDP (DDP) runs only when data parallelism is the sole axis.
- ``[training]``: ``local_batch_size`` (per data-parallel rank; under pipeline
  parallelism it is split into ``local_batch_size / pipeline_parallel_microbatch_size``
  pipeline micro-batches), ``global_batch_size`` (gradient accumulation is
  ``global / (local x dp)``), ``seq_len``, ``mixed_precision_param`` (FSDP's
  param dtype, or autocast under DDP), ``dtype`` (``bfloat16`` puts parameters,
  gradients and optimizer state all in bf16).
- ``[activation_checkpoint]``: ``mode`` ``none``/``full``/``selective``;
  ``selective_ac_option = "op"`` is per-op SAC (saves compute-heavy op outputs
  but recomputes every second matmul); an integer K checkpoints one block in
  every K and keeps the others' activations, which is not headroom's every-K
  (segments of K blocks).
- ``[optimizer] name``: ``Adam`` or ``AdamW`` only.
"""

from __future__ import annotations

from core.exports.run import Export, Run, commented, offload_note, ranks, stack_note

SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe"}
"""headroom's pipeline schedule -> torch.distributed.pipelining's schedule name."""

OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW"}


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
        return ['mixed_precision_param = "float32"']
    if run.precision == "bf16-pure":
        notes.append('torchtitan\'s dtype = "bfloat16" keeps the optimizer state in bf16 too (Adam: 4 bytes a '
                     "parameter instead of the planned 8)")
        return ['dtype = "bfloat16"']
    if run.precision in ("bf16-master", "bf16-fp32grad"):
        notes.append(f"torchtitan has no {run.precision} recipe (bf16 parameters with an fp32 master copy); set: "
                     "mixed precision over fp32 parameters and gradients (amp-bf16: "
                     + ("the same" if run.precision == "bf16-master" else "2 bytes a parameter fewer")
                     + " static bytes with Adam, plus the bf16 weight copies of each unit's forward)")
    return ['mixed_precision_param = "bfloat16"']


def _checkpointing(run: Run, notes: list[str]) -> list[str]:
    policy = run.policy
    if policy.kind == "none":
        return ['mode = "none"']
    if policy.kind == "full":
        return ['mode = "full"']
    if policy.kind == "every":
        notes.append(f"torchtitan has no every-{policy.every} segments (its selective_ac_option = {policy.every} "
                     f"checkpoints one block in every {policy.every} and keeps the rest); set: full, the same "
                     f"recompute but every block's input kept, more memory than planned: check with headroom "
                     f"estimate --recompute full")
        return ['mode = "full"']
    if policy.kind == "op-selective":
        notes.append("torchtitan's op-level SAC also recomputes every second matmul: less memory and more "
                     "recompute than the planned op-selective, which keeps every matmul output")
        return ['mode = "selective"', 'selective_ac_option = "op"']
    if policy.kind == "selective":
        notes.append("torchtitan cannot recompute the attention core alone; its fused SDPA attention keeps no "
                     "s x s tensor, which is all that selective recompute removes, so none is set")
        return ['mode = "none"']
    notes.append(offload_note("torchtitan"))
    return ['mode = "none"']


def _layout_notes(run: Run, notes: list[str]) -> None:
    layout = run.layout
    if layout.tp > 1 and not layout.sp:
        notes.append("torchtitan v0.2.x always runs sequence parallelism with tensor parallelism: less activation "
                     "memory than planned without it (current torchtitan: parallelism.enable_sequence_parallel)")
    if layout.cp > 1:
        notes.append(f"torchtitan's FSDP spans the dp x cp ranks: parameters, gradients and optimizer state are "
                     f"sharded over the {layout.cp} context-parallel ranks too, less memory than planned")
    if (note := stack_note(run, "torchtitan", "torch")) is not None:
        notes.append(note)
    if run.attention == "standard" and run.policy.kind != "selective":  # else the checkpointing note says it
        notes.append("torchtitan runs fused SDPA attention, which keeps no s x s tensor: less memory than planned "
                     "with --attention standard")
    if run.dropout > 0:
        notes.append("torchtitan's models have no dropout")


def torchtitan(run: Run) -> Export:
    layout = run.layout
    notes: list[str] = []
    replicate, shard = _data_parallel(run, notes)
    training = [
        "[training]",
        # Under pipeline parallelism one optimizer step is one pipeline flush of every micro-batch.
        f"local_batch_size = {run.per_rank_batch if layout.pp > 1 else run.micro_batch}",
        f"global_batch_size = {run.global_batch}",
        f"seq_len = {run.seq_len}",
        *_precision(run, notes),
    ]
    parallelism = [
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f"tensor_parallel_degree = {layout.tp}",
        "enable_async_tensor_parallel = false",
        f"pipeline_parallel_degree = {layout.pp}",
        f"context_parallel_degree = {layout.cp}",
    ]
    if layout.pp > 1:
        # Even chunks, embeddings and head counted as no layer: headroom's split (core.pipeline).
        parallelism += [
            f'pipeline_parallel_schedule = "{SCHEDULES[layout.schedule]}"',
            f"pipeline_parallel_microbatch_size = {run.micro_batch}",
            f"pipeline_parallel_layers_per_stage = {run.layers_per_chunk}",
            "pipeline_parallel_first_stage_less_layers = 0",
            "pipeline_parallel_last_stage_less_layers = 0",
        ]
    checkpoint = ["[activation_checkpoint]", *_checkpointing(run, notes)]
    optimizer = []
    if run.optimizer in OPTIMIZERS:
        optimizer = ["", "[optimizer]", f'name = "{OPTIMIZERS[run.optimizer]}"']
    else:
        notes.append(f"torchtitan builds Adam or AdamW only, not {run.optimizer}: its default AdamW keeps 8 bytes "
                     "of state a parameter")
    _layout_notes(run, notes)
    tokens = run.micro_batch * run.seq_len
    newer = (f"torchtitan after v0.2.2 (pytorch/torchtitan#2386) takes Python Trainer.Config recipes, not TOML: "
             f"the same parallelism fields, with training.num_tokens_per_microbatch_per_dp_rank = {tokens}, "
             f"training.num_tokens_per_train_step = {run.global_batch * run.seq_len}"
             + (f", parallelism.num_pp_microbatches = {run.accumulation_steps}" if layout.pp > 1 else ""))
    header = (f"torchtitan v0.2.x job config (--job.config_file); launch {ranks(layout.world)}", newer)
    return commented("torchtitan", [*training, "", *parallelism, "", *checkpoint, *optimizer], notes, run, header)
