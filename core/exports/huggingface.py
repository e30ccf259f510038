"""HuggingFace Trainer: a ``TrainingArguments(...)`` snippet (Python), caveats as comments.

Names checked against transformers' ``training_args.py``, ``trainer_utils.py``
(``FSDPOption``) and ``trainer.py`` (main, 2026):

- ``per_device_train_batch_size`` x ``gradient_accumulation_steps`` x devices
  is the global batch.
- ``bf16=True`` is torch.autocast over the model's own parameter dtype.
- ``gradient_checkpointing`` checkpoints every decoder layer, whole;
  ``gradient_checkpointing_kwargs`` go to ``torch.utils.checkpoint.checkpoint``
  (``functools.partial(checkpoint, **kwargs)``), so a ``context_fn`` from
  ``create_selective_checkpoint_contexts`` gives op-level selection. Under FSDP
  the Trainer wants ``fsdp_config={"activation_checkpointing": True}`` instead
  and refuses both at once.
- ``fsdp="full_shard auto_wrap"`` is ZeRO-3, ``"shard_grad_op auto_wrap"``
  ZeRO-3 kept gathered from forward to backward (``--reshard-after-forward
  false``); ZeRO-1 and 2 go through ``deepspeed="ds_config.json"``, as the
  hf stack plans them (DeepSpeed's: headroom.core.specs.stack.Stack.deepspeed_zero).
- ``optim="sgd"`` is ``torch.optim.SGD`` without momentum; ``adamw_torch_fused``
  with the default ``weight_decay=0`` is Adam.
- ``use_liger_kernel=True`` (the ``hf-liger`` stack) has the Trainer patch the
  model with Liger's kernels (``_apply_liger_kernel_to_instance``).
- Tensor parallelism is transformers' own, set when the model loads
  (``from_pretrained(..., distributed_config=DistributedConfig(tp_size=T))``,
  transformers 5.25), without sequence parallelism; context parallelism is
  accelerate's ``ParallelismConfig`` (``TrainingArguments(parallelism_config=...)``,
  accelerate >= 1.10.1). Neither is written here; the Trainer has no
  pipeline parallelism.
"""

from __future__ import annotations

from headroom.core.exports.run import (
    Export,
    Run,
    capacity_note,
    commented,
    compile_note,
    data_parallel_batch,
    offload_note,
    overlap_note,
    ranks,
    stack_note,
    tp_overlap_note,
)
from headroom.core.specs.config import hf_stack_covers

OPTIMIZERS = {"adam": "adamw_torch_fused", "adamw": "adamw_torch_fused", "sgd": "sgd", "sgd-momentum": "sgd",
              "adagrad": "adagrad"}
"""headroom's optimizer -> TrainingArguments.optim."""

FSDP = {True: "full_shard auto_wrap", False: "shard_grad_op auto_wrap"}
"""The Trainer's ``fsdp`` for ZeRO-3, by whether the units are resharded after forward."""

OP_SELECTIVE = [
    "from functools import partial",
    "",
    "import torch",
    "from torch.utils.checkpoint import create_selective_checkpoint_contexts",
    "",
    "# op-selective: keep matmul and attention outputs, recompute the elementwise ops between them",
    "aten = torch.ops.aten",
    "SAVED = [aten.mm.default, aten.addmm.default, aten.bmm.default, aten._scaled_dot_product_flash_attention.default,",
    "         aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_cudnn_attention.default]",
    "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={",
    '    "use_reentrant": False, "context_fn": partial(create_selective_checkpoint_contexts, SAVED)})',
    "",
]


def _checkpointing(run: Run, notes: list[str]) -> tuple[bool, list[str]]:
    """(whole-layer checkpointing on, lines before TrainingArguments)."""
    policy = run.policy
    if policy.kind == "full":
        return True, []
    if policy.kind == "every":
        notes.append(f"the HF Trainer checkpoints every layer, with no every-{policy.every} segments; set: "
                     "gradient checkpointing (full), the same recompute but every layer's input kept, more memory "
                     "than planned: check with headroom estimate --recompute full")
        return True, []
    if policy.kind == "block":
        notes.append(f"the HF Trainer checkpoints every layer or none, not the first {policy.every}; set: gradient "
                     "checkpointing (full), which recomputes every layer: less memory and more recompute than "
                     "planned: check with headroom estimate --recompute full")
        return True, []
    if policy.kind == "op-selective":
        notes.append("gradient_checkpointing=True would recompute whole layers (full); op-selective is set on the "
                     "model instead, through gradient_checkpointing_kwargs' context_fn")
        return False, OP_SELECTIVE
    if policy.kind == "selective":
        notes.append("the HF Trainer cannot recompute the attention core alone; load the model with "
                     'attn_implementation="sdpa" (or "flash_attention_2"), which keeps no s x s tensor: what '
                     "selective recompute removes, without recompute")
    elif policy.kind == "offload":
        notes.append(offload_note("the HF Trainer"))
    return False, []


def _attention(run: Run, notes: list[str]) -> None:
    """The attention implementation to load the model with, where it is not transformers' default (sdpa)."""
    if run.attention == "standard":
        notes.append('load the model with attn_implementation="eager": the plan counts transformers\' eager '
                     "attention (--attention standard), which keeps the s x s scores")
    elif run.spec.attention_softcap:
        notes.append(f'load the model with attn_implementation="flash_attention_2" (pip install flash-attn): SDPA '
                     f"cannot soft-cap {run.model}'s attention scores, so transformers refuses sdpa for it and "
                     "would run its eager attention, whose s x s scores the plan (--attention flash) does not count")


def _precision(run: Run, notes: list[str]) -> bool:
    if run.precision == "fp32":
        return False
    if run.precision == "bf16-pure":
        notes.append("bf16-pure: load the model with torch_dtype=torch.bfloat16; torch optimizers then keep their "
                     "state in bf16 too (Adam: 4 bytes a parameter instead of the planned 8)")
    elif run.precision in ("bf16-master", "bf16-fp32grad"):
        notes.append(f"the HF Trainer has no {run.precision} recipe (bf16 parameters, fp32 master copy); bf16=True "
                     "over an fp32 model is amp-bf16: fp32 parameters and gradients, bf16 weight copies in forward")
    return True


UNEXPRESSED = ("tp", "pp", "cp", "ep")
"""The layout axes TrainingArguments has no setting for."""


def _layout(run: Run, notes: list[str]) -> None:
    layout = run.layout
    if run.axes_among(UNEXPRESSED):
        notes.append(f"TrainingArguments cannot express {run.axes_text(UNEXPRESSED)}: tensor parallelism is set when the model "
                     "loads (from_pretrained(..., distributed_config=DistributedConfig(tp_size=...)), transformers "
                     "5) and context parallelism by accelerate's ParallelismConfig(cp_size=...) (parallelism_config=, "
                     "accelerate >= 1.10.1), not written here; the HF Trainer has no pipeline parallelism or expert "
                     "parallelism")
    # ZeRO-1 and 2 go through DeepSpeed (ds_config's overlap_comm), not the Trainer's DDP
    ddp = overlap_note(run, "The HF Trainer's DDP") if layout.zero not in (1, 2) else None
    for note in (tp_overlap_note(run, "transformers"), ddp):
        if note is not None:
            notes.append(note)
    if layout.cp > 1 and run.cp_comm == "ring":
        notes.append("for the planned ring exchange of keys and values give accelerate's ParallelismConfig "
                     "cp_handler=TorchContextParallelConfig(cp_comm_strategy='alltoall'); its default is 'allgather'")
    if layout.sp:
        notes.append("transformers' tensor parallelism has no sequence parallelism: every rank keeps the norms' and "
                     "residual stream's whole sequence, more than the plan's sp counts; plan with --stack hf for "
                     "what it keeps")
    if layout.zero in (1, 2) and layout.dp > 1:
        notes.append(f"ZeRO-{layout.zero} runs through DeepSpeed: write ds_config.json with headroom plan ... "
                     f"--stack {run.stack} --export deepspeed (the same plan; it decides the precision)")


def huggingface(run: Run) -> Export:
    layout = run.layout
    notes: list[str] = []
    if (note := capacity_note(run, "transformers")) is not None:
        notes.append(note)
    liger = run.stack == "hf-liger"
    stack = run.stack if liger else "hf"
    if hf_stack_covers(run.spec, stack) and (note := stack_note(run, "transformers", stack)):
        notes.append(note)
    if (note := compile_note(run, "HF Trainer", "its torch_compile=True compiles the whole model")) is not None:
        notes.append(note)
    if liger:
        notes.append("use_liger_kernel=True patches the model with Liger's Triton kernels when the Trainer is built: "
                     "pip install liger-kernel, on a CUDA GPU")
    whole_layers, before = _checkpointing(run, notes)
    _attention(run, notes)
    bf16 = _precision(run, notes)
    fsdp = FSDP[run.data_parallel.reshard_after_forward is not False] if layout.dp > 1 and layout.zero == 3 else None
    micro, accumulation = data_parallel_batch(run, "The HF Trainer", notes)
    counted = run.counted_data_parallel
    args = [
        '    output_dir="out",',
        f"    per_device_train_batch_size={micro},",
        f"    gradient_accumulation_steps={accumulation},",
        f"    gradient_checkpointing={whole_layers and fsdp is None},",
        '    gradient_checkpointing_kwargs={"use_reentrant": False},',
        f"    bf16={bf16},",
        f'    optim="{OPTIMIZERS[run.optimizer]}",',
    ]
    if liger:
        args.append("    use_liger_kernel=True,")
    if fsdp is not None:
        args.append(f'    fsdp="{fsdp}",')
        if whole_layers:
            args.append('    fsdp_config={"activation_checkpointing": True},')
    elif layout.zero in (1, 2) and layout.dp > 1:
        args.append('    deepspeed="ds_config.json",')
    if run.optimizer == "sgd-momentum":
        notes.append('optim="sgd" is torch.optim.SGD without momentum (0 bytes of state, not the planned 4): pass '
                     "an SGD(momentum=0.9) through Trainer(optimizers=...)")
    _layout(run, notes)
    lines = [*before, "from transformers import TrainingArguments", "", "args = TrainingArguments(", *args, ")",
             (f"# {ranks(counted)} (data-parallel) x {micro} x {accumulation} = "
              f"{counted * micro * accumulation} sequences of {run.seq_len} tokens per step")]
    return commented("hf", lines, notes, run, unexpressed=run.axes_among(UNEXPRESSED))
