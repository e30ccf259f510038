"""PyTorch Lightning: a ``Trainer(...)`` snippet with its strategy (Python), caveats as comments.

Names checked against Lightning's ``src/lightning/pytorch/strategies``
(``fsdp.py``, ``model_parallel.py``, ``deepspeed.py``) and
``fabric/strategies/deepspeed.py`` (master, 2026-07):

- ``FSDPStrategy(sharding_strategy="FULL_SHARD" | "SHARD_GRAD_OP",
  activation_checkpointing_policy={Block})``: ZeRO-3, resharded after
  forward or kept gathered to backward (``reshard_after_forward`` False),
  with every ``Block`` checkpointed whole.
- ``DeepSpeedStrategy(stage=1 | 2)``: ZeRO-1 and 2; under it
  ``precision="bf16-mixed"`` becomes DeepSpeed's bf16 (bf16 parameters, fp32
  master copy), not autocast.
- ``ModelParallelStrategy(data_parallel_size, tensor_parallel_size)``: the
  LightningModule's ``configure_model`` applies the tensor-parallel plan and
  ``fully_shard``. There is no pipeline or context parallel strategy.
- ``precision``: ``32-true``, ``bf16-mixed`` (autocast over fp32 parameters),
  ``bf16-true`` (bf16 parameters; torch optimizers keep bf16 state).
"""

from __future__ import annotations

from headroom.core.divisors import divisors
from headroom.core.exports.run import (
    Export,
    Run,
    capacity_note,
    commented,
    compile_note,
    data_parallel_batch,
    offload_note,
    tp_overlap_note,
)

PRECISIONS = {"fp32": "32-true", "amp-bf16": "bf16-mixed", "bf16-pure": "bf16-true", "bf16-master": "bf16-mixed",
              "bf16-fp32grad": "bf16-mixed"}
"""headroom's precision recipe -> Lightning's precision flag (the closest; notes say where it differs)."""


UNEXPRESSED = ("pp", "cp", "ep")
"""The layout axes Lightning has no strategy for."""


def _strategy(run: Run, notes: list[str]) -> tuple[str, list[str], bool]:
    """(strategy expression, import lines, whether it checkpoints blocks itself)."""
    layout = run.layout
    checkpoint_blocks = run.policy.kind == "full"
    if layout.tp > 1:
        notes.append(f"ModelParallelStrategy leaves the tensor-parallel plan to configure_model ("
                     f"{'with' if layout.sp else 'without'} SequenceParallel on the norms, as planned), and "
                     + ("fully_shard over the data-parallel mesh (ZeRO-3) there too" if layout.zero == 3
                        else f"has no ZeRO-{layout.zero}: replicate the data-parallel mesh there"))
        if (note := tp_overlap_note(run, "Lightning's ModelParallelStrategy")) is not None:
            notes.append(note)
        dp = run.counted_data_parallel  # no pipeline or context parallelism: their ranks are data-parallel
        return (f"ModelParallelStrategy(data_parallel_size={dp}, tensor_parallel_size={layout.tp})",
                ["from lightning.pytorch.strategies import ModelParallelStrategy"], False)
    if layout.dp == 1 and layout.world == 1:
        return '"auto"', [], False
    if layout.zero == 3:
        kept = run.data_parallel.reshard_after_forward
        if not isinstance(kept, bool):
            notes.append(f"FSDPStrategy cannot keep a shard over {kept} ranks from forward to backward: "
                         "FULL_SHARD gathers again over all of them")
        sharding = "SHARD_GRAD_OP" if kept is False else "FULL_SHARD"
        policy = ", activation_checkpointing_policy={Block}" if checkpoint_blocks else ""
        return (f'FSDPStrategy(sharding_strategy="{sharding}"{policy})',
                ["from lightning.pytorch.strategies import FSDPStrategy"], checkpoint_blocks)
    if layout.zero in (1, 2):
        if run.precision in ("amp-bf16", "bf16-pure", "bf16-fp32grad"):
            notes.append(f"under DeepSpeedStrategy Lightning's {PRECISIONS[run.precision]!r} is DeepSpeed's bf16 "
                         f"(bf16 parameters, bf16 gradients, fp32 master copy), not {run.precision}")
        return (f"DeepSpeedStrategy(stage={layout.zero})", ["from lightning.pytorch.strategies import DeepSpeedStrategy"],
                False)
    return '"ddp"', [], False


def _checkpointing(run: Run, in_strategy: bool, notes: list[str]) -> None:
    policy = run.policy
    if policy.kind == "none" or in_strategy:
        return
    if policy.kind == "offload":
        notes.append(offload_note("Lightning"))
        return
    how = {"full": "wrap each block in torch.utils.checkpoint.checkpoint",
           "every": f"wrap each run of {policy.every} blocks in one torch.utils.checkpoint.checkpoint call",
           "block": f"wrap each of the first {policy.every} blocks of each pipeline stage in "
                    "torch.utils.checkpoint.checkpoint, and none of the others",
           "selective": "wrap the attention core (QK^T, softmax, dropout, PV) in torch.utils.checkpoint.checkpoint",
           "op-selective": "wrap each block in torch.utils.checkpoint.checkpoint with a context_fn from "
                           "create_selective_checkpoint_contexts that saves the matmul and attention outputs"}
    notes.append(f"Lightning's strategy here has no activation-checkpointing setting for {policy}: in the "
                 f"LightningModule, {how[policy.kind]}")


def _precision(run: Run, deepspeed: bool, notes: list[str]) -> str:
    if deepspeed:
        return PRECISIONS[run.precision]  # DeepSpeed's own reading, noted with the strategy
    if run.precision == "bf16-pure":
        notes.append('"bf16-true" keeps the optimizer state in bf16 too (Adam: 4 bytes a parameter instead of '
                     "the planned 8)")
    elif run.precision in ("bf16-master", "bf16-fp32grad"):
        notes.append(f"Lightning has no {run.precision} recipe (bf16 parameters, fp32 master copy); set: "
                     '"bf16-mixed", autocast over fp32 parameters and gradients (amp-bf16)')
    return PRECISIONS[run.precision]


def lightning(run: Run) -> Export:
    layout = run.layout
    notes: list[str] = []
    if (note := capacity_note(run, "transformers (the model a Lightning module usually wraps)")) is not None:
        notes.append(note)
    strategy, imports, in_strategy = _strategy(run, notes)
    _checkpointing(run, in_strategy, notes)
    precision = _precision(run, strategy.startswith("DeepSpeedStrategy"), notes)
    micro, accumulation = data_parallel_batch(run, "Lightning", notes)
    if (note := compile_note(run, "Lightning", "compile each block in configure_model")) is not None:
        notes.append(note)
    if run.axes_among(UNEXPRESSED):
        notes.append(f"Lightning has no pipeline, context or expert parallel strategy: {run.axes_text(UNEXPRESSED)} "
                     "cannot be expressed")
    devices = max(d for d in divisors(layout.world) if d <= run.gpus_per_node)  # Lightning's devices are per node
    nodes = layout.world // devices
    lines = [
        "import lightning as L",
        *imports,
        "from torch.utils.data import DataLoader",
        "",
        *(["# Block: your model's transformer block class"] if "{Block}" in strategy else []),
        f"loader = DataLoader(dataset, batch_size={micro})",
        "trainer = L.Trainer(",
        f"    devices={devices},",
        f"    num_nodes={nodes},",
        f"    strategy={strategy},",
        f'    precision="{precision}",',
        f"    accumulate_grad_batches={accumulation},",
        ")",
    ]
    return commented("lightning", lines, notes, run, unexpressed=run.axes_among(UNEXPRESSED))
