"""A recommendation as settings to paste into a training framework.

Each exporter returns text in the framework's own format. Where a framework
cannot express the recommended checkpoint policy exactly, the snippet says so
in a comment and gives the closest setting it has, never a silent substitute.

- HuggingFace ``TrainingArguments`` (Python): ``gradient_checkpointing``
  checkpoints every block (our ``full``).
- torchtitan (TOML): ``[activation_checkpoint] mode`` is ``none``, ``full`` or
  ``selective`` with ``selective_ac_option = "op"`` (our ``op-selective``).
- DeepSpeed (JSON config): batch sizes, ZeRO stage, bf16; activation
  checkpointing itself is switched on in the model code
  (``deepspeed.checkpointing``), which the config only tunes.
- PyTorch Lightning (Python): ``Trainer(accumulate_grad_batches=...)`` and the
  DataLoader's ``batch_size``.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from core.errors import ConfigError
from core.planner import Candidate, PlanRequest


def _policy_note(policy: str, supported: tuple[str, ...], framework: str) -> str | None:
    if policy in supported:
        return None
    return f"{framework} has no '{policy}' checkpointing; apply it in your model code (see headroom's agent/recompute.py)"


HF_OPTIMIZERS = {"adam": "adamw_torch_fused", "adamw": "adamw_torch_fused", "sgd": "sgd", "sgd-momentum": "sgd", "adagrad": "adagrad"}


def huggingface(request: PlanRequest, best: Candidate) -> str:
    cfg = best.config
    policy = str(cfg.recompute)
    note = _policy_note(policy, ("none", "full"), "the HF Trainer")
    lines = [
        "from transformers import TrainingArguments",
        "",
        "args = TrainingArguments(",
        "    output_dir=\"out\",",
        f"    per_device_train_batch_size={cfg.micro_batch},",
        f"    gradient_accumulation_steps={best.accumulation_steps},",
        f"    gradient_checkpointing={policy != 'none'},",
        "    gradient_checkpointing_kwargs={\"use_reentrant\": False},",
        f"    bf16={cfg.precision != 'fp32'},",
        f"    optim=\"{HF_OPTIMIZERS[cfg.optimizer]}\",",
        ")",
        f"# {request.dp} data-parallel ranks x {cfg.micro_batch} x {best.accumulation_steps} = "
        f"{request.global_batch} sequences of {cfg.seq_len} tokens per step",
    ]
    if request.zero:
        lines.append(f"# ZeRO stage {request.zero}: pass a DeepSpeed config (--export deepspeed) or an FSDP config")
    if note:
        lines.append(f"# {note}")
    return "\n".join(lines)


def torchtitan(request: PlanRequest, best: Candidate) -> str:
    cfg = best.config
    policy = str(cfg.recompute)
    mode, option = {"none": ("none", None), "full": ("full", None), "op-selective": ("selective", "op")}.get(
        policy, ("full", None)
    )
    lines = [
        "[training]",
        f"local_batch_size = {cfg.micro_batch}",
        f"global_batch_size = {request.global_batch}",
        f"seq_len = {cfg.seq_len}",
        f"mixed_precision_param = \"{'float32' if cfg.precision == 'fp32' else 'bfloat16'}\"",
        "",
        "[parallelism]",
        f"data_parallel_shard_degree = {request.dp if request.zero else 1}",
        f"data_parallel_replicate_degree = {1 if request.zero else request.dp}",
        "",
        "[activation_checkpoint]",
        f"mode = \"{mode}\"",
    ]
    if option:
        lines.append(f"selective_ac_option = \"{option}\"")
    note = _policy_note(policy, ("none", "full", "op-selective"), "torchtitan")
    if note:
        lines.append(f"# {note}; 'full' shown is the closest setting")
    return "\n".join(lines)


def deepspeed(request: PlanRequest, best: Candidate) -> str:
    cfg = best.config
    policy = str(cfg.recompute)
    config = {
        "train_batch_size": request.global_batch,
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": best.accumulation_steps,
        "bf16": {"enabled": cfg.precision != "fp32"},
        "zero_optimization": {"stage": request.zero},
        "activation_checkpointing": {
            "partition_activations": False,
            "cpu_checkpointing": policy == "offload",
            "contiguous_memory_optimization": False,
        },
    }
    text = json.dumps(config, indent=2)
    if policy != "none":
        text += f"\n// headroom: wrap blocks with deepspeed.checkpointing.checkpoint for '{policy}'"
    return text


def lightning(request: PlanRequest, best: Candidate) -> str:
    cfg = best.config
    precision = {"fp32": "32-true", "amp-bf16": "bf16-mixed"}.get(cfg.precision, "bf16-true")
    strategy = {0: "ddp", 1: "deepspeed_stage_1", 2: "deepspeed_stage_2", 3: "fsdp"}[request.zero]
    lines = [
        "import lightning as L",
        "from torch.utils.data import DataLoader",
        "",
        f"loader = DataLoader(dataset, batch_size={cfg.micro_batch})",
        "trainer = L.Trainer(",
        f"    devices={request.dp},",
        f"    strategy=\"{strategy if request.dp > 1 else 'auto'}\",",
        f"    precision=\"{precision}\",",
        f"    accumulate_grad_batches={best.accumulation_steps},",
        ")",
    ]
    if str(cfg.recompute) != "none":
        lines.append(f"# activation checkpointing '{cfg.recompute}': apply it in the LightningModule")
    return "\n".join(lines)


EXPORTERS: dict[str, Callable[[PlanRequest, Candidate], str]] = {
    "hf": huggingface,
    "torchtitan": torchtitan,
    "deepspeed": deepspeed,
    "lightning": lightning,
}


def export(fmt: str, request: PlanRequest, best: Candidate) -> str:
    try:
        return EXPORTERS[fmt](request, best)
    except KeyError:
        raise ConfigError(f"unknown export format {fmt!r}; valid: {', '.join(EXPORTERS)}") from None
