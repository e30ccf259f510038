"""DeepSpeed config (``ds_config.json``): strict JSON, so every caveat is a note beside it.

Keys checked against DeepSpeed's ``docs/_pages/config-json.md`` and
``deepspeed/runtime/constants.py``, ``config.py`` and ``engine.py`` (master of
2026-08-22, version 0.19.6):

- batch: ``train_batch_size`` = ``train_micro_batch_size_per_gpu`` x
  ``gradient_accumulation_steps`` x data-parallel ranks.
- ``zero_optimization.stage`` 0-3 is the ZeRO stage itself.
- precision: ``bf16.enabled`` is bf16 parameters with an fp32 master copy kept
  by the optimizer; gradients accumulate in bf16 unless
  ``data_types.grad_accum_dtype`` is ``fp32``, which DeepSpeed accepts under
  ZeRO-1 only (its ``BF16_Optimizer``). ``torch_autocast`` runs torch.autocast
  over fp32 parameters (headroom's amp-bf16; with ZeRO since v0.17.2,
  deepspeedai/DeepSpeed#6993), reducing ``torch.nn.Linear`` gradients in bf16.
- ``tensor_parallel.autotp_size`` is AutoTP: the model's linear layers split
  Megatron-style, no sequence parallelism. Pipeline parallelism is
  ``deepspeed.pipe.PipelineModule`` in model code; there is no ring-attention
  context parallelism (DeepSpeed's sequence parallelism is Ulysses).
- ``activation_checkpointing`` only tunes ``deepspeed.checkpointing.checkpoint``,
  which recomputes whatever function the model code wraps, whole; the config
  cannot switch checkpointing on, so the section is left out.
"""

from __future__ import annotations

import json
from typing import Any

from headroom.core.exports.run import (
    Export,
    Run,
    compile_note,
    ep_comm_note,
    ep_overlap_note,
    offload_note,
    tp_overlap_note,
)

WRAP = "in your model code: DeepSpeed's config cannot switch activation checkpointing on"


UNEXPRESSED = ("pp", "cp", "ep")
"""The layout axes DeepSpeed's config has no setting for (a pipeline is a PipelineModule in code, experts a
deepspeed.moe.layer.MoE in code; its sequence parallelism is Ulysses, not ring attention)."""


def _precision(run: Run, config: dict[str, Any], notes: list[str]) -> None:
    if run.precision == "fp32":
        return
    if run.precision == "amp-bf16":
        config["torch_autocast"] = {"enabled": True, "dtype": "bfloat16"}
        notes.append("torch_autocast needs DeepSpeed >= 0.17.2 under ZeRO, and reduces torch.nn.Linear gradients "
                     "in bf16 rather than fp32")
        return
    config["bf16"] = {"enabled": True}
    if run.precision == "bf16-pure":
        notes.append("DeepSpeed's bf16 keeps an fp32 master copy of the parameters (bf16-master): 4 bytes a "
                     "parameter more than the planned bf16-pure")
    elif run.precision == "bf16-fp32grad":
        if run.layout.zero == 1:
            config["data_types"] = {"grad_accum_dtype": "fp32"}
        else:
            notes.append(f"DeepSpeed accumulates fp32 gradients of bf16 parameters only under ZeRO-1; under "
                         f"ZeRO-{run.layout.zero} they stay bf16 (bf16-master), 2 bytes a parameter fewer than "
                         "planned")


def _layout(run: Run, config: dict[str, Any], notes: list[str]) -> None:
    layout = run.layout
    if layout.tp > 1:
        config["tensor_parallel"] = {"autotp_size": layout.tp}
        if (note := tp_overlap_note(run, "DeepSpeed's AutoTP")) is not None:
            notes.append(note)
        if layout.sp:
            notes.append("DeepSpeed's AutoTP splits the linear layers without sequence parallelism: norms and "
                         "dropouts run whole on every tensor-parallel rank, more activation memory than planned")
    if layout.pp > 1:
        notes.append(f"DeepSpeed's config cannot express pipeline parallelism (pp {layout.pp}, {layout.schedule}): "
                     "build the model as a deepspeed.pipe.PipelineModule in code, or DeepSpeed counts those ranks "
                     "as data-parallel")
    if run.spec.is_moe:  # DeepSpeed's MoE drops tokens at capacity factor 1.0 unless told not to
        moe = [f"ep_size={layout.ep}"] if layout.ep > 1 else []
        if (note := ep_comm_note(run, "DeepSpeed's MoE")) is not None:
            notes.append(note)
        if (note := ep_overlap_note(run, "DeepSpeed's MoE")) is not None:
            notes.append(note)
        factor = run.spec.capacity_factor
        moe += [f"capacity_factor={factor:g}", "drop_tokens=True"] if factor else ["drop_tokens=False"]
        notes.append(f"DeepSpeed sets expert parallelism and capacity in the model code, not its config: build the "
                     f"experts as deepspeed.moe.layer.MoE(..., {', '.join(moe)})"
                     + ("" if factor else "; without dropping it pads every expert to the busiest one's rows, more "
                        "than the t x k routed rows planned"))
    if layout.cp > 1:
        notes.append(f"DeepSpeed cannot express context parallelism (cp {layout.cp}, ring attention): its sequence "
                     "parallelism is Ulysses, set up in model code")


def _checkpointing(run: Run, notes: list[str]) -> None:
    policy = run.policy
    if policy.kind == "full":
        notes.append(f"wrap each block in deepspeed.checkpointing.checkpoint {WRAP}")
    elif policy.kind == "every":
        notes.append(f"wrap each run of {policy.every} consecutive blocks in one deepspeed.checkpointing.checkpoint "
                     f"call {WRAP}")
    elif policy.kind == "block":
        notes.append(f"wrap each of the first {policy.every} blocks of each pipeline stage in "
                     f"deepspeed.checkpointing.checkpoint, and none of the others {WRAP}")
    elif policy.kind == "selective":
        notes.append(f"wrap only the attention core (QK^T, softmax, dropout, PV) in "
                     f"deepspeed.checkpointing.checkpoint {WRAP}")
    elif policy.kind == "op-selective":
        notes.append("DeepSpeed's checkpointing recomputes whole blocks, with no op-level selection: use "
                     "torch.utils.checkpoint.checkpoint(block, context_fn=...) with "
                     "create_selective_checkpoint_contexts in your model code")
    elif policy.kind == "offload":
        notes.append(offload_note("DeepSpeed", " (activation_checkpointing.cpu_checkpointing moves only "
                                               "checkpointed inputs to host memory)"))


def _batch(run: Run, config: dict[str, Any], notes: list[str]) -> None:
    """DeepSpeed checks train_batch_size = micro-batch x accumulation x the ranks it counts as data-parallel
    (every rank, less those of a tensor-parallel group and of a PipelineModule's stages). Ranks of a pipeline
    built in code, or of a context-parallel group it cannot set, make that count differ from the plan's dp:
    then train_batch_size is left out and DeepSpeed infers it ("you can choose to only specify two of the three
    parameters", DeepSpeed's config-json docs) instead of refusing the config."""
    config["train_micro_batch_size_per_gpu"] = run.micro_batch
    config["gradient_accumulation_steps"] = run.accumulation_steps
    layout = run.layout
    if layout.pp == 1 and layout.cp == 1:
        config["train_batch_size"] = run.global_batch
        return
    counted = run.counted_data_parallel
    notes.append(f"train_batch_size is left out: DeepSpeed infers it as micro-batch {run.micro_batch} x "
                 f"accumulation {run.accumulation_steps} x the ranks it counts as data-parallel, the planned "
                 f"{run.global_batch:,} sequences a step only when those are dp {layout.dp} (the "
                 f"{run.axes_text(('pp', 'cp'))} groups built in model code); counting their ranks as data-parallel "
                 f"too ({counted:,}-way), it trains {run.per_rank_batch * counted:,}")


def _resharding(run: Run, config: dict[str, Any], notes: list[str]) -> None:
    """FSDP's units kept from forward to backward, as stage 3 comes nearest: a shard over k ranks is ZeRO++'s
    secondary partition (``zero_hpz_partition_size``); whole, it has no per-unit setting."""
    kept = run.data_parallel.reshard_after_forward
    if run.layout.zero != 3 or kept is True:
        return
    if kept is False:
        notes.append(f"the plan keeps FSDP's units gathered from forward to backward (FSDP's SHARD_GRAD_OP); "
                     "DeepSpeed's stage 3 has no per-unit setting: it keeps a parameter gathered between uses only "
                     "within stage3_max_reuse_distance and under stage3_max_live_parameters (1e9 parameters each by "
                     f"default), so raise both above the model's {run.spec.parameters:,} parameters, or re-plan with "
                     "--reshard-after-forward true for stage 3 as it gathers by default")
        return
    config["zero_optimization"]["zero_hpz_partition_size"] = kept
    notes.append(f"zero_hpz_partition_size {kept}: ZeRO++'s secondary partition, a shard over {kept} ranks kept from "
                 "forward for backward's gathers, as planned")


def deepspeed(run: Run) -> Export:
    config: dict[str, Any] = {}
    notes: list[str] = []
    _batch(run, config, notes)
    config["zero_optimization"] = {"stage": run.layout.zero}
    if run.layout.zero in (1, 2):  # its gradient reduction beside backward (ZeRO-1/2's default: off)
        config["zero_optimization"]["overlap_comm"] = run.data_parallel.overlap_grad_reduce
    _resharding(run, config, notes)
    _precision(run, config, notes)
    _layout(run, config, notes)
    _checkpointing(run, notes)
    if (note := compile_note(run, "DeepSpeed", "call engine.compile() on the model, or compile its blocks")) is not None:
        notes.append(note)
    return Export("deepspeed", json.dumps(config, indent=2), tuple(notes), notes_in_text=False,
                  unexpressed=run.axes_among(UNEXPRESSED))
